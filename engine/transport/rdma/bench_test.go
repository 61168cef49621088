package rdma_test

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
)

// BenchmarkFakeVerbsWrite measures the transport's own cost: engine to
// engine WRITEs through the real verbs code path (slicing, work requests in
// C memory, post_send and poll_cq through the ops table, the completion
// channel and poller) over the software provider, whose "NIC" is a memcpy.
// It reports the throughput as a ratio to a plain memcpy of the same size
// measured in the same run: 1.0 would mean the path adds nothing to the
// copy. It says nothing about a real NIC's bandwidth.
func BenchmarkFakeVerbsWrite(b *testing.B) {
	const size = 4 << 20
	lib := ibvtest.Build(b)
	conf := cfg()
	conf.Transports = []string{rdma.Name}
	conf.Params = map[string]string{"rdma.library": lib}
	target, err := engine.New(conf)
	if err != nil {
		b.Fatal(err)
	}
	defer target.Close()
	conf.ForceTransport = rdma.Name
	init, err := engine.New(conf)
	if err != nil {
		b.Fatal(err)
	}
	defer init.Close()
	src, dst := mem.MustAlloc(size), mem.MustAlloc(size)
	defer mem.Free(src)
	defer mem.Free(dst)
	if err := init.RegisterMemory(mem.Addr(src), size, "cpu:0", true); err != nil {
		b.Fatal(err)
	}
	if err := target.RegisterMemory(mem.Addr(dst), size, "cpu:0", true); err != nil {
		b.Fatal(err)
	}
	seg, err := init.OpenSegment(target.Name())
	if err != nil {
		b.Fatal(err)
	}
	write := func() {
		batch, err := init.AllocateBatch(1)
		if err != nil {
			b.Fatal(err)
		}
		if err := batch.Submit(engine.Request{Op: engine.Write, Local: mem.Addr(src), Segment: seg, Remote: mem.Addr(dst), Length: size}); err != nil {
			b.Fatal(err)
		}
		if st, err := batch.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
			b.Fatalf("%+v %v", st, err)
		}
		if err := batch.Free(); err != nil {
			b.Fatal(err)
		}
	}
	write()
	// The reference: memcpy of the same size between the same (warm)
	// buffers in the same run, best of 5 rounds of 10 copies so a noisy
	// neighbour does not make the ratio look better than it is.
	var ref float64
	for r := 0; r < 5; r++ {
		t0 := time.Now()
		for i := 0; i < 10; i++ {
			copy(dst, src)
		}
		ref = max(ref, float64(size*10)/time.Since(t0).Seconds())
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		write()
	}
	b.StopTimer()
	got := float64(size) * float64(b.N) / b.Elapsed().Seconds()
	b.ReportMetric(got/ref, "x-memcpy")
	b.ReportMetric(ref/1e9, "memcpy-GB/s")
	init.CloseSegment(seg)
}

// BenchmarkFakeVerbsBatch128 submits batches of 128 WRITEs (4 KiB and 1 MiB)
// through the real verbs code path over the software provider and reports,
// per batch, the ibv_post_send calls (doorbells) and completions the
// provider counted, and per request the process's CPU time split into what
// the provider's device threads spent (the "NIC": on hardware, none of the
// host's CPU) and the rest (te's own: engine, transport, the provider's
// entry points it calls, the wake-ups of the completion path). Its ns/op is
// the batch's round trip through the software device and says little about
// a NIC.
func BenchmarkFakeVerbsBatch128(b *testing.B) {
	for _, bs := range []int{4 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("block=%dKiB", bs>>10), func(b *testing.B) { benchBatch128(b, bs) })
	}
}

func benchBatch128(b *testing.B, bs int) {
	const n = 128
	lib := ibvtest.Build(b)
	fake := ibvtest.Open(b, lib)
	init, seg, src, dst := fakeVerbsPair(b, lib, n*bs)
	batch, err := init.AllocateBatch(n)
	if err != nil {
		b.Fatal(err)
	}
	defer batch.Free()
	runBatch(b, batch, seg, src, dst, n, bs)
	posts, cqes := fake.Stat(ibvtest.StatPostCalls), fake.Stat(ibvtest.StatCQEs)
	cpu0, nic0 := processCPU(), fake.Stat(ibvtest.StatNICNanos)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		runBatch(b, batch, seg, src, dst, n, bs)
	}
	b.StopTimer()
	reqs := float64(b.N * n)
	cpu, nic := float64(processCPU()-cpu0), float64(fake.Stat(ibvtest.StatNICNanos)-nic0)
	b.ReportMetric(float64(fake.Stat(ibvtest.StatPostCalls)-posts)/float64(b.N), "post_send/batch")
	b.ReportMetric(float64(fake.Stat(ibvtest.StatCQEs)-cqes)/float64(b.N), "cqe/batch")
	b.ReportMetric(cpu/reqs/1e3, "cpu-us/req")
	b.ReportMetric(nic/reqs/1e3, "nic-us/req")
	b.ReportMetric((cpu-nic)/reqs/1e3, "te-us/req")
}

