package rdma_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
)

func cfg() engine.Config { return engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1"} }

// requireRDMA skips a test that needs an RDMA device, with the reason.
func requireRDMA(t *testing.T) {
	t.Helper()
	if _, err := rdma.Probe(); errors.Is(err, errs.ErrNotSupported) {
		t.Skipf("needs an RDMA device: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
}

// Where rdma cannot run, an engine with the default transports starts
// without it, and one that asks for it fails with the reason.
func TestEngineWithoutRDMA(t *testing.T) {
	why, err := rdma.Probe()
	if err == nil {
		t.Skipf("this machine has RDMA devices %v", why)
	}
	e, err := engine.New(cfg())
	if err != nil {
		t.Fatalf("engine with the default transports: %v", err)
	}
	defer e.Close()
	if slices.Contains(e.Transports(), rdma.Name) || len(e.Transports()) == 0 {
		t.Fatalf("transports %v", e.Transports())
	}
	c := cfg()
	c.Transports = []string{rdma.Name}
	_, err = engine.New(c)
	if !errors.Is(err, errs.ErrTransportUnavailable) || !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("engine with rdma only: %v, want TransportUnavailable caused by NotSupported", err)
	}
	_, probeErr := rdma.Probe()
	if !strings.Contains(err.Error(), strings.TrimPrefix(probeErr.Error(), "rdma: ")) {
		t.Fatalf("engine error %q does not carry the reason %q", err, probeErr)
	}
}

// TestConformance runs the shared suite over RDMA with the target engine in
// a child process. It needs an RDMA NIC or Soft-RoCE (see README.md).
func TestConformance(t *testing.T) {
	requireRDMA(t)
	transporttest.Run(t, transporttest.Setup{Transport: rdma.Name, Process: true})
}

// TestConformanceSmallSlices runs it in one process with 16 KiB slices, two
// queue pairs per endpoint and a shallow queue, so large transfers are cut
// into many work requests that wait for room on the queue pairs.
func TestConformanceSmallSlices(t *testing.T) {
	requireRDMA(t)
	transporttest.Run(t, transporttest.Setup{Transport: rdma.Name, Config: func(c *engine.Config) {
		c.Params = map[string]string{"rdma.slice": "16KiB", "rdma.qps": "2", "rdma.depth": "8"}
	}})
}

// TestConformanceFakeVerbs runs the shared suite through the real verbs
// code path (purego calls, work requests in C memory, the ops table, the
// completion channel and poller) over the software libibverbs of package
// ibvtest: two devices per engine, data moved by the library's fabric.
func TestConformanceFakeVerbs(t *testing.T) {
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	t.Run("suite", func(t *testing.T) {
		transporttest.Run(t, transporttest.Setup{Transport: rdma.Name, Config: func(c *engine.Config) {
			c.Transports = []string{rdma.Name}
			c.Params = map[string]string{"rdma.library": lib, "rdma.slice": "16KiB", "rdma.depth": "16"}
		}})
	})
	if fake.Stat(ibvtest.StatPosted) == 0 {
		t.Fatal("no work request went through the library")
	}
	if n := fake.Live(); n != 0 {
		t.Fatalf("%d verbs objects left after every engine closed", n)
	}
}

// An engine over the software provider publishes what Mooncake publishes:
// devices {name, lid, gid} and, per buffer, one rkey and lkey per device.
func TestDescriptorFakeVerbs(t *testing.T) {
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	for _, c := range []struct {
		allow string
		want  []string
	}{{"", []string{"fake0", "fake1"}}, {"fake1", []string{"fake1"}}} {
		conf := cfg()
		conf.Transports = []string{rdma.Name}
		conf.Params = map[string]string{"rdma.library": lib, "rdma.parallel_reg_min": "1MiB"}
		if c.allow != "" {
			conf.Params["rdma.devices"] = c.allow
		}
		e, err := engine.New(conf)
		if err != nil {
			t.Fatal(err)
		}
		buf := mem.MustAlloc(2 << 20)
		if err := e.RegisterMemory(mem.Addr(buf), 2<<20, "cpu:0", true); err != nil {
			t.Fatal(err)
		}
		d := e.Descriptor()
		if d.Protocol != "rdma" || len(d.Devices) != len(c.want) || len(d.Buffers) != 1 {
			t.Fatalf("descriptor %+v", d)
		}
		var eps []string
		for i, dev := range d.Devices {
			if dev.Name != c.want[i] || dev.LID == 0 || !strings.HasPrefix(dev.GID, "fe:80:00:") {
				t.Fatalf("device %d = %+v", i, dev)
			}
			eps = append(eps, dev.Name+"=ib")
		}
		if d.Endpoints[rdma.Name] != strings.Join(eps, ",") {
			t.Fatalf("endpoint %q", d.Endpoints[rdma.Name])
		}
		b := d.Buffers[0]
		if len(b.Rkey) != len(c.want) || len(b.Lkey) != len(c.want) || b.Rkey[0] == b.Lkey[0] {
			t.Fatalf("keys rkey %v lkey %v", b.Rkey, b.Lkey)
		}
		if len(c.want) == 2 && (b.Rkey[0] == b.Rkey[1] || b.Lkey[0] == b.Lkey[1]) {
			t.Fatalf("one key for two NICs: rkey %v lkey %v", b.Rkey, b.Lkey)
		}
		if got := fake.Stat(ibvtest.StatMRs); got != int64(len(c.want)) {
			t.Fatalf("%d memory regions, want one per NIC", got)
		}
		if err := e.UnregisterMemory(mem.Addr(buf)); err != nil {
			t.Fatal(err)
		}
		if got := fake.Stat(ibvtest.StatMRs); got != 0 {
			t.Fatalf("%d memory regions after unregister", got)
		}
		e.Close()
		mem.Free(buf)
	}
	if n := fake.Live(); n != 0 {
		t.Fatalf("%d verbs objects left", n)
	}
}
