package uring

import (
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
)

// Opcodes (enum io_uring_op).
const (
	OpNop         uint8 = 0
	OpFsync       uint8 = 3
	OpReadFixed   uint8 = 4
	OpWriteFixed  uint8 = 5
	OpPollAdd     uint8 = 6
	OpAsyncCancel uint8 = 14
	OpRead        uint8 = 22
	OpWrite       uint8 = 23
)

// Setup flags (IORING_SETUP_*).
const (
	SetupClamp                uint32 = 1 << 4
	SetupSubmitAll            uint32 = 1 << 7
	SetupCoopTaskrun          uint32 = 1 << 8
	SetupSingleIssuer         uint32 = 1 << 12
	SetupDeferTaskrun         uint32 = 1 << 13
	enterGetEvents            uint32 = 1 << 0
	featSingleMmap            uint32 = 1 << 0
	offSQRing                        = 0
	offCQRing                        = 0x8000000
	offSQEs                          = 0x10000000
	registerBuffers                  = 0
	unregisterBuffers                = 1
	registerProbe                    = 8
	opSupported               uint16 = 1 << 0
	maxEntries                       = 32768
	maxRegisteredBufferLength        = 1 << 30
)

// SQE is struct io_uring_sqe (64 bytes; the unions are named after the
// members te uses).
type SQE struct {
	Opcode      uint8
	Flags       uint8
	IOPrio      uint16
	FD          int32
	Off         uint64 // off / addr2
	Addr        uint64 // addr / splice_off_in
	Len         uint32
	OpFlags     uint32 // rw_flags, poll32_events, cancel_flags, ...
	UserData    uint64
	BufIndex    uint16
	Personality uint16
	FileIndex   int32 // splice_fd_in / file_index
	Addr3       uint64
	_           uint64
}

// CQE is struct io_uring_cqe (16 bytes; te sets up no 32-byte CQEs).
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

// SQRingOffsets is struct io_sqring_offsets.
type SQRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	Resv2                                                           uint64
}

// CQRingOffsets is struct io_cqring_offsets.
type CQRingOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	Resv2                                                           uint64
}

// Params is struct io_uring_params.
type Params struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFD uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  SQRingOffsets
	CQOff                                                                  CQRingOffsets
}

// probeHeader is struct io_uring_probe without its flexible array; probeOp is
// struct io_uring_probe_op.
type probeHeader struct {
	LastOp uint8
	OpsLen uint8
	Resv   uint16
	Resv2  [3]uint32
}

type probeOp struct {
	Op    uint8
	Resv  uint8
	Flags uint16
	Resv2 uint32
}

// Ring is one io_uring instance with its submission and completion queues
// mapped. It is not safe for concurrent use.
type Ring struct {
	fd     int
	params Params

	sqMem, cqMem, sqeMem []byte
	singleMmap           bool // cqMem is sqMem

	sqHead, sqTail *uint32 // shared with the kernel
	sqMask         uint32
	sqEntries      uint32
	sqArray        []uint32
	sqes           []SQE
	tail           uint32 // next SQE to hand out (published by Submit)

	cqHead, cqTail *uint32
	cqMask         uint32
	cqes           []CQE
}

// Disabled reports why io_uring cannot be used on this machine, from
// kernel.io_uring_disabled alone ("" when the sysctl allows it or does not
// exist). Setup finds the other reasons (ENOSYS, seccomp's EPERM).
func Disabled() string {
	b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
	if err != nil {
		return ""
	}
	switch strings.TrimSpace(string(b)) {
	case "2":
		return "kernel.io_uring_disabled=2: io_uring is switched off for every process"
	}
	return ""
}

// Setup creates a ring with room for entries submissions (rounded up to a
// power of two by the kernel, clamped to its maximum). flags are tried first
// and dropped, one attempt, when the kernel does not know them (EINVAL), so a
// caller may ask for SetupSingleIssuer|SetupDeferTaskrun on any kernel.
func Setup(entries uint32, flags uint32) (*Ring, error) {
	if entries == 0 || entries > maxEntries {
		return nil, errs.New(errs.InvalidArgument, "io_uring", "%d entries, want 1..%d", entries, maxEntries)
	}
	fd, p, err := setup(entries, flags|SetupClamp)
	if errors.Is(err, unix.EINVAL) && flags != 0 {
		fd, p, err = setup(entries, SetupClamp)
	}
	if err != nil {
		code := errs.Internal
		if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) || errors.Is(err, unix.EINVAL) {
			code = errs.NotSupported
		} else if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			code = errs.NoMemory
		}
		e := errs.Wrap(code, "io_uring", err, "io_uring_setup(%d)", entries)
		if why := Disabled(); why != "" {
			e = e.WithHint(why)
		}
		return nil, e
	}
	r := &Ring{fd: fd, params: p}
	if err := r.mmap(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func setup(entries, flags uint32) (int, Params, error) {
	p := Params{Flags: flags}
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return -1, p, e
	}
	return int(fd), p, nil
}

