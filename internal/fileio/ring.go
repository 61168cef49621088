package fileio

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/uring"
)

// User data of the ring's own submissions; an I/O's is its slot index + slotBase.
const (
	udWake   = 1
	udCancel = 2
	slotBase = 16
	// maxRetries bounds how often one I/O is resubmitted after EAGAIN or
	// EINTR before it fails.
	maxRetries = 8
)

// rings is the io_uring back end: ops go to the rings round-robin.
type rings struct {
	x    *Executor
	ws   []*ringWorker
	next atomic.Uint32
}

// ringWorker owns one ring on a locked OS thread: it alone submits to and
// reaps from it (the ring is set up single-issuer).
type ringWorker struct {
	x   *Executor
	idx int
	efd int // eventfd the ring polls: written to wake the worker

	mu      sync.Mutex
	queue   []*Op // submitted, not yet taken by the worker
	cancels []*Op
	update  *fixedUpdate // a new set of fixed buffers to register
	closing bool
	armed   atomic.Bool // an eventfd write is pending: later submitters need not write
	exited  chan struct{}

	// Owned by the worker goroutine.
	ring     *uring.Ring
	pending  []*Op // taken, with bytes not yet handed to I/Os
	slots    []slot
	free     []int
	busy     int          // slots in the kernel (or waiting in resubmit)
	resubmit []int        // slots whose I/O goes again (short transfer, EAGAIN)
	fixed    bool         // the ring has a fixed-buffer table
	tab      []fixedRange // the table: staging first, then SetFixed's ranges
	pendingF *fixedUpdate // waits for fixedIn to reach 0
	fixedIn  int          // I/Os in the kernel on fixed buffers
	polling  bool
}

// slot is one I/O in the kernel.
type slot struct {
	fixed   bool // its I/O in the kernel uses a fixed buffer
	op      *Op
	addr    uint64
	off     uint64 // offset in the File's range
	n       uint64
	retries int
	cancel  bool // an async cancel was sent for it
}

func newRings(x *Executor, n int) (*rings, error) {
	if why := uring.Disabled(); why != "" {
		return nil, errs.New(errs.NotSupported, "fileio", "%s", why)
	}
	rb := &rings{x: x}
	for i := 0; i < n; i++ {
		w, err := startRing(x, i)
		if err != nil {
			rb.close()
			return nil, err
		}
		rb.ws = append(rb.ws, w)
	}
	return rb, nil
}

// startRing starts a worker and waits for its ring: a ring is single-issuer,
// so the thread that sets it up is the one that uses it.
func startRing(x *Executor, idx int) (*ringWorker, error) {
	efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, errs.Wrap(errs.NoMemory, "fileio", err, "eventfd")
	}
	w := &ringWorker{x: x, idx: idx, efd: efd, exited: make(chan struct{})}
	ready := make(chan error, 1)
	go w.run(ready)
	if err := <-ready; err != nil {
		<-w.exited
		unix.Close(efd)
		return nil, err
	}
	return w, nil
}

func (rb *rings) submit(ops []*Op) {
	n := uint32(len(rb.ws))
	if len(ops) == 1 || n == 1 {
		w := rb.ws[rb.next.Add(1)%n]
		w.push(ops, false)
		return
	}
	// Spread a batch: op i to ring (start+i) mod n, one push per ring.
	start := rb.next.Add(uint32(len(ops)))
	groups := make([][]*Op, n)
	for i, op := range ops {
		k := (start + uint32(i)) % n
		groups[k] = append(groups[k], op)
	}
	for k, g := range groups {
		if len(g) > 0 {
			rb.ws[k].push(g, false)
		}
	}
}

// cancel sends each op's cancel to the ring it went to. An op not yet
// taken by its worker carries no ring index yet: every ring is asked.
func (rb *rings) cancel(ops []*Op) {
	for _, w := range rb.ws {
		w.push(ops, true)
	}
}

func (rb *rings) close() {
	for _, w := range rb.ws {
		w.mu.Lock()
		w.closing = true
		w.mu.Unlock()
		w.wake()
	}
	for _, w := range rb.ws {
		<-w.exited
		unix.Close(w.efd)
	}
}

func (w *ringWorker) push(ops []*Op, cancel bool) {
	w.mu.Lock()
	if w.closing && !cancel {
		w.mu.Unlock()
		for _, op := range ops {
			op.err = errs.New(errs.Closed, "file", "executor closed")
			w.x.finish(op)
		}
		return
	}
	if cancel {
		w.cancels = append(w.cancels, ops...)
	} else {
		w.queue = append(w.queue, ops...)
	}
	w.mu.Unlock()
	w.wake()
}

