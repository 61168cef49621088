package rdma

import (
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
)

// The kernel's PROCMAP_QUERY answer and the text of /proc/self/maps name
// the same mapping, for anonymous memory, a shared file mapping and the
// program text, so the cache's identity check does not depend on which
// the kernel offers; a range running past its mapping is in none.
func TestMappingQueryMatchesMaps(t *testing.T) {
	anon, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	mfd, err := unix.MemfdCreate("te-maps", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, 1<<20); err != nil {
		t.Fatal(err)
	}
	shared, err := unix.Mmap(mfd, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(shared)
	text := **(**uintptr)(unsafe.Pointer(&struct{ f func(*testing.T) }{TestMappingQueryMatchesMaps}))
	buf := make([]byte, 4096)
	for _, addr := range []uint64{uint64(uintptr(unsafe.Pointer(&anon[4096]))), uint64(uintptr(unsafe.Pointer(&shared[0]))), uint64(text)} {
		fd, err := unix.Open("/proc/self/maps", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		q, found, ok := queryMapping(fd, addr)
		txt, tok := readMaps(fd, addr, 8, buf)
		unix.Close(fd)
		if !tok || txt.start > addr || txt.end <= addr || txt.perms&procmapRead == 0 {
			t.Fatalf("at %#x the maps say %+v (%v)", addr, txt, tok)
		}
		if !ok {
			t.Log("no PROCMAP_QUERY (Linux before 6.11): the maps alone")
			continue
		}
		if !found || q != txt {
			t.Fatalf("at %#x: ioctl %+v (found %v), maps %+v", addr, q, found, txt)
		}
	}
	if v, ok := mappingOf(uint64(uintptr(unsafe.Pointer(&shared[0]))), 2<<20, buf); ok {
		t.Fatalf("a range past its mapping is in %+v", v)
	}
	if v, ok := mappingOf(uint64(uintptr(unsafe.Pointer(&shared[0]))), 1<<20, buf); !ok || v.inode == 0 || v.perms&procmapShared == 0 {
		t.Fatalf("the memfd mapping: %+v %v", v, ok)
	}
}

// A window is registered on every NIC at once (each fake NIC's RegMR waits
// until all four are in it), and when one NIC refuses, none of them keeps
// a region and the cache holds nothing.
func TestMRCacheParallelNICs(t *testing.T) {
	b, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	addr := uint64(uintptr(unsafe.Pointer(&b[0])))
	var wg sync.WaitGroup
	wg.Add(4)
	nics := make([]*fakeNIC, 4)
	regs := make([]registrar, 4)
	for i := range nics {
		nics[i] = &fakeNIC{idx: i, barrier: &wg}
		regs[i] = nics[i]
	}
	c := &mrCache{}
	e, err := c.acquire(addr, 4096, 1, regs, ParallelRegMin)
	if err != nil || e == nil || len(e.mrs) != 4 {
		t.Fatalf("%+v %v", e, err)
	}
	for _, n := range nics {
		n.barrier = nil
	}
	if e2, err := c.acquire(addr+8192, 4096, 1, regs, ParallelRegMin); err != nil || e2 != e {
		t.Fatalf("second region of the mapping: %p %v, want the window %p", e2, err, e)
	}
	if err := c.release(e); err != nil || nics[0].registered() != 1 {
		t.Fatalf("one of two released: %v, %d live", err, nics[0].registered())
	}
	if err := c.release(e); err != nil || nics[0].registered() != 0 {
		t.Fatalf("both released: %v, %d live", err, nics[0].registered())
	}
	nics[2].fail = errs.New(errs.Internal, "fake", "refused")
	if e, err := c.acquire(addr, 4096, 1, regs, ParallelRegMin); err == nil || e != nil {
		t.Fatalf("a NIC refused: %+v %v", e, err)
	}
	for _, n := range nics {
		if n.registered() != 0 {
			t.Fatalf("%s keeps a region after another NIC refused", n.Name())
		}
	}
	if len(c.entries) != 0 {
		t.Fatalf("%d windows cached after a failed registration", len(c.entries))
	}
}

// BenchmarkMRCacheHit is te's own cost for a region served by a window
// already registered: the mapping lookup and the cache's.
func BenchmarkMRCacheHit(b *testing.B) {
	m, err := unix.Mmap(-1, 0, 64<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(m)
	addr := uint64(uintptr(unsafe.Pointer(&m[0])))
	regs := []registrar{&fakeNIC{idx: 0}, &fakeNIC{idx: 1}}
	c := &mrCache{}
	e, err := c.acquire(addr, 4096, 1, regs, ParallelRegMin)
	if err != nil || e == nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x, err := c.acquire(addr+uint64(i%1000)*4096, 4096, 1, regs, ParallelRegMin)
		if err != nil || x != e {
			b.Fatal(err)
		}
		_ = c.release(x)
	}
}

// GPU regions of one allocation share a window registered on every NIC
// through the allocation's dma-buf (its size is the fd's), and the last
// region's unregister deregisters it; an fd without a size (not a dma-buf)
// or an allocation above max_mr_size leaves each region to its own
// registration.
func TestMRCacheDevice(t *testing.T) {
	const size = 1 << 20
	base := uint64(0x7000_0000_0000)
	export := func(addr, _ uint64, _ int) (int, uint64, error) {
		fd, err := unix.MemfdCreate("te-dmabuf", unix.MFD_CLOEXEC)
		if err == nil {
			err = unix.Ftruncate(fd, size)
		}
		return fd, addr - base, err
	}
	pipe := func(addr, _ uint64, _ int) (int, uint64, error) {
		var fds [2]int
		err := unix.Pipe2(fds[:], unix.O_CLOEXEC)
		unix.Close(fds[1])
		return fds[0], addr - base, err
	}
	gpu := func(off, n uint64) *segment.Region {
		r := &segment.Region{Addr: base + off, Length: n, Remote: true, Location: segment.Location{Kind: "cuda", Index: 1}}
		return r
	}
	fs, rs := fakes(2)
	k := newKeyTable()
	k.cache = &mrCache{}
	var regions []*segment.Region
	for i := uint64(0); i < 4; i++ {
		r := gpu(i*size/4, size/4)
		if how, err := k.registerDevice(r, rs, export); err != nil || how != viaDmabuf {
			t.Fatalf("region %d: %q %v", i, how, err)
		}
		regions = append(regions, r)
	}
	for _, f := range fs {
		if f.registered() != 1 || len(f.via) != 1 {
			t.Fatalf("%s: %d memory regions (%v) for 4 regions of one allocation, want 1", f.Name(), f.registered(), f.via)
		}
	}
	if regions[0].Desc.Rkey[1] != regions[3].Desc.Rkey[1] {
		t.Fatal("regions of one allocation publish different keys")
	}
	for i, r := range regions {
		if err := k.unregister(r); err != nil {
			t.Fatal(err)
		}
		if want := map[bool]int{true: 0, false: 1}[i == 3]; fs[0].registered() != want {
			t.Fatalf("after %d unregistered: %d live, want %d", i+1, fs[0].registered(), want)
		}
	}
	// Not a dma-buf (no size), and an allocation above max_mr_size: one
	// memory region per region.
	r1, r2 := gpu(0, size/4), gpu(size/4, size/4)
	for _, r := range []*segment.Region{r1, r2} {
		if _, err := k.registerDevice(r, rs, pipe); err != nil {
			t.Fatal(err)
		}
	}
	if fs[0].registered() != 2 {
		t.Fatalf("regions of an fd without a size: %d memory regions, want 2", fs[0].registered())
	}
	k.closeAll()
	if fs[0].registered()+fs[1].registered() != 0 {
		t.Fatal("memory regions left after closeAll")
	}
	if created, _ := k.cache.counts(); created != 1 {
		t.Fatalf("%d windows created, want 1", created)
	}
	small := []registrar{limitedNIC{fs[0], size / 2}, limitedNIC{fs[1], size / 2}}
	for _, r := range []*segment.Region{gpu(0, size/4), gpu(size/4, size/4)} {
		if _, err := k.registerDevice(r, small, export); err != nil {
			t.Fatal(err)
		}
	}
	if fs[0].registered() != 2 {
		t.Fatalf("an allocation above max_mr_size: %d memory regions for 2 regions, want 2", fs[0].registered())
	}
	k.closeAll()
}

// limitedNIC is a fake NIC with a max_mr_size.
type limitedNIC struct {
	*fakeNIC
	max uint64
}

func (l limitedNIC) maxMRSize() uint64 { return l.max }

// A window from rdma.parallel_reg_min bytes is pre-faulted before the NICs
// register it, as a region that long is; a shorter one is left alone.
func TestMRCachePreTouch(t *testing.T) {
	const size = 4 << 20
	for _, c := range []struct {
		min      uint64
		resident bool
	}{{1 << 20, true}, {ParallelRegMin, false}} {
		b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		// A guard page after it keeps the kernel from merging it with a
		// neighbour, so the window is exactly this mapping.
		if err := unix.Mprotect(b[size-4096:], unix.PROT_NONE); err != nil {
			t.Fatal(err)
		}
		_, regs := fakes(1)
		cache := &mrCache{}
		e, err := cache.acquire(uint64(uintptr(unsafe.Pointer(&b[0]))), 4096, 1, regs, c.min)
		if err != nil || e == nil {
			t.Fatal(err)
		}
		vec := make([]byte, size/4096)
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), size, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			t.Fatal(e)
		}
		n := 0
		for _, v := range vec[:len(vec)-1] {
			n += int(v & 1)
		}
		if got := n == len(vec)-1; got != c.resident {
			t.Fatalf("parallel_reg_min %d: %d of %d pages resident after registering the window", c.min, n, len(vec)-1)
		}
		_ = cache.release(e)
		unix.Munmap(b)
	}
}

