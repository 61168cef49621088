package topo_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/topo"
	"github.com/tecache/te/internal/sys/topo/topotest"
)

func discover(t *testing.T, tree string, gpus []string, allow ...string) *topo.Machine {
	t.Helper()
	m, err := topo.Discover(topo.Options{Root: topotest.Tree(t, tree), GPUs: gpus, Allow: allow})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// On the HGX tree every GPU prefers the one NIC behind its switch; every
// other NIC is secondary. Each socket prefers its four NICs.
func TestHGX8(t *testing.T) {
	m := discover(t, "hgx8", topotest.BusIDs)
	if len(m.NICs) != 8 || len(m.GPUs) != 8 || !reflect.DeepEqual(m.Nodes, []int{0, 1}) {
		t.Fatalf("machine %+v", m)
	}
	for k, want := range topotest.NearNIC {
		got := m.Near("cuda:" + string(rune('0'+k)))
		if !reflect.DeepEqual(got.Preferred, []string{want}) || len(got.Others) != 7 {
			t.Errorf("cuda:%d = %+v, want [%s] then the 7 others", k, got, want)
		}
	}
	g := m.GPUs[3]
	if g.BusID != "0000:73:00.0" || g.Complex != "pci0000:70" || g.NUMA != 0 ||
		!reflect.DeepEqual(g.Bridges, []string{"0000:70:01.0", "0000:71:00.0", "0000:72:00.0"}) {
		t.Errorf("GPU 3 placed at %+v", g)
	}
	if n := m.NICs[0]; n.Name != "mlx5_0" || n.BusID != "0000:34:00.0" || n.NUMA != 0 {
		t.Errorf("mlx5_0 placed at %+v", n)
	}
	want := topo.Tiers{Preferred: []string{"mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"}, Others: []string{"mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7"}}
	if got := m.Near("cpu:0"); !reflect.DeepEqual(got, want) {
		t.Errorf("cpu:0 = %+v", got)
	}
	if got := m.Near("cpu:1"); !reflect.DeepEqual(got.Preferred, want.Others) {
		t.Errorf("cpu:1 = %+v", got)
	}
	// A location te cannot place prefers everything.
	for _, loc := range []string{"cpu", "cuda:8", "npu:0", "cuda:-1"} {
		if got := m.Near(loc); len(got.Preferred) != 8 || len(got.Others) != 0 {
			t.Errorf("%s = %+v", loc, got)
		}
	}
}

// Both NICs on socket 0: socket 1's GPUs and memory have no preferred NIC,
// only secondary ones; socket 0's GPUs prefer both (same node, no switch).
func TestNICsOnOneSocket(t *testing.T) {
	m := discover(t, "nic1socket", []string{"0000:21:00.0", "0000:61:00.0", "0000:a1:00.0", "0000:e1:00.0"})
	both := []string{"mlx5_0", "mlx5_1"}
	for loc, want := range map[string]topo.Tiers{
		"cuda:0": {Preferred: both, Others: []string{}},
		"cuda:1": {Preferred: both, Others: []string{}},
		"cuda:2": {Preferred: []string{}, Others: both},
		"cuda:3": {Preferred: []string{}, Others: both},
		"cpu:0":  {Preferred: both, Others: []string{}},
		"cpu:1":  {Preferred: []string{}, Others: both},
	} {
		if got := m.Near(loc); !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %+v, want %+v", loc, got, want)
		}
	}
}

// One socket, NUMA unknown: the GPU prefers the NIC under its root complex,
// memory prefers it too.
func TestBox1(t *testing.T) {
	m := discover(t, "box1", []string{"0000:01:00.0"})
	for _, loc := range []string{"cuda:0", "cpu:0"} {
		if got := m.Near(loc); !reflect.DeepEqual(got.Preferred, []string{"mlx5_0"}) {
			t.Errorf("%s = %+v", loc, got)
		}
	}
	if m.GPUs[0].NUMA != -1 || m.NICs[0].NUMA != -1 {
		t.Errorf("numa %+v", m)
	}
}

