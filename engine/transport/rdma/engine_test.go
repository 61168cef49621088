package rdma_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/errs"
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

// fakeVerbsPair starts a target and an initiator engine over the software
// provider (two devices each), registers a buffer of size on each and opens
// the target's segment.
func fakeVerbsPair(t testing.TB, lib string, size int, params ...string) (init *engine.Engine, seg *engine.Segment, src, dst []byte) {
	t.Helper()
	conf := cfg()
	conf.Transports = []string{rdma.Name}
	conf.Params = map[string]string{"rdma.library": lib}
	for i := 0; i+1 < len(params); i += 2 {
		conf.Params[params[i]] = params[i+1]
	}
	target, err := engine.New(conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { target.Close() })
	conf.ForceTransport = rdma.Name
	if init, err = engine.New(conf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { init.Close() })
	src, dst = mem.MustAlloc(size), mem.MustAlloc(size)
	t.Cleanup(func() { mem.Free(src); mem.Free(dst) })
	if err := init.RegisterMemory(mem.Addr(src), uint64(size), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if err := target.RegisterMemory(mem.Addr(dst), uint64(size), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if seg, err = init.OpenSegment(target.Name()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { init.CloseSegment(seg) })
	return init, seg, src, dst
}

// runBatch writes n blocks of bs bytes in one batch and waits.
func runBatch(t testing.TB, b *engine.Batch, seg *engine.Segment, src, dst []byte, n, bs int) {
	reqs := make([]engine.Request, n)
	for i := range reqs {
		off := uint64(i * bs)
		reqs[i] = engine.Request{Op: engine.Write, Local: mem.Addr(src) + off, Segment: seg, Remote: mem.Addr(dst) + off, Length: uint64(bs)}
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
}

// Through the real verbs code path: a batch of 128 requests rings the
// doorbell (ibv_post_send) at most once per endpoint, here the two NIC
// pairs, and asks for a completion every few work requests, as counted by
// the software provider.
func TestFakeVerbsDoorbells(t *testing.T) {
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	const n, bs = 128, 4096
	init, seg, src, dst := fakeVerbsPair(t, lib, n*bs)
	b, err := init.AllocateBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	runBatch(t, b, seg, src, dst, n, bs) // connects both NIC pairs
	posts, wrs, cqes := fake.Stat(ibvtest.StatPostCalls), fake.Stat(ibvtest.StatPosted), fake.Stat(ibvtest.StatCQEs)
	for i := range src {
		src[i] = byte(i * 7)
	}
	runBatch(t, b, seg, src, dst, n, bs)
	if !bytes.Equal(src, dst) {
		t.Fatal("bytes differ")
	}
	posts, wrs, cqes = fake.Stat(ibvtest.StatPostCalls)-posts, fake.Stat(ibvtest.StatPosted)-wrs, fake.Stat(ibvtest.StatCQEs)-cqes
	t.Logf("128 requests: %d work requests, %d ibv_post_send calls, %d completions", wrs, posts, cqes)
	if wrs != n || posts > 2 {
		t.Fatalf("%d work requests in %d ibv_post_send calls; want %d in at most 2 (one per endpoint)", wrs, posts, n)
	}
	if cqes > n/8 {
		t.Fatalf("%d completions for %d work requests", cqes, n)
	}
}

// Warmup connects the queue pairs of both NIC pairs ahead of the first
// transfer: the transfer after it creates none.
func TestFakeVerbsWarmup(t *testing.T) {
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	const n, bs = 16, 4096
	init, seg, src, dst := fakeVerbsPair(t, lib, n*bs)
	before := fake.Stat(ibvtest.StatQPs)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := init.Warmup(ctx, seg.Name()); err != nil {
		t.Fatal(err)
	}
	warmed := fake.Stat(ibvtest.StatQPs)
	if warmed <= before {
		t.Fatalf("warmup created no queue pair (%d before, %d after)", before, warmed)
	}
	b, err := init.AllocateBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	for i := range src {
		src[i] = byte(i * 5)
	}
	runBatch(t, b, seg, src, dst, n, bs)
	if !bytes.Equal(src, dst) {
		t.Fatal("bytes differ")
	}
	if after := fake.Stat(ibvtest.StatQPs); after != warmed {
		t.Fatalf("the first transfer after warmup changed the queue pairs: %d -> %d", warmed, after)
	}
	t.Logf("queue pairs: %d before warmup, %d after it and after the first transfer", before, warmed)
}

// With rdma.poll=busy the initiator's pollers sleep less between
// back-to-back batches than adaptive ones, which park about once a batch
// on this fake (its completions take longer than the spin budget);
// the bytes move, and once idle a busy poller gives its core back: after a
// pause each has parked again.
func TestFakeVerbsBusyPoll(t *testing.T) {
	lib := ibvtest.Build(t)
	ibvtest.Open(t, lib)
	const n, bs, rounds = 8, 4096, 200
	run := func(mode string) (during, after uint64) {
		init, seg, src, dst := fakeVerbsPair(t, lib, n*bs, "rdma.poll", mode)
		b, err := init.AllocateBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		runBatch(t, b, seg, src, dst, n, bs) // connects both NIC pairs
		time.Sleep(20 * time.Millisecond)    // past the linger: both pollers parked
		parks := func() (sum uint64) {
			for k, v := range init.Stats().Transport[rdma.Name] {
				if strings.HasSuffix(k, ".parks") {
					sum += v
				}
			}
			return sum
		}
		before := parks()
		for r := 0; r < rounds; r++ {
			for i := range src {
				src[i] = byte(i + r)
			}
			runBatch(t, b, seg, src, dst, n, bs)
			if !bytes.Equal(src, dst) {
				t.Fatalf("%s, round %d: bytes differ", mode, r)
			}
		}
		during = parks() - before
		time.Sleep(20 * time.Millisecond)
		after = parks() - before
		t.Logf("rdma.poll=%s: %d batches, %d parks while they ran, %d after a 20 ms pause", mode, rounds, during, after)
		return during, after
	}
	adaptive, _ := run("adaptive")
	during, after := run("busy")
	// Busy pollers park only where the submitter did not run for 2 ms
	// (often, on a loaded machine), adaptive ones at every wait longer
	// than their spin: fewer, whatever the load.
	if during >= adaptive {
		t.Fatalf("busy pollers parked %d times in %d back-to-back batches, adaptive ones %d", during, rounds, adaptive)
	}
	if after <= during {
		t.Fatalf("idle busy pollers never parked (%d parks before the pause, %d after)", during, after)
	}
}

// With rdma.harvest the waiter of a small batch polls the completion queues
// itself before it sleeps: over 200 back-to-back batches of 8 requests
// some completions reach it that way (nic.<name>.harvested), the bytes are
// right, and with the default (0) none do; a batch above the engine's
// harvesting size is left to the pollers.
func TestFakeVerbsHarvest(t *testing.T) {
	lib := ibvtest.Build(t)
	ibvtest.Open(t, lib)
	const bs, rounds = 4096, 200
	run := func(n int, harvest string) uint64 {
		init, seg, src, dst := fakeVerbsPair(t, lib, n*bs, "rdma.harvest", harvest)
		b, err := init.AllocateBatch(n)
		if err != nil {
			t.Fatal(err)
		}
		defer b.Free()
		harvested := func() (sum uint64) {
			for k, v := range init.Stats().Transport[rdma.Name] {
				if strings.HasSuffix(k, ".harvested") {
					sum += v
				}
			}
			return sum
		}
		for r := 0; r < rounds; r++ {
			for i := range src {
				src[i] = byte(i*3 + r)
			}
			runBatch(t, b, seg, src, dst, n, bs)
			if !bytes.Equal(src, dst) {
				t.Fatalf("rdma.harvest=%s, round %d: bytes differ", harvest, r)
			}
		}
		h := harvested()
		t.Logf("rdma.harvest=%s, batches of %d: %d completions harvested in %d batches", harvest, n, h, rounds)
		return h
	}
	if h := run(8, "1ms"); h == 0 {
		t.Fatal("no completion reached a waiter polling for 1 ms")
	}
	if h := run(8, "0"); h != 0 {
		t.Fatalf("rdma.harvest=0: %d completions harvested", h)
	}
	if h := run(64, "1ms"); h != 0 {
		t.Fatalf("batches of 64: %d completions harvested", h)
	}
}
