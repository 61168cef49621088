package fileio

import (
	"errors"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Defaults and limits of Config.
const (
	DefaultDepth   = 64
	MaxDepth       = 4096
	DefaultChunk   = 1 << 20
	MinChunk       = 4 << 10
	MaxChunk       = 64 << 20
	DefaultStaging = 32 << 20
	MaxWorkers     = 64
	// unknownAlign is the direct-I/O alignment assumed when the kernel
	// does not say (statx without STATX_DIOALIGN, before Linux 6.1): the
	// page size meets every logical block size in use.
	unknownAlign = 4096
)

// Config sets up an Executor. Zero values take the defaults.
type Config struct {
	// Workers is the number of rings (io_uring) or threads (pool).
	// Default: defaultRings, or 4 threads per core for the pool (capped
	// at 16), since each pool thread holds one I/O.
	Workers int
	// Depth is how many I/Os one ring keeps in the kernel (default 64):
	// enough to keep an NVMe device busy from one ring.
	Depth int
	// Chunk is the largest single I/O; a larger op is cut into chunks
	// that run in parallel (default 1 MiB). It is also the size of a
	// staging buffer.
	Chunk uint64
	// Staging is the memory set aside for staging buffers (TakeStage),
	// registered with every ring; 0 takes DefaultStaging, negative none.
	Staging int64
	// ForcePool skips io_uring and uses pread/pwrite threads.
	ForcePool bool
	// Logf receives one line saying which back end runs and why.
	Logf func(format string, args ...any)
}

func (c *Config) fill() error {
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.Chunk == 0 {
		c.Chunk = DefaultChunk
	}
	if c.Staging == 0 {
		c.Staging = DefaultStaging
	}
	if c.Depth < 1 || c.Depth > MaxDepth {
		return errs.New(errs.InvalidArgument, "fileio", "depth %d outside 1..%d", c.Depth, MaxDepth)
	}
	if c.Chunk < MinChunk || c.Chunk > MaxChunk || c.Chunk%unknownAlign != 0 {
		return errs.New(errs.InvalidArgument, "fileio", "chunk %d: want a multiple of 4 KiB from 4 KiB to 64 MiB", c.Chunk)
	}
	if c.Workers < 0 || c.Workers > MaxWorkers {
		return errs.New(errs.InvalidArgument, "fileio", "workers %d outside 1..%d", c.Workers, MaxWorkers)
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
	return nil
}

// Stats counts what an executor did.
type Stats struct {
	Mode        string `json:"mode"` // "io_uring" or "pool"
	Ops         uint64 `json:"ops"`
	ReadBytes   uint64 `json:"read_bytes"`
	WriteBytes  uint64 `json:"write_bytes"`
	DirectIOs   uint64 `json:"direct_ios"`   // through the O_DIRECT descriptor
	BufferedIOs uint64 `json:"buffered_ios"` // misaligned, or the file system has no O_DIRECT
	FixedIOs    uint64 `json:"fixed_ios"`    // on registered (fixed) buffers
	Split       uint64 `json:"split"`        // ops cut into more than one I/O
	Short       uint64 `json:"short"`        // short transfers continued
	Failed      uint64 `json:"failed"`
	Canceled    uint64 `json:"canceled"`
}

type counters struct {
	ops, rd, wr, direct, buffered, fixed, split, short, failed, canceled atomic.Uint64
}

// backend is one of the two ways ops reach the kernel.
type backend interface {
	submit(ops []*Op)
	cancel(ops []*Op)
	close()
	setFixed(ranges []fixedRange) error
}

// Executor runs file I/O. It is safe for concurrent use.
type Executor struct {
	cfg  Config
	mode string
	be   backend
	st   counters

	stage     []byte // staging buffers, one mapping (registered with the rings)
	stageFree chan uint64
	// stageMu guards lent and the release of stage: buffers lent to a
	// server (tcp) may come back after Close, so the mapping goes with
	// the last of them.
	stageMu   sync.Mutex
	lent      int
	stageBase uint64 // where stage was mapped (kept after it is unmapped)
	stageLen  uint64
	closeOnce sync.Once
	closed    atomic.Bool
}

// New starts an executor: io_uring rings unless the kernel refuses them (or
// cfg.ForcePool), else the pread/pwrite pool.
func New(cfg Config) (*Executor, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	x := &Executor{cfg: cfg}
	if cfg.Staging > 0 {
		n := max(1, uint64(cfg.Staging)/cfg.Chunk)
		b, err := mem.Alloc(int(n * cfg.Chunk))
		if err != nil {
			return nil, err
		}
		x.stage, x.stageBase, x.stageLen = b, mem.Addr(b), uint64(len(b))
		x.stageFree = make(chan uint64, n)
		for i := uint64(0); i < n; i++ {
			x.stageFree <- mem.Addr(b) + i*cfg.Chunk
		}
	}
	why := "forced (file.pool / TE_FILE_POOL)"
	if !cfg.ForcePool {
		w := cfg.Workers
		if w == 0 {
			w = defaultRings(runtime.GOMAXPROCS(0))
		}
		rb, err := newRings(x, w)
		if err == nil {
			x.mode, x.be = "io_uring", rb
			cfg.Logf("te: file I/O through io_uring: %d rings of depth %d, chunks of %d bytes", w, cfg.Depth, cfg.Chunk)
			return x, nil
		}
		why = err.Error()
	}
	w := cfg.Workers
	if w == 0 {
		w = min(16, 4*runtime.NumCPU())
	}
	x.mode, x.be = "pool", newPool(x, w)
	cfg.Logf("te: file I/O through %d pread/pwrite threads, not io_uring: %s", w, why)
	return x, nil
}

// defaultRings is the number of rings on a machine of procs cores: one per
// four, one or two. Each ring's worker is an OS thread of its own that the
// submitters wake and that wakes them: on two cores two rings halved
// small-block IOPS against one (47-48K against 89-92K random 4 KiB reads at
// depth 32, bench/README.md), and no block size did better with two.
func defaultRings(procs int) int { return min(2, max(1, procs/4)) }

// Mode is "io_uring" or "pool".
func (x *Executor) Mode() string { return x.mode }

// Chunk is the largest single I/O, and the size of a staging buffer.
func (x *Executor) Chunk() uint64 { return x.cfg.Chunk }

// Stats returns the counters.
func (x *Executor) Stats() Stats {
	c := &x.st
	return Stats{Mode: x.mode, Ops: c.ops.Load(), ReadBytes: c.rd.Load(), WriteBytes: c.wr.Load(), DirectIOs: c.direct.Load(),
		BufferedIOs: c.buffered.Load(), FixedIOs: c.fixed.Load(), Split: c.split.Load(), Short: c.short.Load(),
		Failed: c.failed.Load(), Canceled: c.canceled.Load()}
}

// Close fails the ops still queued (Closed), waits for those in the kernel,
// and releases the rings or threads and the staging memory. Files should be
// closed first; their descriptors stay open until then.
func (x *Executor) Close() error {
	x.closeOnce.Do(func() {
		x.closed.Store(true)
		x.be.close()
		x.stageMu.Lock()
		if x.stage != nil && x.lent == 0 {
			mem.Free(x.stage)
			x.stage = nil
		}
		x.stageMu.Unlock()
	})
	return nil
}

// TakeStage returns the address of a free staging buffer of Chunk bytes
// (aligned for direct I/O, registered with the rings), waiting for one while
// all are taken, until abort is closed. ok is false when the executor has
// none, is closed, or abort fired.
func (x *Executor) TakeStage(abort <-chan struct{}) (addr uint64, ok bool) {
	if x.stageFree == nil || x.closed.Load() {
		return 0, false
	}
	var a uint64
	select {
	case a = <-x.stageFree:
	default:
		select {
		case a = <-x.stageFree:
		case <-abort:
			return 0, false
		}
	}
	x.stageMu.Lock()
	defer x.stageMu.Unlock()
	if x.stage == nil { // closed meanwhile, and the mapping is gone
		return 0, false
	}
	x.lent++
	return a, true
}

// PutStage returns a staging buffer once no I/O uses it. After Close the
// last one returned unmaps the staging memory.
func (x *Executor) PutStage(addr uint64) {
	x.stageMu.Lock()
	defer x.stageMu.Unlock()
	x.lent--
	x.stageFree <- addr
	if x.closed.Load() && x.lent == 0 && x.stage != nil {
		mem.Free(x.stage)
		x.stage = nil
	}
}

// Op is one read or write between memory and a File's range.
type Op struct {
	Write bool   // memory -> file; false: file -> memory
	File  *File  // the file
	Off   uint64 // offset inside the File's range
	Addr  uint64 // memory: C or mmap memory the caller keeps until Done
	Len   uint64
	// Done is called exactly once, from an executor goroutine (or the
	// submitting one, for an op refused at once), when no I/O of the op is
	// in the kernel any more. err is nil when every byte moved. It must
	// not block.
	Done func(op *Op, err error)
	// Ctx is the caller's; the executor does not look at it.
	Ctx any

	// State of a running op, owned by its worker (ring) or under the
	// pool's lock.
	issued   uint64 // bytes handed out to I/Os
	moved    uint64 // bytes the kernel moved
	inflight int    // I/Os in the kernel (or in a pool thread)
	err      error
	canceled bool
}

// Submit starts ops. An op that cannot run (closed file or executor, range
// outside the file's, a write to a read-only file) is completed at once
// with the reason; the others complete through Done later.
func (x *Executor) Submit(ops ...*Op) {
	ok := ops[:0:0]
	for _, op := range ops {
		if err := x.check(op); err != nil {
			x.st.failed.Add(1)
			op.Done(op, err)
			continue
		}
		op.issued, op.moved, op.inflight, op.err, op.canceled = 0, 0, 0, nil, false
		x.st.ops.Add(1)
		if op.Len > x.cfg.Chunk {
			x.st.split.Add(1)
		}
		ok = append(ok, op)
	}
	if len(ok) > 0 {
		x.be.submit(ok)
	}
}

func (x *Executor) check(op *Op) error {
	f := op.File
	if x.closed.Load() {
		return errs.New(errs.Closed, "file", "executor closed")
	}
	if f == nil || op.Len == 0 || op.Off+op.Len < op.Off || op.Off+op.Len > f.size {
		size := uint64(0)
		if f != nil {
			size = f.size
		}
		return errs.New(errs.InvalidArgument, "file", "[%d,+%d) is not inside a file range of %d bytes", op.Off, op.Len, size)
	}
	if op.Write && f.readOnly {
		return errs.New(errs.AccessDenied, "file", "%s is open read-only", f.path)
	}
	if !f.retain() {
		return errs.New(errs.Closed, "file", "%s is closed", f.path)
	}
	return nil
}

// Cancel asks the executor to end ops early: each still running ends with
// errs.Canceled (or its real outcome, had it finished) once none of its
// I/Os is in the kernel. Cancel does not wait for that.
func (x *Executor) Cancel(ops ...*Op) {
	if len(ops) > 0 {
		x.be.cancel(ops)
	}
}

// finish ends op: called by the back end once nothing of it is in flight.
func (x *Executor) finish(op *Op) {
	err := op.err
	if err == nil && op.moved < op.Len {
		err = errs.New(errs.Canceled, "file", "canceled")
	}
	switch {
	case err == nil && op.Write:
		x.st.wr.Add(op.Len)
	case err == nil:
		x.st.rd.Add(op.Len)
	case errs.CodeOf(err) == errs.Canceled:
		x.st.canceled.Add(1)
	default:
		x.st.failed.Add(1)
	}
	f := op.File
	op.Done(op, err)
	f.release() // after Done: File.Close returns once every op has ended
}

// ioError turns a failed I/O into te's error: the task reports it.
func ioError(op *Op, off uint64, e error) error {
	verb := "read"
	if op.Write {
		verb = "write"
	}
	switch {
	case errors.Is(e, unix.ECANCELED) || errors.Is(e, unix.EINTR):
		return errs.Wrap(errs.Canceled, "file", e, "%s canceled", verb)
	case errors.Is(e, unix.ENOSPC) || errors.Is(e, unix.EDQUOT):
		return errs.Wrap(errs.NoSpace, "file", e, "%s of %s at offset %d", verb, op.File.path, off)
	case errors.Is(e, unix.EFBIG):
		return errs.Wrap(errs.NoSpace, "file", e, "%s of %s at offset %d: over the file size limit", verb, op.File.path, off)
	case errors.Is(e, unix.EBADF) || errors.Is(e, unix.EACCES) || errors.Is(e, unix.EPERM) || errors.Is(e, unix.EROFS):
		return errs.Wrap(errs.AccessDenied, "file", e, "%s of %s at offset %d", verb, op.File.path, off)
	case errors.Is(e, unix.EFAULT):
		return errs.Wrap(errs.InvalidArgument, "file", e, "%s of %s: memory at the request's address is not mapped", verb, op.File.path)
	}
	return errs.Wrap(errs.IO, "file", e, "%s of %s at offset %d", verb, op.File.path, off)
}

// errShort is a read that found the end of the file inside the range.
func errShort(op *Op, off uint64) error {
	return errs.New(errs.IO, "file", "read of %s at offset %d found the end of the file: it is shorter than its registered range "+
		"(truncated or replaced?)", op.File.path, off)
}

// File is a registered range of a file, open for the executor.
type File struct {
	x        *Executor
	path     string
	dfd, bfd int    // O_DIRECT descriptor (-1: none) and buffered one
	base     uint64 // file offset of the range
	size     uint64
	memAlign uint64 // direct I/O alignment of memory addresses
	offAlign uint64 // ... of file offsets and lengths
	readOnly bool

	refs     atomic.Int64 // ops running, plus one while open
	closing  atomic.Bool
	closeMu  sync.Mutex
	closed   bool
	idle     chan struct{} // closed when refs reaches 0 after Close began
	idleOnce sync.Once
}

// OpenOptions tune Open and OpenFD.
type OpenOptions struct {
	// Create makes the file (mode 0600) if it does not exist and extends
	// it to hold the range if it is shorter. Without it the file must
	// hold the range already.
	Create bool
	// NoDirect opens the file without O_DIRECT even where it works.
	NoDirect bool
	// ReadOnly opens it for reading only (writes are refused).
	ReadOnly bool
}

// Open opens path and registers [base, base+size) of it. size 0 means up to
// the current end of the file.
func (x *Executor) Open(path string, base, size uint64, o OpenOptions) (*File, error) {
	if path == "" {
		return nil, errs.New(errs.InvalidArgument, "register file", "empty path")
	}
	acc := unix.O_RDWR
	if o.ReadOnly {
		acc = unix.O_RDONLY
	}
	fl := acc | unix.O_CLOEXEC
	if o.Create {
		// A file te creates is never reached through a symbolic link: a
		// link planted at the path would make te create or grow the
		// file it points at.
		fl |= unix.O_CREAT | unix.O_NOFOLLOW
	}
	bfd, err := unix.Open(path, fl, 0o600)
	if err != nil && o.Create && errors.Is(err, unix.ELOOP) {
		return nil, errs.Wrap(errs.AccessDenied, "register file", err, "%s is a symbolic link; a file registered with create is opened without following links", path).
			WithHint("register the link's target by its own path")
	}
	if err != nil && !o.ReadOnly && !o.Create && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.EROFS)) {
		acc, o.ReadOnly = unix.O_RDONLY, true
		bfd, err = unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		code := errs.InvalidArgument
		if errors.Is(err, unix.ENOENT) {
			code = errs.NotFound
		} else if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EROFS) {
			code = errs.AccessDenied
		}
		return nil, errs.Wrap(code, "register file", err, "open %s", path)
	}
	f, err := x.setup(path, bfd, acc, base, size, o)
	if err != nil {
		unix.Close(bfd)
		return nil, err
	}
	return f, nil
}

