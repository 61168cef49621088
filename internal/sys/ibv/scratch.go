package ibv

import (
	"unsafe"

	"github.com/tecache/te/internal/sys/mem"
)

// Scratch is memory outside the Go heap for structs the library reads or
// writes: attribute structs, work requests, completions, out-parameters.
type Scratch struct {
	b []byte
}

// NewScratch maps n bytes (rounded up to a page by the kernel).
func NewScratch(n int) (*Scratch, error) {
	b, err := mem.Alloc(n)
	if err != nil {
		return nil, err
	}
	return &Scratch{b: b}, nil
}

// Addr returns the address of byte off.
func (s *Scratch) Addr(off uintptr) uintptr { return uintptr(mem.Addr(s.b)) + off }

// Clear zeroes the first n bytes.
func (s *Scratch) Clear(n uintptr) { clear(s.b[:n]) }

// Free unmaps the memory; s must not be used afterwards.
func (s *Scratch) Free() {
	if s != nil && s.b != nil {
		_ = mem.Free(s.b)
		s.b = nil
	}
}

// at returns a *T over the C memory at addr.
func at[T any](addr uintptr) *T { return (*T)(cptr(addr)) }

// cptr turns the address of C memory into an unsafe.Pointer. The integer's
// storage is reinterpreted, as in package mem: the memory is not a Go
// object, so there is nothing for the garbage collector to track.
func cptr(addr uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&addr)) }

func loadPtr(addr uintptr) uintptr { return *at[uintptr](addr) }
