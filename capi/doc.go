// Command capi is te's C ABI: built with -buildmode=c-shared it is libte.so,
// whose interface is the hand-written include/te.h.
//
// This package holds only the //export wrappers: each converts C arguments,
// looks handles up in the tables of internal/capihelp, calls package engine,
// and turns the result into a return code. Every export recovers panics into
// TE_ERR_INTERNAL and records failures in the calling thread's last error.
// The cgo preamble includes te.h, so the C compiler checks each export
// against its prototype there when the library is built.
package main