// OpenFD registers [base, base+size) of the file open as fd. The caller keeps
// fd (the executor works on duplicates) and may close it.
func (x *Executor) OpenFD(fd int, base, size uint64, o OpenOptions) (*File, error) {
	if fd < 0 {
		return nil, errs.New(errs.InvalidArgument, "register file", "fd %d", fd)
	}
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "register file", err, "fd %d", fd)
	}
	acc := fl & unix.O_ACCMODE
	if acc == unix.O_WRONLY {
		return nil, errs.New(errs.InvalidArgument, "register file", "fd %d is open write-only; reads need O_RDWR", fd)
	}
	if acc == unix.O_RDONLY {
		o.ReadOnly = true
	}
	bfd, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, errs.Wrap(errs.NoMemory, "register file", err, "dup fd %d", fd)
	}
	appends := fl&unix.O_APPEND != 0 && acc != unix.O_RDONLY
	if fl&unix.O_DIRECT != 0 || appends {
		// The caller's description is direct (a buffered twin for
		// misaligned requests is needed) or appending (Linux's pwrite
		// then ignores the offset and every write lands at the end):
		// the executor's own description comes from reopening it.
		ndfd := bfd
		bfd, err = unix.Open("/proc/self/fd/"+strconv.Itoa(ndfd), acc|unix.O_CLOEXEC, 0)
		unix.Close(ndfd)
		if err != nil {
			if appends {
				return nil, errs.Wrap(errs.InvalidArgument, "register file", err,
					"fd %d is open with O_APPEND, so writes would land at the end of the file, and it cannot be reopened without", fd).
					WithHint("open the file without O_APPEND, or register it by path")
			}
			return nil, errs.Wrap(errs.NotSupported, "register file", err, "reopen fd %d without O_DIRECT", fd)
		}
	}
	path := "/proc/self/fd/" + strconv.Itoa(bfd)
	if p, err := os.Readlink(path); err == nil {
		path = p
	}
	f, err := x.setup(path, bfd, acc, base, size, o)
	if err != nil {
		unix.Close(bfd)
		return nil, err
	}
	return f, nil
}

