package rdma

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/internal/errs"
)

func params(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseOptions(t *testing.T) {
	o, err := ParseOptions(params(nil), env(nil))
	if err != nil || !reflect.DeepEqual(o, DefaultOptions()) || o.Slice != 64<<10 {
		t.Fatalf("defaults = %+v, %v", o, err)
	}
	o, err = ParseOptions(params(map[string]string{
		"rdma.devices": "mlx5_0, mlx5_1", "rdma.slice": "256KiB", "rdma.qps": "4", "rdma.depth": "64",
		"rdma.retries": "0", "rdma.gid_index": "3", "rdma.parallel_reg_min": "1M", "rdma.library": "/opt/libibverbs.so.1",
		"rdma.error_limit": "5", "rdma.error_window": "1s", "rdma.cooldown": "200ms", "rdma.cooldown_max": "100ms",
		"rdma.stall_timeout": "50ms", "rdma.mr_cache": "on", "limits.peer_idle_timeout": "90s",
		"rdma.poll": "Busy", "rdma.harvest": "20us",
	}), env(map[string]string{"TE_RDMA_DEVICES": "ignored", "MC_TE_FILTERS": "ignored"}))
	if err != nil {
		t.Fatal(err)
	}
	// A maximum below the cooldown is raised to it.
	want := Options{Devices: []string{"mlx5_0", "mlx5_1"}, Library: "/opt/libibverbs.so.1", Slice: 256 << 10, QPs: 4,
		Depth: 64, Retries: 0, GIDIndex: 3, ParallelRegMin: 1 << 20,
		ErrorLimit: 5, ErrorWindow: time.Second, Cooldown: 200 * time.Millisecond, CooldownMax: 200 * time.Millisecond,
		StallTimeout: 50 * time.Millisecond, PeerIdle: 90 * time.Second, MRCache: true, Poll: PollBusy, Harvest: 20 * time.Microsecond}
	if !reflect.DeepEqual(o, want) {
		t.Fatalf("got %+v\nwant %+v", o, want)
	}
	// 0 turns the stall watchdog off.
	if o, err := ParseOptions(params(map[string]string{"rdma.stall_timeout": "0"}), env(nil)); err != nil || o.StallTimeout != 0 {
		t.Fatalf("rdma.stall_timeout=0: %v, %v", o.StallTimeout, err)
	}
	// 0 keeps idle endpoints; a negative timeout is refused.
	if o, err := ParseOptions(params(map[string]string{"limits.peer_idle_timeout": "0s"}), env(nil)); err != nil || o.PeerIdle != 0 {
		t.Fatalf("limits.peer_idle_timeout=0s: %v, %v", o.PeerIdle, err)
	}
	if _, err := ParseOptions(params(map[string]string{"limits.peer_idle_timeout": "-1s"}), env(nil)); err == nil {
		t.Fatal("limits.peer_idle_timeout=-1s accepted")
	}
}

// The allow-list comes from the parameter, else TE_RDMA_DEVICES, else
// Mooncake's MC_TE_FILTERS.
func TestAllowListSources(t *testing.T) {
	for _, c := range []struct {
		p, e map[string]string
		want []string
	}{
		{nil, map[string]string{"MC_TE_FILTERS": "mlx5_2,mlx5_3"}, []string{"mlx5_2", "mlx5_3"}},
		{nil, map[string]string{"TE_RDMA_DEVICES": "rxe0", "MC_TE_FILTERS": "mlx5_2"}, []string{"rxe0"}},
		{map[string]string{"rdma.devices": "mlx5_9"}, map[string]string{"TE_RDMA_DEVICES": "rxe0"}, []string{"mlx5_9"}},
		{map[string]string{"rdma.devices": ""}, map[string]string{"TE_RDMA_DEVICES": "rxe0"}, nil},
	} {
		o, err := ParseOptions(params(c.p), env(c.e))
		if err != nil || !reflect.DeepEqual(o.Devices, c.want) {
			t.Errorf("params %v env %v: devices %q, %v; want %q", c.p, c.e, o.Devices, err, c.want)
		}
	}
}

func TestParseOptionsInvalid(t *testing.T) {
	for k, v := range map[string]string{
		"rdma.slice": "1K", "rdma.qps": "0", "rdma.depth": "x", "rdma.retries": "-1",
		"rdma.gid_index": "-2", "rdma.parallel_reg_min": "0", "rdma.error_limit": "0", "rdma.cooldown": "30",
		"rdma.error_window": "-1s", "rdma.cooldown_max": "48h", "rdma.stall_timeout": "-5ms",
		"rdma.mr_cache": "sometimes", "rdma.poll": "spin", "rdma.harvest": "2s",
	} {
		_, err := ParseOptions(params(map[string]string{k: v}), env(nil))
		if !errors.Is(err, errs.ErrInvalidArgument) || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%q: %v, want an invalid-argument error naming the parameter", k, v, err)
		}
	}
}

func TestFilterDevices(t *testing.T) {
	found := []string{"mlx5_0", "mlx5_1", "mlx5_2"}
	got, err := FilterDevices(found, nil)
	if err != nil || !reflect.DeepEqual(got, found) {
		t.Fatalf("no allow-list: %v, %v", got, err)
	}
	// Order is the devices', not the list's: keys are published in it.
	got, err = FilterDevices(found, []string{"mlx5_2", "mlx5_0"})
	if err != nil || !reflect.DeepEqual(got, []string{"mlx5_0", "mlx5_2"}) {
		t.Fatalf("allow-list: %v, %v", got, err)
	}
	_, err = FilterDevices(found, []string{"mlx5_7"})
	if !errors.Is(err, errs.ErrNotSupported) || !strings.Contains(err.Error(), "mlx5_7") || !strings.Contains(err.Error(), "mlx5_1") {
		t.Fatalf("unknown device: %v", err)
	}
}
