package rdma

import (
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

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
	e, err := c.acquire(addr, 4096, 1, regs)
	if err != nil || e == nil || len(e.mrs) != 4 {
		t.Fatalf("%+v %v", e, err)
	}
	for _, n := range nics {
		n.barrier = nil
	}
	if e2, err := c.acquire(addr+8192, 4096, 1, regs); err != nil || e2 != e {
		t.Fatalf("second region of the mapping: %p %v, want the window %p", e2, err, e)
	}
	if err := c.release(e); err != nil || nics[0].registered() != 1 {
		t.Fatalf("one of two released: %v, %d live", err, nics[0].registered())
	}
	if err := c.release(e); err != nil || nics[0].registered() != 0 {
		t.Fatalf("both released: %v, %d live", err, nics[0].registered())
	}
	nics[2].fail = errs.New(errs.Internal, "fake", "refused")
	if e, err := c.acquire(addr, 4096, 1, regs); err == nil || e != nil {
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
	e, err := c.acquire(addr, 4096, 1, regs)
	if err != nil || e == nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x, err := c.acquire(addr+uint64(i%1000)*4096, 4096, 1, regs)
		if err != nil || x != e {
			b.Fatal(err)
		}
		_ = c.release(x)
	}
}