// setup checks the range, extends a created file, and opens the O_DIRECT
// twin where the file system allows it.
func (x *Executor) setup(path string, bfd, acc int, base, size uint64, o OpenOptions) (*File, error) {
	var st unix.Stat_t
	if err := unix.Fstat(bfd, &st); err != nil {
		return nil, errs.Wrap(errs.InvalidArgument, "register file", err, "stat %s", path)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG && st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil, errs.New(errs.InvalidArgument, "register file", "%s is not a regular file or block device", path)
	}
	cur := uint64(st.Size)
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		if n, err := unix.IoctlGetInt(bfd, unix.BLKGETSIZE64); err == nil {
			cur = uint64(n)
		}
	}
	if size == 0 {
		if cur <= base {
			return nil, errs.New(errs.InvalidArgument, "register file", "%s is %d bytes: nothing from offset %d", path, cur, base)
		}
		size = cur - base
	}
	if base+size < base || int64(base+size) < 0 {
		return nil, errs.New(errs.InvalidArgument, "register file", "range [%d,+%d) overflows", base, size)
	}
	if cur < base+size {
		if !o.Create || o.ReadOnly {
			return nil, errs.New(errs.InvalidArgument, "register file", "%s is %d bytes, shorter than the range [%d,+%d)", path, cur, base, size)
		}
		if err := unix.Ftruncate(bfd, int64(base+size)); err != nil {
			return nil, ioError(&Op{Write: true, File: &File{path: path}}, base+size, err)
		}
	}
	f := &File{x: x, path: path, dfd: -1, bfd: bfd, base: base, size: size, readOnly: o.ReadOnly,
		memAlign: unknownAlign, offAlign: unknownAlign, idle: make(chan struct{})}
	f.refs.Store(1)
	if !o.NoDirect {
		f.openDirect(acc)
	}
	return f, nil
}

