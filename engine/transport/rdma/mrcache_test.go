package rdma_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport/rdma"
	"github.com/tecache/te/internal/sys/ibv/ibvtest"
	"github.com/tecache/te/internal/sys/mem"
)

// memfdMap maps size bytes of a fresh memfd (a mapping of its own that the
// kernel does not merge with its neighbours; pages are allocated only when
// touched), at addr when addr is not 0 (MAP_FIXED).
func memfdMap(t testing.TB, size int, addr uintptr) []byte {
	t.Helper()
	fd, err := unix.MemfdCreate("te-mrcache", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		t.Fatal(err)
	}
	flags := unix.MAP_SHARED
	if addr != 0 {
		flags |= unix.MAP_FIXED
	}
	p, _, e := unix.Syscall6(unix.SYS_MMAP, addr, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, uintptr(flags), uintptr(fd), 0)
	if e != 0 {
		t.Fatal(e)
	}
	return mem.Bytes(uint64(p), uint64(size))
}

func unmap(t testing.TB, b []byte) {
	t.Helper()
	// unix.Munmap only takes slices of unix.Mmap.
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(mem.Addr(b)), uintptr(len(b)), 0); e != 0 {
		t.Fatal(e)
	}
}

// cachePair is an initiator and a target over the software provider (two
// NICs each), the target with params added.
func cachePair(t testing.TB, lib string, params map[string]string) (init, target *engine.Engine) {
	t.Helper()
	conf := cfg()
	conf.Transports = []string{rdma.Name}
	conf.Params = map[string]string{"rdma.library": lib, "rdma.parallel_reg_min": "64GiB"}
	for k, v := range params {
		conf.Params[k] = v
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
	return init, target
}

// tensors registers n regions of size sz back to back from base.
func tensors(t testing.TB, e *engine.Engine, base uint64, n, sz int) {
	t.Helper()
	rs := make([]engine.MemoryRegion, n)
	for i := range rs {
		rs[i] = engine.MemoryRegion{Addr: base + uint64(i*sz), Length: uint64(sz), Location: "cpu:0", Remote: true}
	}
	if err := e.RegisterMemoryBatch(rs); err != nil {
		t.Fatal(err)
	}
}

func move(init *engine.Engine, op engine.Opcode, local uint64, seg *engine.Segment, remote, n uint64) error {
	b, err := init.AllocateBatch(1)
	if err != nil {
		return err
	}
	defer b.Free()
	if err := b.Submit(engine.Request{Op: op, Local: local, Segment: seg, Remote: remote, Length: n}); err != nil {
		return err
	}
	st, err := b.Wait(10 * time.Second)
	if err != nil {
		return err
	}
	if st.State != engine.Completed {
		return errors.New(st.State.String())
	}
	return nil
}

// With rdma.mr_cache=on, 1,265 tensors of one allocation cost one memory
// region per NIC per max_mr_size window of it, not one per tensor and NIC;
// transfers into tensors on both sides of a window boundary move the right
// bytes; memory of the allocation outside every registered tensor stays
// out of reach; unregistering them all deregisters every window.
func TestMRCacheFakeVerbs(t *testing.T) {
	const (
		nt    = 1265
		sz    = 48 << 10 // 12 pages
		alloc = 64 << 20
		limit = 16 << 20
	)
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	fake.Set(ibvtest.SetMaxMRSize, limit)
	t.Cleanup(func() { fake.Set(ibvtest.SetMaxMRSize, 0) })
	init, target := cachePair(t, lib, map[string]string{"rdma.mr_cache": "on"})
	kv := memfdMap(t, alloc, 0)
	t.Cleanup(func() { unmap(t, kv) })
	base := mem.Addr(kv)
	src := mem.MustAlloc(2 * sz)
	t.Cleanup(func() { mem.Free(src) })
	if err := init.RegisterMemory(mem.Addr(src), 2*sz, "cpu:0", true); err != nil {
		t.Fatal(err)
	}

	regs0, live0 := fake.Stat(ibvtest.StatRegs), fake.Stat(ibvtest.StatMRs)
	tensors(t, target, base, nt, sz)
	// Windows start at the first tensor that does not fit the previous
	// one: 341 tensors of 48 KiB fit 16 MiB, so 1,265 take 4 windows.
	const nics, windows = 2, 4
	if got := fake.Stat(ibvtest.StatRegs) - regs0; got != nics*windows {
		t.Fatalf("%d ibv_reg_mr for %d tensors on %d NICs, want %d (without the cache: %d)", got, nt, nics, nics*windows, nt*nics)
	}
	if got := fake.Stat(ibvtest.StatMRs) - live0; got != nics*windows {
		t.Fatalf("%d memory regions live, want %d", got, nics*windows)
	}
	ts := target.Stats().Transport[rdma.Name]
	if ts["mr_cache_windows"] != windows || ts["mr_cache_hits"] != nt-windows {
		t.Fatalf("stats windows=%d hits=%d, want %d and %d", ts["mr_cache_windows"], ts["mr_cache_hits"], windows, nt-windows)
	}

	seg, err := init.OpenSegment(target.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer init.CloseSegment(seg)
	for k, i := range []int{0, 340, 341, 682, 683, 1023, 1024, 1264} {
		for j := range src[:sz] {
			src[j] = byte(i*7 + j + k)
		}
		at := base + uint64(i*sz)
		if err := move(init, engine.Write, mem.Addr(src), seg, at, sz); err != nil {
			t.Fatalf("WRITE into tensor %d: %v", i, err)
		}
		if !bytes.Equal(kv[i*sz:(i+1)*sz], src[:sz]) {
			t.Fatalf("tensor %d does not hold what was written", i)
		}
		if err := move(init, engine.Read, mem.Addr(src)+sz, seg, at, sz); err != nil {
			t.Fatalf("READ of tensor %d: %v", i, err)
		}
		if !bytes.Equal(src[sz:], src[:sz]) {
			t.Fatalf("READ of tensor %d brought other bytes", i)
		}
	}
	// Past the last tensor the allocation is not registered: the window's
	// rkey covers it at the NIC, te refuses it before anything is posted.
	tail := base + nt*sz
	for j := range src[:sz] {
		src[j] = 0xee
	}
	if err := move(init, engine.Write, mem.Addr(src), seg, tail, 4096); err == nil {
		t.Fatal("WRITE past every registered tensor succeeded")
	}
	if err := move(init, engine.Write, mem.Addr(src), seg, base+(nt-1)*sz+4096, sz); err == nil {
		t.Fatal("WRITE running off the last tensor succeeded")
	}
	if bytes.IndexByte(kv[nt*sz:], 0xee) >= 0 {
		t.Fatal("bytes landed outside the registered tensors")
	}

	addrs := make([]uint64, nt)
	for i := range addrs {
		addrs[i] = base + uint64(i*sz)
	}
	// Half of them first: the windows still serve the other half.
	if err := target.UnregisterMemoryBatch(addrs[:nt/2]); err != nil {
		t.Fatal(err)
	}
	if got := fake.Stat(ibvtest.StatMRs) - live0; got < nics {
		t.Fatalf("%d memory regions live with %d tensors registered", got, nt-nt/2)
	}
	if err := move(init, engine.Write, mem.Addr(src), seg, addrs[nt-1], sz); err != nil {
		t.Fatalf("WRITE into a tensor still registered: %v", err)
	}
	if err := target.UnregisterMemoryBatch(addrs[nt/2:]); err != nil {
		t.Fatal(err)
	}
	if got := fake.Stat(ibvtest.StatMRs) - live0; got != 0 {
		t.Fatalf("%d memory regions left after every tensor was unregistered", got)
	}
}

// Regions of one mapping longer than max_mr_size split into windows that
// each take their own memory region and all move bytes.
func TestMRCacheMaxMRSizeFakeVerbs(t *testing.T) {
	const limit = 1 << 20
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	fake.Set(ibvtest.SetMaxMRSize, limit)
	t.Cleanup(func() { fake.Set(ibvtest.SetMaxMRSize, 0) })
	kv := memfdMap(t, 4*limit, 0)
	t.Cleanup(func() { unmap(t, kv) })
	base := mem.Addr(kv)
	init, target := cachePair(t, lib, map[string]string{"rdma.mr_cache": "on"})
	regs0 := fake.Stat(ibvtest.StatRegs)
	// Four regions of 768 KiB: each window of 1 MiB holds one.
	const sz = 768 << 10
	tensors(t, target, base, 4, sz)
	if got := fake.Stat(ibvtest.StatRegs) - regs0; got != 2*4 {
		t.Fatalf("%d ibv_reg_mr, want 8 (4 windows on 2 NICs)", got)
	}
	src := mem.MustAlloc(sz)
	t.Cleanup(func() { mem.Free(src) })
	if err := init.RegisterMemory(mem.Addr(src), sz, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	seg, err := init.OpenSegment(target.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer init.CloseSegment(seg)
	for i := 0; i < 4; i++ {
		for j := range src {
			src[j] = byte(j*13 + j>>16 + i)
		}
		if err := move(init, engine.Write, mem.Addr(src), seg, base+uint64(i*sz), sz); err != nil {
			t.Fatalf("WRITE into region %d: %v", i, err)
		}
		if !bytes.Equal(kv[i*sz:(i+1)*sz], src) {
			t.Fatalf("region %d does not hold what was written", i)
		}
	}
}

// A window is shared only within the mapping it was registered for, and
// only with regions needing no more access than it has: a file mapped
// again at the same address, or memory unmapped and mapped again once its
// regions are gone, gets memory regions of its own.
func TestMRCacheRemapFakeVerbs(t *testing.T) {
	const size = 1 << 20
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	_, target := cachePair(t, lib, map[string]string{"rdma.mr_cache": "on"})
	a := memfdMap(t, size, 0)
	base := mem.Addr(a)
	regs := func() int64 { return fake.Stat(ibvtest.StatRegs) }

	r0 := regs()
	if err := target.RegisterMemory(base, 4096, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	if err := target.RegisterMemory(base+4096, 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if got := regs() - r0; got != 4 {
		t.Fatalf("a local-only then a remote region: %d ibv_reg_mr, want 4 (the remote one needs more access)", got)
	}
	if err := target.RegisterMemory(base+8192, 4096, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	if got := regs() - r0; got != 4 {
		t.Fatalf("a local-only region after both: %d ibv_reg_mr, want 4 (served by a window)", got)
	}

	// Another file mapped over the same addresses while a region of the
	// old one is still registered: not the same mapping.
	b := memfdMap(t, size, uintptr(base))
	t.Cleanup(func() { unmap(t, b) })
	r1 := regs()
	if err := target.RegisterMemory(base+3*4096, 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if got := regs() - r1; got != 2 {
		t.Fatalf("region of a file mapped again at the same address: %d ibv_reg_mr, want 2 (no stale window)", got)
	}
	for _, at := range []uint64{base, base + 4096, base + 8192, base + 3*4096} {
		if err := target.UnregisterMemory(at); err != nil {
			t.Fatal(err)
		}
	}
	// Anonymous memory at the same address once nothing of it is
	// registered: every window is gone, so a new one is registered.
	live := fake.Stat(ibvtest.StatMRs)
	if _, _, e := unix.Syscall6(unix.SYS_MMAP, uintptr(base), size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0); e != 0 {
		t.Fatal(e)
	}
	r2 := regs()
	if err := target.RegisterMemory(base, 4096, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if got := regs() - r2; got != 2 {
		t.Fatalf("anonymous memory mapped at the same address: %d ibv_reg_mr, want 2", got)
	}
	if err := target.UnregisterMemory(base); err != nil {
		t.Fatal(err)
	}
	if got := fake.Stat(ibvtest.StatMRs); got != live {
		t.Fatalf("%d memory regions live, want %d", got, live)
	}
}

// FAKEVERBS_MAX_MR_SIZE in a process's environment is the NICs'
// max_mr_size there: regions up to it register, with the cache one window
// per region when each fills one; a region of host or GPU memory longer
// than it is split into memory regions of at most that (with the cache and
// without), and another process whose NICs have the same limit moves every
// byte of it each way, in one request and in blocks across the regions'
// edges.
func TestTwoProcessMaxMRSize(t *testing.T) {
	f := newFabricSetup(t, "hgx8")
	const (
		limit = 1 << 20
		size  = 3*limit + 4096
	)
	for _, cache := range []string{"off", "on"} {
		env := []string{"FAKEVERBS_MAX_MR_SIZE=1048576", "TE_RDMA_TEST_TRANSPORTS=rdma", "TE_RDMA_TEST_PARAMS=rdma.mr_cache=" + cache}
		n, m := f.startNode(env...), f.startNode(env...)
		a := n.addr("alloc cpu %d", 4*limit)
		for i := 0; i < 4; i++ {
			n.do("reg %d %d cpu:0", a+uint64(i*limit), limit)
		}
		if s := n.stats(); cache == "on" && (s["mr_cache_windows"] != 4 || s["mr_cache_hits"] != 0) {
			t.Fatalf("mr_cache=on: %v, want 4 windows", s)
		}
		b := m.addr("alloc cpu %d", 2*size)
		m.do("reg %d %d cpu:0", b, 2*size)
		m.do("fill %d %d 7", b, 2*size)
		// Both registered before the peer reads the descriptor.
		bigs := []uint64{n.addr("alloc cpu %d", size), n.addr("alloc cuda 3 %d", size)}
		n.do("reg %d %d cpu:0", bigs[0], size)
		n.do("reg %d %d cuda:3", bigs[1], size)
		m.do("open %s", n.name)
		for _, big := range bigs {
			transfer(t, m, n, "write", b, big, size, 1, "rdma")
			transfer(t, m, n, "read", b+size, big, size, 1, "rdma")
			transfer(t, m, n, "write", b+4096, big+limit-8192, 64<<10, 4, "rdma")
			transfer(t, m, n, "read", b+size, big+size-(96<<10), 96<<10, 3, "rdma")
			n.do("unreg %d", big)
		}
		if s := n.stats(); s["gpu_dmabuf"] != 1 {
			t.Fatalf("mr_cache=%s: the GPU region did not go through its dma-buf: %v", cache, s)
		}
	}
}

// With rdma.mr_cache=on the regions of one GPU allocation share one
// memory region per NIC, registered through the allocation's one dma-buf;
// READs and WRITEs into two of them, by another process, move every byte;
// a second allocation gets a window of its own.
func TestTwoProcessGPUMRCache(t *testing.T) {
	f := newFabricSetup(t, "hgx8")
	a := f.startNode("TE_RDMA_TEST_PARAMS=rdma.mr_cache=on")
	b := f.startNode()
	const size, part = 8 << 20, 2 << 20
	ag := a.addr("alloc cuda 3 %d", size)
	ag2 := a.addr("alloc cuda 3 %d", size)
	for i := uint64(0); i < size/part; i++ {
		a.do("reg %d %d cuda:3", ag+i*part, part)
	}
	a.do("reg %d %d cuda:3", ag2, part)
	s := a.stats()
	if s["gpu_dmabuf"] != size/part+1 || s["mr_cache_windows"] != 2 || s["mr_cache_hits"] != size/part-1 {
		t.Fatalf("%d regions of one allocation and one of another: %v, want 2 windows", size/part, s)
	}
	bh := b.addr("alloc cpu %d", size)
	b.do("reg %d %d cpu:0", bh, size)
	b.do("fill %d %d 7", bh, size)
	b.do("open %s", a.name)
	transfer(t, b, a, "write", bh, ag+part, part, 4, "rdma")
	transfer(t, b, a, "read", bh+part, ag+3*part, part, 4, "rdma")
	transfer(t, b, a, "write", bh, ag2, part, 4, "rdma")
	for i := uint64(0); i < size/part; i++ {
		a.do("unreg %d", ag+i*part)
	}
	a.do("unreg %d", ag2)
}

// A region longer than the NICs' max_mr_size is registered as overlapping
// memory regions of at most max_mr_size on every NIC, with the cache and
// without, on both sides: one request over the whole of it, requests
// straddling the regions' edges and slices longer than the overlap move
// the right bytes each way (the fake NIC refuses a key outside its
// region), and unregistering frees every memory region.
func TestSplitAboveMaxMRSizeFakeVerbs(t *testing.T) {
	const (
		limit = 1 << 20
		size  = 5*limit + 4096
		nics  = 2
	)
	lib := ibvtest.Build(t)
	fake := ibvtest.Open(t, lib)
	fake.Set(ibvtest.SetMaxMRSize, limit)
	t.Cleanup(func() { fake.Set(ibvtest.SetMaxMRSize, 0) })
	// Half of max_mr_size overlaps, so a region starts every 512 KiB.
	want := nics * segment.MRCount(size, limit/2, limit)
	for _, cache := range []string{"off", "on"} {
		t.Run("mr_cache="+cache, func(t *testing.T) {
			live0 := fake.Stat(ibvtest.StatMRs)
			// The initiator's slices (1 MiB) are longer than the overlaps.
			init, target := cachePair(t, lib, map[string]string{"rdma.mr_cache": cache, "rdma.slice": "1MiB"})
			kv := memfdMap(t, size, 0)
			t.Cleanup(func() { unmap(t, kv) })
			src := mem.MustAlloc(2 * size)
			t.Cleanup(func() { mem.Free(src) })
			regs0 := fake.Stat(ibvtest.StatRegs)
			if err := target.RegisterMemory(mem.Addr(kv), size, "cpu:0", true); err != nil {
				t.Fatalf("registering %d bytes over a max_mr_size of %d: %v", size, limit, err)
			}
			if got := fake.Stat(ibvtest.StatRegs) - regs0; got != int64(want) {
				t.Fatalf("%d ibv_reg_mr for %d bytes, want %d", got, size, want)
			}
			if err := init.RegisterMemory(mem.Addr(src), 2*size, "cpu:0", true); err != nil {
				t.Fatal(err)
			}
			seg, err := init.OpenSegment(target.Name())
			if err != nil {
				t.Fatal(err)
			}
			defer init.CloseSegment(seg)
			base, local := mem.Addr(kv), mem.Addr(src)
			fill := func(b []byte, k int) {
				for j := range b {
					b[j] = byte(j*31 + j>>12 + k)
				}
			}
			// The whole region at once, from an offset of the initiator's
			// region that puts its edges elsewhere than the target's.
			const skew = 3 * 4096
			fill(src[skew:skew+size], 1)
			if err := move(init, engine.Write, local+skew, seg, base, size); err != nil {
				t.Fatalf("WRITE of the whole region: %v", err)
			}
			if !bytes.Equal(kv, src[skew:skew+size]) {
				t.Fatal("the region does not hold what was written")
			}
			clear(src[size:])
			if err := move(init, engine.Read, local+size, seg, base, size); err != nil {
				t.Fatalf("READ of the whole region: %v", err)
			}
			if !bytes.Equal(src[size:], kv) {
				t.Fatal("READ of the whole region brought other bytes")
			}
			// Across every edge of the target's regions (region 0 ends at
			// 1 MiB, region k at k*512 KiB + 1 MiB) and its last byte.
			for k, off := range []uint64{limit - 100, limit/2 - 1, 3*limit/2 - 4096, 2*limit + 7, size - 8192} {
				n := min(uint64(8192), size-off)
				fill(src[:n], k+7)
				if err := move(init, engine.Write, local, seg, base+off, n); err != nil {
					t.Fatalf("WRITE of %d bytes at %d: %v", n, off, err)
				}
				if !bytes.Equal(kv[off:off+n], src[:n]) {
					t.Fatalf("WRITE at %d: wrong bytes", off)
				}
				if err := move(init, engine.Read, local+size+off, seg, base+off, n); err != nil {
					t.Fatalf("READ of %d bytes at %d: %v", n, off, err)
				}
				if !bytes.Equal(src[size+off:size+off+n], kv[off:off+n]) {
					t.Fatalf("READ at %d: wrong bytes", off)
				}
			}
			if err := move(init, engine.Write, local, seg, base+size-4096, 8192); err == nil {
				t.Fatal("WRITE running off the region succeeded")
			}
			init.CloseSegment(seg)
			if err := target.UnregisterMemory(mem.Addr(kv)); err != nil {
				t.Fatal(err)
			}
			if err := init.UnregisterMemory(local); err != nil {
				t.Fatal(err)
			}
			if got := fake.Stat(ibvtest.StatMRs) - live0; got != 0 {
				t.Fatalf("%d memory regions left after unregistering", got)
			}
		})
	}
}
