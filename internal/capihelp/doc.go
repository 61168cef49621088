// Package capihelp holds the logic behind te's C ABI (package capi): typed
// handle tables, the per-thread last-error store, configuration parsing and
// the mapping of Go errors to the negative codes the C functions return.
//
// It is plain Go, so it is tested with the race detector like every other
// package; capi itself only converts C types and calls in here.
package capihelp