func (f *File) openDirect(acc int) {
	dfd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(f.bfd), acc|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return // EINVAL: the file system has no O_DIRECT (tmpfs, overlayfs)
	}
	var sx unix.Statx_t
	if err := unix.Statx(dfd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &sx); err == nil && sx.Mask&unix.STATX_DIOALIGN != 0 {
		if sx.Dio_offset_align == 0 {
			unix.Close(dfd) // the kernel says: no direct I/O on this file
			return
		}
		f.memAlign, f.offAlign = uint64(max(sx.Dio_mem_align, 1)), uint64(sx.Dio_offset_align)
	}
	f.dfd = dfd
}

// Path is the file's path (as the kernel names it for an fd).
func (f *File) Path() string { return f.path }

// Size is the length of the registered range.
func (f *File) Size() uint64 { return f.size }

// Base is the file offset the range starts at.
func (f *File) Base() uint64 { return f.base }

// Direct reports whether aligned I/O bypasses the page cache.
func (f *File) Direct() bool { return f.dfd >= 0 }

// Align is the alignment an I/O's memory address, file offset and length
// need to go direct (1 for a buffered-only file).
func (f *File) Align() (memAlign, offAlign uint64) {
	if f.dfd < 0 {
		return 1, 1
	}
	return f.memAlign, f.offAlign
}