// wake writes the eventfd unless a write is already pending: the worker
// clears armed before it looks at the queue, so nothing queued is missed.
func (w *ringWorker) wake() {
	if w.armed.CompareAndSwap(false, true) {
		var one = [8]byte{1}
		unix.Write(w.efd, one[:])
	}
}

func (w *ringWorker) run(ready chan<- error) {
	defer close(w.exited)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	x := w.x
	depth := uint32(x.cfg.Depth)
	// Room for every I/O plus the eventfd poll and a cancel per I/O.
	r, err := uring.Setup(2*depth+2, uring.SetupSingleIssuer|uring.SetupDeferTaskrun)
	if err == nil && (!r.Supports(uring.OpRead) || !r.Supports(uring.OpWrite)) {
		r.Close()
		err = errs.New(errs.NotSupported, "fileio", "the kernel's io_uring has no IORING_OP_READ/WRITE (Linux 5.6+)")
	}
	if err != nil {
		ready <- err
		return
	}
	defer r.Close()
	w.ring = r
	w.slots = make([]slot, depth)
	w.free = make([]int, depth)
	for i := range w.free {
		w.free[i] = int(depth) - 1 - i
	}
	w.setTable(nil)
	ready <- nil
	w.loop()
}

func (w *ringWorker) loop() {
	for {
		if !w.polling {
			if s := w.ring.SQE(); s != nil {
				s.PrepPoll(w.efd, unix.POLLIN, udWake)
				w.polling = true
			}
		}
		closing := w.take()
		if u := w.pendingF; u != nil && w.fixedIn == 0 {
			// No I/O uses the old table: swap it without waiting.
			w.pendingF = nil
			u.done <- w.setTable(u.ranges)
		}
		w.fill()
		if closing && w.busy == 0 && len(w.pending) == 0 {
			return
		}
		if _, err := w.ring.Submit(1); err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) {
				// The kernel is short of memory: back off, the
				// SQEs stay queued.
				time.Sleep(50 * time.Microsecond)
			} else {
				w.failAll(err)
				return
			}
		}
		// Pushes made while the worker reaps (often by the Done it
		// calls) need no eventfd write: take runs next and sees them.
		w.armed.Store(true)
		w.ring.Reap(w.complete)
	}
}

// take moves newly submitted ops and cancels into the worker's own state.
func (w *ringWorker) take() (closing bool) {
	w.armed.Store(false)
	w.mu.Lock()
	q, cs := w.queue, w.cancels
	w.queue, w.cancels = nil, nil
	if w.update != nil {
		if w.pendingF != nil {
			w.pendingF.done <- nil // overtaken by a newer set
		}
		w.pendingF, w.update = w.update, nil
	}
	closing = w.closing
	w.mu.Unlock()
	w.pending = append(w.pending, q...)
	for _, op := range cs {
		w.cancelOp(op)
	}
	if closing {
		for _, op := range w.pending {
			if op.err == nil {
				op.err = errs.New(errs.Closed, "file", "executor closed")
			}
			op.issued = op.Len // hand out nothing more
		}
		w.settle()
		for i := range w.slots {
			if s := &w.slots[i]; s.op != nil && !s.cancel {
				w.sendCancel(i)
			}
		}
	}
	return closing
}

// cancelOp ends op's pending part and asks the kernel to stop its I/Os.
func (w *ringWorker) cancelOp(op *Op) {
	// Only the ring an op runs on reads its fields; the others find it in
	// neither their pending list nor their slots.
	if !w.has(op) || op.canceled {
		return
	}
	op.canceled = true
	op.issued = op.Len
	for i := range w.slots {
		if s := &w.slots[i]; s.op == op && !s.cancel {
			w.sendCancel(i)
		}
	}
	w.settle()
}

func (w *ringWorker) has(op *Op) bool {
	for _, p := range w.pending {
		if p == op {
			return true
		}
	}
	for i := range w.slots {
		if w.slots[i].op == op {
			return true
		}
	}
	return false
}

func (w *ringWorker) sendCancel(i int) {
	s := w.ring.SQE()
	if s == nil {
		return // the queue is full of this round's I/Os; they end anyway
	}
	s.PrepCancel(uint64(i+slotBase), udCancel)
	w.slots[i].cancel = true
}

