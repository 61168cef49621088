// Package gpu is the one small interface te needs from a GPU runtime: the
// device of a pointer, a device's PCI bus id, pinned host memory, an async
// copy and a stream sync, IPC export and import, and dma-buf export. Each
// vendor package (internal/sys/cuda, internal/sys/hip) implements Driver
// and registers itself under the memory location kind it serves ("cuda",
// "hip"), so callers name a location, never a vendor.
//
// Package runtimes links every vendor package in; package gputest runs one
// test body over every runtime (on the fakes of cudatest and hiptest where
// there is no GPU).
package gpu