// ReadOnly reports whether writes are refused.
func (f *File) ReadOnly() bool { return f.readOnly }

// fdFor picks the descriptor for one I/O: direct when it is aligned.
func (f *File) fdFor(addr, off, n uint64) (fd int, direct bool) {
	if f.dfd >= 0 && addr%f.memAlign == 0 && off%f.offAlign == 0 && n%f.offAlign == 0 {
		return f.dfd, true
	}
	return f.bfd, false
}

func (f *File) retain() bool {
	f.refs.Add(1)
	if f.closing.Load() {
		f.release()
		return false
	}
	return true
}

func (f *File) release() {
	if f.refs.Add(-1) == 0 && f.closing.Load() {
		f.idleOnce.Do(func() { close(f.idle) })
	}
}

// Close refuses new ops at once, waits for the running ones to complete, and
// closes the descriptors. A second Close returns nil.
func (f *File) Close() error {
	f.closeMu.Lock()
	defer f.closeMu.Unlock()
	if f.closed {
		return nil
	}
	f.closing.Store(true)
	f.release() // the open reference
	<-f.idle
	if f.dfd >= 0 {
		unix.Close(f.dfd)
	}
	unix.Close(f.bfd)
	f.closed = true
	return nil
}

// Busy reports whether ops on f are running.
func (f *File) Busy() bool {
	n := f.refs.Load()
	if !f.closing.Load() {
		n--
	}
	return n > 0
}