func (r *Ring) mmap() error {
	p := &r.params
	sqSize := int(p.SQOff.Array) + int(p.SQEntries)*4
	cqSize := int(p.CQOff.CQEs) + int(p.CQEntries)*int(unsafe.Sizeof(CQE{}))
	single := p.Features&featSingleMmap != 0
	if single {
		sqSize = max(sqSize, cqSize)
	}
	var err error
	prot, fl := unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE
	if r.sqMem, err = unix.Mmap(r.fd, offSQRing, sqSize, prot, fl); err != nil {
		return errs.Wrap(errs.NoMemory, "io_uring", err, "map the submission ring")
	}
	if single {
		r.cqMem, r.singleMmap = r.sqMem, true
	} else if r.cqMem, err = unix.Mmap(r.fd, offCQRing, cqSize, prot, fl); err != nil {
		return errs.Wrap(errs.NoMemory, "io_uring", err, "map the completion ring")
	}
	sqeSize := int(p.SQEntries) * int(unsafe.Sizeof(SQE{}))
	if r.sqeMem, err = unix.Mmap(r.fd, offSQEs, sqeSize, prot, fl); err != nil {
		return errs.Wrap(errs.NoMemory, "io_uring", err, "map the submission entries")
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead, r.sqTail = u32(r.sqMem, p.SQOff.Head), u32(r.sqMem, p.SQOff.Tail)
	r.sqMask, r.sqEntries = *u32(r.sqMem, p.SQOff.RingMask), *u32(r.sqMem, p.SQOff.RingEntries)
	r.sqArray = unsafe.Slice(u32(r.sqMem, p.SQOff.Array), p.SQEntries)
	r.sqes = unsafe.Slice((*SQE)(unsafe.Pointer(&r.sqeMem[0])), p.SQEntries)
	r.cqHead, r.cqTail = u32(r.cqMem, p.CQOff.Head), u32(r.cqMem, p.CQOff.Tail)
	r.cqMask = *u32(r.cqMem, p.CQOff.RingMask)
	r.cqes = unsafe.Slice((*CQE)(unsafe.Pointer(&r.cqMem[p.CQOff.CQEs])), p.CQEntries)
	r.tail = atomic.LoadUint32(r.sqTail)
	return nil
}

// Close unmaps the rings and closes the ring's fd; the kernel cancels what
// is still in flight and waits for it before the fd's release completes.
func (r *Ring) Close() error {
	if r.sqeMem != nil {
		unix.Munmap(r.sqeMem)
	}
	if r.cqMem != nil && !r.singleMmap {
		unix.Munmap(r.cqMem)
	}
	if r.sqMem != nil {
		unix.Munmap(r.sqMem)
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
	return nil
}

// FD is the ring's file descriptor.
func (r *Ring) FD() int { return r.fd }

// Params returns what the kernel answered to io_uring_setup.
func (r *Ring) Params() Params { return r.params }

// Entries is the submission queue's size.
func (r *Ring) Entries() uint32 { return r.sqEntries }

// Space is how many SQEs can be handed out before the next Submit.
func (r *Ring) Space() uint32 { return r.sqEntries - (r.tail - atomic.LoadUint32(r.sqHead)) }

// SQE hands out the next submission entry, zeroed, or nil when the queue is
// full. It is sent by the next Submit.
func (r *Ring) SQE() *SQE {
	if r.Space() == 0 {
		return nil
	}
	i := r.tail & r.sqMask
	r.sqArray[i] = i
	r.tail++
	s := &r.sqes[i]
	*s = SQE{}
	return s
}

// PrepRW fills s for a read or write of n bytes at addr, at file offset off.
func (s *SQE) PrepRW(op uint8, fd int, addr uint64, n uint32, off uint64, userData uint64) {
	s.Opcode, s.FD, s.Addr, s.Len, s.Off, s.UserData = op, int32(fd), addr, n, off, userData
}

// PrepFixed fills s for a read or write on registered buffer index buf (addr
// must lie inside it).
func (s *SQE) PrepFixed(write bool, fd int, addr uint64, n uint32, off uint64, buf uint16, userData uint64) {
	op := OpReadFixed
	if write {
		op = OpWriteFixed
	}
	s.PrepRW(op, fd, addr, n, off, userData)
	s.BufIndex = buf
}

// PrepPoll fills s for a one-shot poll of fd for events (POLLIN, ...).
func (s *SQE) PrepPoll(fd int, events uint32, userData uint64) {
	s.Opcode, s.FD, s.OpFlags, s.UserData = OpPollAdd, int32(fd), events, userData
}

// PrepCancel fills s to cancel the request submitted with user data target.
func (s *SQE) PrepCancel(target, userData uint64) {
	s.Opcode, s.FD, s.Addr, s.UserData = OpAsyncCancel, -1, target, userData
}

// PrepNop fills s with a no-op.
func (s *SQE) PrepNop(userData uint64) { s.Opcode, s.FD, s.UserData = OpNop, -1, userData }

// Submit hands the kernel every SQE taken since the last Submit and, when
// wait > 0, blocks until at least wait completions are ready. It returns the
// number of SQEs the kernel consumed. EINTR is retried; EAGAIN and EBUSY
// (the kernel is short of memory or the completion queue is full) come back
// as an error and the SQEs stay queued for the next call.
func (r *Ring) Submit(wait uint32) (int, error) {
	atomic.StoreUint32(r.sqTail, r.tail)
	toSubmit := r.tail - atomic.LoadUint32(r.sqHead)
	var flags uint32
	if wait > 0 {
		flags = enterGetEvents
	}
	for {
		n, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(wait), uintptr(flags), 0, 0)
		if e == unix.EINTR {
			if wait > 0 && r.Ready() > 0 {
				return int(n), nil
			}
			continue
		}
		if e != 0 {
			return int(n), e
		}
		return int(n), nil
	}
}

// Ready is the number of completions waiting to be reaped.
func (r *Ring) Ready() uint32 { return atomic.LoadUint32(r.cqTail) - *r.cqHead }

// Reap calls fn for every completion ready now, in order, and frees their
// slots; it returns how many there were. fn must not call Reap.
func (r *Ring) Reap(fn func(CQE)) int {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		fn(r.cqes[head&r.cqMask])
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}

// Supports reports whether the kernel knows opcode op (IORING_REGISTER_PROBE;
// kernels before 5.6 do not probe, and report nothing as supported).
func (r *Ring) Supports(op uint8) bool {
	const nops = 64
	var buf [unsafe.Sizeof(probeHeader{}) + nops*unsafe.Sizeof(probeOp{})]byte
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerProbe, uintptr(unsafe.Pointer(&buf[0])), nops, 0, 0)
	if e != 0 {
		return false
	}
	h := (*probeHeader)(unsafe.Pointer(&buf[0]))
	if op > h.LastOp || int(op) >= int(h.OpsLen) || op >= nops {
		return false
	}
	o := (*probeOp)(unsafe.Pointer(&buf[unsafe.Sizeof(probeHeader{})+uintptr(op)*unsafe.Sizeof(probeOp{})]))
	return o.Flags&opSupported != 0
}

