package rdma

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
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