// Executor is the executor the file is open on.
func (f *File) Executor() *Executor { return f.x }

// StageCount is the number of staging buffers.
func (x *Executor) StageCount() int { return cap(x.stageFree) }

// SetFixed makes ranges of memory (C or mmap memory that stays mapped until
// a later SetFixed drops it) the rings' registered buffers, beside the
// staging memory: I/O into them skips pinning the pages on every request.
// Registration pins the ranges' pages at once (the whole range is faulted
// in) and counts against RLIMIT_MEMLOCK without CAP_IPC_LOCK. It returns
// once every ring uses the new set; I/O on a range dropped from the set has
// ended by then. On the pool back end it does nothing. An error (the kernel
// refused) leaves I/O plain, as before, and correct.
func (x *Executor) SetFixed(ranges [][2]uint64) error {
	rs := make([]fixedRange, 0, len(ranges))
	for _, r := range ranges {
		if r[1] == 0 || r[0]+r[1] < r[0] {
			return errs.New(errs.InvalidArgument, "fileio", "range [%#x,+%d)", r[0], r[1])
		}
		rs = append(rs, fixedRange{r[0], r[1]})
	}
	if x.closed.Load() {
		return errs.New(errs.Closed, "fileio", "executor closed")
	}
	return x.be.setFixed(rs)
}