// settle finishes pending ops with nothing left to hand out and nothing in
// flight, and drops them from pending.
func (w *ringWorker) settle() {
	keep := w.pending[:0]
	for _, op := range w.pending {
		if op.issued >= op.Len {
			if op.inflight == 0 {
				w.x.finish(op)
			}
			continue
		}
		keep = append(keep, op)
	}
	clear(w.pending[len(keep):])
	w.pending = keep
}

// fill hands out chunks of pending ops to free slots.
func (w *ringWorker) fill() {
	rs := w.resubmit
	w.resubmit = nil
	for _, i := range rs {
		if op := w.slots[i].op; op.canceled || op.err != nil {
			w.endSlot(i)
		} else {
			w.prep(i)
		}
	}
	chunk := w.x.cfg.Chunk
	for len(w.free) > 0 && len(w.pending) > 0 && w.ring.Space() > 1 {
		op := w.pending[0]
		n := min(chunk, op.Len-op.issued)
		i := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		w.slots[i] = slot{op: op, addr: op.Addr + op.issued, off: op.Off + op.issued, n: n}
		op.issued += n
		op.inflight++
		w.busy++
		w.prep(i)
		if op.issued >= op.Len {
			w.pending[0] = nil
			w.pending = w.pending[1:]
		}
	}
}

// prep puts slot i's I/O (its remaining part) into an SQE.
func (w *ringWorker) prep(i int) {
	s := &w.slots[i]
	f := s.op.File
	fd, direct := f.fdFor(s.addr, s.off, s.n)
	sqe := w.ring.SQE()
	st := &w.x.st
	if idx, ok := w.lookup(s.addr, s.n); ok {
		sqe.PrepFixed(s.op.Write, fd, s.addr, uint32(s.n), f.base+s.off, idx, uint64(i+slotBase))
		st.fixed.Add(1)
		s.fixed = true
		w.fixedIn++
	} else {
		op := uring.OpRead
		if s.op.Write {
			op = uring.OpWrite
		}
		sqe.PrepRW(op, fd, s.addr, uint32(s.n), f.base+s.off, uint64(i+slotBase))
	}
	if direct {
		st.direct.Add(1)
	} else {
		st.buffered.Add(1)
	}
}

func (w *ringWorker) complete(c uring.CQE) {
	switch c.UserData {
	case udWake:
		var b [8]byte
		unix.Read(w.efd, b[:]) // nonblocking; the counter is reset
		w.polling = false
		return
	case udCancel:
		return // the canceled I/O reports on its own
	}
	i := int(c.UserData - slotBase)
	if i < 0 || i >= len(w.slots) || w.slots[i].op == nil {
		return
	}
	s := &w.slots[i]
	if s.fixed { // out of the kernel (a resubmission counts again)
		s.fixed = false
		w.fixedIn--
	}
	op := s.op
	switch {
	case c.Res < 0:
		e := uring.Errno(c.Res)
		if (errors.Is(e, unix.EAGAIN) || errors.Is(e, unix.EINTR)) && !op.canceled && s.retries < maxRetries {
			s.retries++
			w.requeue(i)
			return
		}
		if op.err == nil {
			if op.canceled && errors.Is(e, unix.ECANCELED) {
				op.err = errs.New(errs.Canceled, "file", "canceled")
			} else {
				op.err = ioError(op, s.off, e)
			}
		}
	case c.Res == 0:
		if op.err == nil {
			if op.Write {
				op.err = errs.New(errs.IO, "file", "write of %s at offset %d wrote nothing", op.File.path, s.off)
			} else {
				op.err = errShort(op, s.off)
			}
		}
	case uint64(c.Res) < s.n:
		op.moved += uint64(c.Res)
		w.x.st.short.Add(1)
		s.addr += uint64(c.Res)
		s.off += uint64(c.Res)
		s.n -= uint64(c.Res)
		if !op.canceled && op.err == nil {
			w.requeue(i)
			return
		}
	default:
		op.moved += s.n
	}
	w.endSlot(i)
}

// endSlot frees slot i, whose I/O is over; its op ends with its last I/O.
func (w *ringWorker) endSlot(i int) {
	op := w.slots[i].op
	w.slots[i] = slot{}
	w.free = append(w.free, i)
	w.busy--
	op.inflight--
	if op.err != nil && op.issued < op.Len {
		op.issued = op.Len // a failed op hands out no more
		w.settle()
		return
	}
	if op.issued >= op.Len && op.inflight == 0 {
		w.x.finish(op)
	}
}

// requeue queues slot i's remaining I/O for the next round: completions
// are reaped before the SQ has room again.
func (w *ringWorker) requeue(i int) { w.resubmit = append(w.resubmit, i) }

