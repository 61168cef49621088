// Package cuda binds the parts of the CUDA driver API (libcuda.so.1) that te
// needs to move GPU memory: initialisation, devices and primary contexts,
// pointer attributes, copies between host and device (synchronous and on
// streams), events, pinned host memory and legacy IPC memory handles.
//
// The library is loaded at run time with purego, so te builds and runs on
// machines without a GPU or a driver: Load returns a NotSupported error that
// says why CUDA cannot be used (library missing, a symbol missing, no device)
// instead of failing to link. TE_CUDA_LIBRARY names another file to load (a
// driver in a non-standard place, or the fake driver the tests build).
//
// Many driver entry points are versioned: the header maps cuMemcpyHtoD to
// cuMemcpyHtoD_v2, cuIpcOpenMemHandle to cuIpcOpenMemHandle_v2 and so on, and
// a dlsym of the plain name finds the old ABI. Open binds the versioned names
// cuda.h selects (Symbols lists them), falling back to the plain name only where
// the old and new forms share one signature.
//
// Context rules: driver calls act on the calling OS thread's current context.
// Goroutines move between threads, and when te runs inside a C or Python
// process a Go call may run on the host application's own thread, whose
// current context belongs to the application. So every call that needs a
// context goes through Lib.With, which locks the goroutine to its thread, makes
// the context current, and restores the thread's previous context afterwards.
//
// Driver wraps Lib as a gpu.Driver; staging GPU memory through pinned host memory
// (gpu.Stager) is vendor-neutral and lives in package gpu.
//
// No Go pointer crosses into the driver: out-parameters live in a small pool
// of slots in memory from mmap.
package cuda