// The matrix is Mooncake's JSON, filtered by the allow-list; a GPU whose
// address is unknown prefers every NIC.
func TestMatrixJSON(t *testing.T) {
	m := discover(t, "hgx8", []string{topotest.BusIDs[0], ""}, "mlx5_0", "mlx5_1", "mlx5_4")
	b, err := m.Matrix().JSON()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"cpu:0":[["mlx5_0","mlx5_1"],["mlx5_4"]],"cpu:1":[["mlx5_4"],["mlx5_0","mlx5_1"]],` +
		`"cuda:0":[["mlx5_1"],["mlx5_0","mlx5_4"]],"cuda:1":[["mlx5_0","mlx5_1","mlx5_4"],[]]}`
	if string(b) != want {
		t.Fatalf("matrix\n%s\nwant\n%s", b, want)
	}
	var back map[string][2][]string
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
}

// A machine without NICs or NUMA nodes still has cpu:0, with empty tiers.
func TestEmptyTree(t *testing.T) {
	m, err := topo.Discover(topo.Options{Root: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Matrix(); !reflect.DeepEqual(got, topo.Matrix{"cpu:0": {{}, {}}}) {
		t.Fatalf("matrix %v", got)
	}
	if _, err := topo.Discover(topo.Options{Root: filepath.Join(t.TempDir(), "nope")}); !errors.Is(err, errs.ErrNotFound) {
		t.Fatalf("missing root: %v", err)
	}
	// A NIC without a PCI function (Soft-RoCE) is described without one.
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "devices", "virtual", "net", "eth0"), 0o755)
	os.MkdirAll(filepath.Join(root, "class", "infiniband", "rxe0"), 0o755)
	os.Symlink("../../../devices/virtual/net/eth0", filepath.Join(root, "class", "infiniband", "rxe0", "device"))
	m, err = topo.Discover(topo.Options{Root: root})
	if err != nil || len(m.NICs) != 1 || m.NICs[0].BusID != "" || m.NICs[0].NUMA != -1 {
		t.Fatalf("rxe0: %+v %v", m, err)
	}
}

// Record of a materialized tree reads back as the same machine.
func TestRecordRoundTrip(t *testing.T) {
	for _, name := range topotest.Trees {
		root := topotest.Tree(t, name)
		var buf bytes.Buffer
		if err := topo.Record(root, &buf); err != nil {
			t.Fatal(err)
		}
		again := filepath.Join(t.TempDir(), "again")
		if err := topo.Materialize(&buf, again); err != nil {
			t.Fatal(err)
		}
		gpus := map[string][]string{"hgx8": topotest.BusIDs, "nic1socket": {"0000:21:00.0", "0000:a1:00.0"}, "box1": {"0000:01:00.0"}}[name]
		a, _ := topo.Discover(topo.Options{Root: root, GPUs: gpus})
		b, _ := topo.Discover(topo.Options{Root: again, GPUs: gpus})
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s: recorded tree differs:\n%+v\n%+v", name, a, b)
		}
	}
}

func TestMaterializeRefuses(t *testing.T) {
	for _, bad := range []string{"f ../escape x", "l /abs x", "x a b", "f onlypath"} {
		if err := topo.Materialize(strings.NewReader(bad), t.TempDir()); !errors.Is(err, errs.ErrInvalidArgument) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TE_SYSFS_ROOT replaces /sys.
func TestRootFromEnvironment(t *testing.T) {
	t.Setenv(topo.EnvSysfsRoot, "/x/y")
	if topo.Root() != "/x/y" {
		t.Fatal(topo.Root())
	}
	t.Setenv(topo.EnvSysfsRoot, "")
	if topo.Root() != "/sys" {
		t.Fatal(topo.Root())
	}
}
