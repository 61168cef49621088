// Package capihelp holds the logic behind te's C ABI (package capi): typed
// handle tables, configuration parsing, the mapping of Go errors to the
// negative codes the C functions return, the bounds on error messages (the
// messages themselves live in C thread-local storage, see capi/entry.c) and
// the machine topology te_local_topology reports.
//
// It is plain Go, so it is tested with the race detector like every other
// package; capi itself only converts C types and calls in here.
package glue