// dmabufLog is a NIC with a max_mr_size that records where each dma-buf
// registration lies in the fd, and fails its failAt-th registration.
type dmabufLog struct {
	limitedNIC
	mu     sync.Mutex
	calls  [][2]uint64 // offset, length
	n      int
	failAt int
}

func (d *dmabufLog) RegDmabuf(offset, length, iova uint64, fd int, access int) (memReg, error) {
	d.mu.Lock()
	d.n++
	fail := d.n == d.failAt
	d.calls = append(d.calls, [2]uint64{offset, length})
	d.mu.Unlock()
	if fail || length > d.max {
		return nil, errs.New(errs.InvalidArgument, "fake", "dma-buf registration refused")
	}
	return d.limitedNIC.RegDmabuf(offset, length, iova, fd, access)
}

// GPU memory longer than max_mr_size is registered through its dma-buf as
// overlapping memory regions at their offsets in the fd, the descriptor
// says how; a NIC refusing one of them leaves nothing registered.
func TestSplitDevice(t *testing.T) {
	const (
		limit = 1 << 20
		size  = 3*limit + 8192
		off   = 1 << 16 // the region's offset in its allocation's dma-buf
	)
	base := uint64(0x7000_0000_0000)
	export := func(addr, _ uint64, _ int) (int, uint64, error) {
		fd, err := unix.MemfdCreate("te-dmabuf", unix.MFD_CLOEXEC)
		if err == nil {
			err = unix.Ftruncate(fd, size+off)
		}
		return fd, off, err
	}
	for _, cache := range []bool{false, true} {
		fs, _ := fakes(2)
		logs := []*dmabufLog{{limitedNIC: limitedNIC{fs[0], limit}}, {limitedNIC: limitedNIC{fs[1], limit}}}
		nics := []registrar{logs[0], logs[1]}
		k := newKeyTable()
		if cache {
			k.cache = &mrCache{}
		}
		r := &segment.Region{Addr: base, Length: size, Remote: true, Location: segment.Location{Kind: "cuda", Index: 0}}
		how, err := k.registerDevice(r, nics, export)
		if err != nil || how != viaDmabuf {
			t.Fatalf("cache=%v: %q %v", cache, how, err)
		}
		count := segment.MRCount(size, limit/2, limit)
		if r.Desc.MRStep != limit/2 || r.Desc.MRSpan != limit || len(r.Desc.MoreRkey) != count-1 || len(r.Desc.MoreLkey) != count-1 {
			t.Fatalf("cache=%v: layout step %d span %d, %d more keys, want %d, %d, %d", cache, r.Desc.MRStep, r.Desc.MRSpan, len(r.Desc.MoreRkey), limit/2, limit, count-1)
		}
		for _, l := range logs {
			if len(l.calls) != count {
				t.Fatalf("cache=%v: %d dma-buf registrations, want %d", cache, len(l.calls), count)
			}
			for i, c := range l.calls {
				wantLen := min(uint64(limit), size-uint64(i)*limit/2)
				if c[0] != off+uint64(i)*limit/2 || c[1] != wantLen {
					t.Fatalf("cache=%v: registration %d at [%d,+%d) of the dma-buf, want [%d,+%d)", cache, i, c[0], c[1], off+uint64(i)*limit/2, wantLen)
				}
			}
		}
		d := segment.Desc{Name: "x", Buffers: []segment.BufferDesc{r.Desc}}
		d.Buffers[0].Addr, d.Buffers[0].Length = r.Addr, r.Length
		if err := d.Validate(); err != nil {
			t.Fatalf("cache=%v: the descriptor of a split region does not validate: %v", cache, err)
		}
		if err := k.unregister(r); err != nil {
			t.Fatal(err)
		}
		if fs[0].registered()+fs[1].registered() != 0 {
			t.Fatalf("cache=%v: memory regions left after unregister", cache)
		}
		// A NIC refusing the third region: nothing stays registered.
		logs[1].failAt = logs[1].n + 3
		r2 := &segment.Region{Addr: base, Length: size, Remote: true, Location: segment.Location{Kind: "cuda", Index: 0}}
		if _, err := k.registerDevice(r2, nics, export); err == nil {
			t.Fatalf("cache=%v: a refused region registered", cache)
		}
		if fs[0].registered()+fs[1].registered() != 0 {
			t.Fatalf("cache=%v: %d memory regions left after a refused split", cache, fs[0].registered()+fs[1].registered())
		}
	}
}