// RegisterBuffers registers the ranges as the ring's fixed buffers (index =
// position), so reads and writes into them skip pinning the pages on every
// request. Each range must be memory the Go collector does not own, at most
// 1 GiB. Registration pins the pages (RLIMIT_MEMLOCK without CAP_IPC_LOCK).
func (r *Ring) RegisterBuffers(addrs []uint64, lens []uint64) error {
	if len(addrs) != len(lens) || len(addrs) == 0 || len(addrs) > 1<<14 {
		return errs.New(errs.InvalidArgument, "io_uring", "%d buffers", len(addrs))
	}
	iov := make([]unix.Iovec, len(addrs))
	for i := range addrs {
		if lens[i] == 0 || lens[i] > maxRegisteredBufferLength {
			return errs.New(errs.InvalidArgument, "io_uring", "buffer %d of %d bytes", i, lens[i])
		}
		a := addrs[i]
		iov[i].Base = *(**byte)(unsafe.Pointer(&a)) // foreign memory, not a Go object
		iov[i].SetLen(int(lens[i]))
	}
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), registerBuffers, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), 0, 0)
	if e != 0 {
		return errs.Wrap(errs.NoMemory, "io_uring", e, "register %d buffers", len(addrs))
	}
	return nil
}

// UnregisterBuffers drops the fixed buffers.
func (r *Ring) UnregisterBuffers() error {
	_, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(r.fd), unregisterBuffers, 0, 0, 0, 0)
	if e != 0 {
		return errs.Wrap(errs.Internal, "io_uring", e, "unregister buffers")
	}
	return nil
}

// Errno turns a negative CQE result into an error (nil for res >= 0).
func Errno(res int32) error {
	if res >= 0 {
		return nil
	}
	return unix.Errno(-res)
}
