// Package file is the transport between memory and storage regions of
// engines in this process: files (or byte ranges of files) registered with
// Engine.RegisterFile and published like memory, with location "file", or
// private (FileOptions.Remote false): then in no descriptor a peer reads,
// and refused to every request but the owner engine's own.
//
// A storage region takes a range of reserved, never-mapped addresses
// (internal/sys/mem.Reserve) as long as its file range, so the registry, the
// descriptors, requests (Remote = region address + offset in the range) and
// every bounds check work unchanged, and no storage address can collide with
// memory. The bytes move through internal/fileio: io_uring rings (O_DIRECT
// when the file system and the request's alignment allow it, buffered
// otherwise), or pread/pwrite threads where io_uring is unavailable or
// parameter file.pool (environment TE_FILE_POOL=1) forces them.
//
// Requests to a storage region have the engine's usual semantics: a task
// ends only when the kernel no longer touches its memory (Cancel sends
// IORING_OP_ASYNC_CANCEL and waits for the I/O), and unregistering a file
// waits for the I/O in flight before it returns. The owner's registry checks
// every access with the buffer's key, so windows work too.
//
// A peer's storage region is reached over tcp, a published one only: the
// owner's tcp server reads or writes the file through the same executor
// (engine/transport/tcp, server_file.go). RDMA into a peer's file is not
// supported: such a request goes to tcp.
//
// GPU memory to and from files is staged through pinned host chunks
// (gpu.Stager) when CUDA loads: a device-to-file write copies a chunk to
// the host and writes it; a file-to-device read reads a chunk and copies it
// up. NVIDIA GPUDirect Storage (cuFile), which would skip the host copy, is
// not used yet: internal/sys/cufile loads libcufile at run time (purego) and
// the transport's stats say whether it loaded (gds_available), so a later
// version can route device requests to it. No machine te is tested on has
// GDS: that binding is untested beyond its clean refusal.
//
// Parameters (Config.Params): file.workers (rings or threads), file.depth
// (I/Os in flight per ring, default 64), file.chunk (largest single I/O,
// default 1 MiB), file.staging (staging memory for servers, default 32 MiB),
// file.pool (1: pread/pwrite threads instead of io_uring), file.fixed (1:
// the host memory registered with the engine becomes the rings' registered
// buffers, so reads and writes into it skip pinning its pages per I/O; off
// by default, since registering pins, and so faults in, whole KV pools and
// counts against RLIMIT_MEMLOCK without CAP_IPC_LOCK; the staging buffers
// the tcp server uses are registered always).
package file