// failAll ends everything after the ring itself failed: what is in the
// kernel is reaped when the ring closes (closing the fd cancels and waits).
func (w *ringWorker) failAll(err error) {
	e := errs.Wrap(errs.Internal, "file", err, "io_uring_enter")
	w.ring.Close()
	for i := range w.slots {
		if s := &w.slots[i]; s.op != nil {
			if s.op.err == nil {
				s.op.err = e
			}
			s.op.inflight--
			if s.op.inflight == 0 && s.op.issued >= s.op.Len {
				w.x.finish(s.op)
			}
			*s = slot{}
		}
	}
	for _, op := range w.pending {
		if op.err == nil {
			op.err = e
		}
		op.issued = op.Len
	}
	w.settle()
	w.mu.Lock()
	w.closing = true
	q := w.queue
	w.queue = nil
	w.mu.Unlock()
	for _, op := range q {
		op.err = e
		w.x.finish(op)
	}
}

// fixedRange is one registered (fixed) buffer.
type fixedRange struct{ addr, n uint64 }

// fixedUpdate asks a ring to register a new set of memory ranges.
type fixedUpdate struct {
	ranges []fixedRange
	done   chan error
}

// maxFixedBuffers bounds a ring's table (the kernel's limit is 16384).
const maxFixedBuffers = 1 << 14

// setTable registers the staging memory and ranges (cut into pieces of at
// most 1 GiB) as the ring's fixed buffers, replacing the table it had; no
// I/O may be using the old one. When the kernel refuses (RLIMIT_MEMLOCK
// without CAP_IPC_LOCK, too many buffers) the ring keeps the staging
// memory alone, or nothing, and the error says why.
func (w *ringWorker) setTable(ranges []fixedRange) error {
	if w.fixed {
		w.ring.UnregisterBuffers()
		w.fixed, w.tab = false, nil
	}
	var tab []fixedRange
	if w.x.stageLen > 0 {
		tab = append(tab, fixedRange{w.x.stageBase, w.x.stageLen})
	}
	for _, r := range ranges {
		for a, end := r.addr, r.addr+r.n; a < end; a += 1 << 30 {
			tab = append(tab, fixedRange{a, min(1<<30, end-a)})
		}
	}
	if len(tab) == 0 {
		return nil
	}
	var err error
	if len(tab) > maxFixedBuffers {
		err = errs.New(errs.TooLarge, "fileio", "%d fixed buffers, more than %d", len(tab), maxFixedBuffers)
	} else {
		err = w.register(tab)
	}
	if err != nil && len(ranges) > 0 {
		w.setTable(nil) // the staging memory alone
		return err
	}
	return err
}

func (w *ringWorker) register(tab []fixedRange) error {
	addrs, lens := make([]uint64, len(tab)), make([]uint64, len(tab))
	for i, r := range tab {
		addrs[i], lens[i] = r.addr, r.n
	}
	if err := w.ring.RegisterBuffers(addrs, lens); err != nil {
		return err
	}
	// buf_index is the position in the registration: lookup scans the
	// table in that order (a handful of entries: KV pools are few).
	w.fixed, w.tab = true, tab
	return nil
}

// lookup returns the fixed buffer holding [addr, addr+n), if any; none
// while a new table waits to be registered (its I/O stays off the table).
func (w *ringWorker) lookup(addr, n uint64) (uint16, bool) {
	if !w.fixed || w.pendingF != nil {
		return 0, false
	}
	for i, r := range w.tab {
		if addr >= r.addr && addr+n <= r.addr+r.n {
			return uint16(i), true
		}
	}
	return 0, false
}

// setFixed sends ranges to every ring and waits until each registered them
// (once its I/O on the old table ended).
func (rb *rings) setFixed(ranges []fixedRange) error {
	var first error
	dones := make([]chan error, len(rb.ws))
	for i, w := range rb.ws {
		dones[i] = make(chan error, 2)
		w.mu.Lock()
		if w.closing {
			w.mu.Unlock()
			dones[i] <- errs.New(errs.Closed, "fileio", "executor closed")
			continue
		}
		if w.update != nil {
			w.update.done <- nil // overtaken
		}
		w.update = &fixedUpdate{ranges: ranges, done: dones[i]}
		w.mu.Unlock()
		w.wake()
	}
	for i, w := range rb.ws {
		select {
		case err := <-dones[i]:
			if err != nil && first == nil {
				first = err
			}
		case <-w.exited:
			if first == nil {
				first = errs.New(errs.Closed, "fileio", "executor closed")
			}
		}
	}
	return first
}
