package mem

import (
	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
)

// Alloc maps n bytes of anonymous memory outside the Go heap: registered
// memory must not move, and Go may move stack-allocated slices.
func Alloc(n int) ([]byte, error) {
	if n <= 0 {
		return nil, errs.New(errs.InvalidArgument, "alloc", "size %d", n)
	}
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, errs.Wrap(errs.NoMemory, "alloc", err, "mmap %d bytes", n)
	}
	return b, nil
}

// Free unmaps memory from Alloc.
func Free(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return unix.Munmap(b)
}

// MustAlloc is Alloc for tests and examples; it panics on failure.
func MustAlloc(n int) []byte {
	b, err := Alloc(n)
	if err != nil {
		panic(err)
	}
	return b
}

// Reserve reserves n bytes of address space that is never mapped to memory
// (PROT_NONE, no swap reserved): storage regions take addresses from it, so
// their addresses collide with no memory and any CPU access faults at once
// instead of reading something else.
func Reserve(n uint64) (uint64, error) {
	if n == 0 || n > 1<<46 {
		return 0, errs.New(errs.InvalidArgument, "reserve", "size %d", n)
	}
	p, _, e := unix.Syscall6(unix.SYS_MMAP, 0, uintptr(n), unix.PROT_NONE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, ^uintptr(0), 0)
	if e != 0 {
		return 0, errs.Wrap(errs.NoMemory, "reserve", e, "reserve %d bytes of address space", n)
	}
	return uint64(p), nil
}

// Unreserve releases a range from Reserve.
func Unreserve(addr, n uint64) error {
	if _, _, e := unix.Syscall(unix.SYS_MUNMAP, uintptr(addr), uintptr(n), 0); e != 0 {
		return errs.Wrap(errs.Internal, "reserve", e, "unmap [%#x,+%d)", addr, n)
	}
	return nil
}
