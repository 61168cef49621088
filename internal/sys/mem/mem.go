// Package mem turns registered addresses into byte slices. It is the one place
// where integers become pointers: the engine only does this for ranges a caller
// registered, so the memory is the caller's and outlives the access.
package mem

import "unsafe"

// Bytes returns the n bytes at addr as a slice. addr must lie in memory the
// caller registered (C or mmap memory, never the Go heap of another goroutine).
func Bytes(addr, n uint64) []byte {
	if n == 0 {
		return nil
	}
	// Reinterpret the integer's storage as a pointer: the address is foreign
	// memory, not a Go object, so there is nothing for the GC to track.
	p := *(*unsafe.Pointer)(unsafe.Pointer(&addr))
	return unsafe.Slice((*byte)(p), n)
}

// Copy copies n bytes from src to dst.
func Copy(dst, src, n uint64) {
	copy(Bytes(dst, n), Bytes(src, n))
}

// Addr returns the address of b's first byte (0 for an empty slice).
func Addr(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}
