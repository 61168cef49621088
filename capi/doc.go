// Command capi is te's C ABI: built with -buildmode=c-shared it is libte.so,
// whose interface is the hand-written include/te.h.
//
// The public te_* functions are thin C functions in entry.c. Each refuses
// the call with TE_ERR_FORKED in a child forked after the library was loaded
// (a pthread_atfork handler marks the child; the Go runtime cannot run
// there), and otherwise calls the Go export of the same name with "tego_"
// for "te_". te_abi_version, te_last_error and te_notify_free are C only.
// The linker version script libte.map keeps te.h's functions the library's
// only dynamic symbols; the build passes it with
// -extldflags=-Wl,--version-script=capi/libte.map.
//
// The Go exports only convert C arguments, look handles up in the tables of
// capi/internal/glue, call package engine, and turn the result into a return
// code. Every export recovers panics into TE_ERR_INTERNAL and records
// failures as the calling thread's last error, in C thread-local storage
// (entry.c), from the thread the call came in on. The cgo preamble includes
// te.h, so the C compiler checks entry.c against its prototypes there.
package main
