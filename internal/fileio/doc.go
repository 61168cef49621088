// Package fileio moves bytes between memory and files for te's storage
// segments: an asynchronous executor with the completion semantics of a
// transport.
//
// An Op is one read (file -> memory) or write (memory -> file) of a range of
// a File. The executor cuts an op into I/Os of at most Config.Chunk bytes,
// keeps up to Config.Depth of them in flight per worker, and calls the op's
// Done exactly once, after the kernel has finished with every one of its
// I/Os: from then on nothing touches the op's memory, so a Done is a fence
// (a task built on it may end, its memory may be reused). Cancel ends an op
// early on the same terms: its queued I/Os are dropped, those in the kernel
// are asked to stop (IORING_OP_ASYNC_CANCEL) and waited for.
//
// Two back ends, one behaviour:
//
//   - io_uring (internal/sys/uring): one ring per worker goroutine, which
//     keeps its OS thread and is the ring's single issuer. Callers hand ops
//     to a worker through a queue and wake it with an eventfd the ring
//     polls, so a sleeping worker is woken by its ring and many small ops
//     go to the kernel in one io_uring_enter. The executor's staging buffers
//     are registered with every ring, so I/O on them (the tcp server's file
//     path) uses READ_FIXED/WRITE_FIXED.
//   - a pool of threads doing pread/pwrite, for kernels and containers where
//     io_uring is missing or switched off (io_uring_setup fails with ENOSYS
//     or EPERM, kernel.io_uring_disabled), or when Config.ForcePool (engine
//     parameter file.pool, environment TE_FILE_POOL=1) asks for it. New logs
//     which one it uses and why.
//
// Files are opened twice: with O_DIRECT where the file system takes it, and
// without. An I/O whose memory address, file offset and length meet the
// file's direct-I/O alignment (statx STATX_DIOALIGN, else the logical block
// size) goes through the O_DIRECT descriptor and skips the page cache; any
// other goes through the buffered one, so a misaligned request is served
// correctly rather than refused, and Stats counts how many did. The kernel
// keeps the two coherent (a direct read first writes back dirty cached
// pages of its range).
//
// Short transfers are continued where they stopped; a read that finds the
// end of the file inside its File's range (the file was truncated or removed
// and cut) fails with errs.IO, a full file system with errs.NoSpace.
package fileio
