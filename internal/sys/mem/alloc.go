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