// processCPU is the process's user and system CPU time in nanoseconds.
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// BenchmarkRegisterTensors registers 1,265 tensors of one 8 GiB allocation
// (a memfd mapping: no page is touched) on the software provider's two
// NICs, as vLLM registers each layer's KV tensor, with the range cache off
// and on (and on with a max_mr_size of 1 GiB), and reports the
// ibv_reg_mr calls and te's time per tensor and per GiB registered. The
// provider does not pin pages, so this is te's own cost plus the fake's
// bookkeeping (which reads /proc/self/maps per registration): on a NIC each
// ibv_reg_mr also pins its range, which the cache does once per window
// instead of once per tensor.
func BenchmarkRegisterTensors(b *testing.B) {
	for _, c := range []struct {
		name, cache string
		maxMR       int64
	}{{"cache=off", "off", 0}, {"cache=on", "on", 0}, {"cache=on,max_mr=1GiB", "on", 1 << 30}} {
		b.Run(c.name, func(b *testing.B) { benchRegister(b, c.cache, c.maxMR) })
	}
}

// BenchmarkRegisterSplit registers one 8 GiB region (a memfd mapping: no
// page is touched) on the software provider's two NICs with a max_mr_size
// of 1 GiB: it is split into overlapping memory regions of 1 GiB. Reports
// the ibv_reg_mr calls and te's time per GiB.
func BenchmarkRegisterSplit(b *testing.B) {
	const size = 8 << 30
	e, fake := regEngine(b, "off", 1<<30)
	kv := memfdMap(b, size, 0)
	defer unmap(b, kv)
	ns := timeRegs(b, fake,
		func() error { return e.RegisterMemory(mem.Addr(kv), size, "cpu:0", true) },
		func() error { return e.UnregisterMemory(mem.Addr(kv)) })
	b.ReportMetric(ns/8/1e6, "ms/GiB")
}

// regEngine is an engine over the software provider's two NICs, whose
// max_mr_size is maxMR (0: unbounded), with rdma.mr_cache=cache.
func regEngine(b *testing.B, cache string, maxMR int64) (*engine.Engine, *ibvtest.Lib) {
	lib := ibvtest.Build(b)
	fake := ibvtest.Open(b, lib)
	fake.Set(ibvtest.SetMaxMRSize, maxMR)
	b.Cleanup(func() { fake.Set(ibvtest.SetMaxMRSize, 0) })
	conf := cfg()
	conf.Transports = []string{rdma.Name}
	conf.Params = map[string]string{"rdma.library": lib, "rdma.parallel_reg_min": "64GiB", "rdma.mr_cache": cache}
	e, err := engine.New(conf)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { e.Close() })
	return e, fake
}

// timeRegs times reg b.N times, each followed by unreg (not timed) and a
// check that no memory region is left, reports the ibv_reg_mr calls per
// registration and returns its nanoseconds.
func timeRegs(b *testing.B, fake *ibvtest.Lib, reg, unreg func() error) float64 {
	regs0 := fake.Stat(ibvtest.StatRegs)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := reg(); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := unreg(); err != nil {
			b.Fatal(err)
		}
		if n := fake.Stat(ibvtest.StatMRs); n != 0 {
			b.Fatalf("%d memory regions left after unregistering", n)
		}
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(float64(fake.Stat(ibvtest.StatRegs)-regs0)/float64(b.N), "reg_mr/op")
	return float64(b.Elapsed().Nanoseconds()) / float64(b.N)
}

func benchRegister(b *testing.B, cache string, maxMR int64) {
	const (
		nt    = 1265
		alloc = 8 << 30
		sz    = alloc / nt &^ 4095
	)
	e, fake := regEngine(b, cache, maxMR)
	kv := memfdMap(b, alloc, 0)
	defer unmap(b, kv)
	rs := make([]engine.MemoryRegion, nt)
	addrs := make([]uint64, nt)
	for i := range rs {
		addrs[i] = mem.Addr(kv) + uint64(i*sz)
		rs[i] = engine.MemoryRegion{Addr: addrs[i], Length: sz, Location: "cpu:0", Remote: true}
	}
	ns := timeRegs(b, fake,
		func() error { return e.RegisterMemoryBatch(rs) },
		func() error { return e.UnregisterMemoryBatch(addrs) })
	b.ReportMetric(ns/nt/1e3, "us/tensor")
	b.ReportMetric(ns/(float64(nt*sz)/(1<<30))/1e6, "ms/GiB")
}
