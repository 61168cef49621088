package engine

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
)

// Opcode is READ or WRITE.
type Opcode = transport.Opcode

// Opcodes, numbered as in Mooncake.
const (
	Read  = transport.Read
	Write = transport.Write
)

// TaskState is the state of one request of a batch, numbered as Mooncake's.
type TaskState int32

// Task states.
const (
	Waiting   TaskState = 0 // slot allocated, nothing submitted
	Pending   TaskState = 1 // submitted, not finished
	Invalid   TaskState = 2 // no such task
	Canceled  TaskState = 3
	Completed TaskState = 4
	Timeout   TaskState = 5
	Failed    TaskState = 6
)

func (s TaskState) String() string {
	switch s {
	case Waiting:
		return "WAITING"
	case Pending:
		return "PENDING"
	case Invalid:
		return "INVALID"
	case Canceled:
		return "CANCELED"
	case Completed:
		return "COMPLETED"
	case Timeout:
		return "TIMEOUT"
	case Failed:
		return "FAILED"
	}
	return "UNKNOWN"
}

// Request is one transfer: Length bytes between local address Local and
// address Remote of Segment (for RAM segments the remote virtual address, as
// in Mooncake).
type Request struct {
	Op      Opcode
	Local   uint64
	Segment *Segment
	Remote  uint64
	Length  uint64
	// Transport forces a transport for this request ("" chooses).
	Transport string
}

// TaskStatus is the state of one request.
type TaskStatus struct {
	State       TaskState
	Transferred uint64
	Transport   string
	Err         error // why it did not complete
}

// BatchStatus sums up a batch.
type BatchStatus struct {
	State       TaskState // PENDING while any task is; else the worst outcome
	Transferred uint64
	Tasks       int
	Completed   int
	Failed      int // FAILED, TIMEOUT and CANCELED together
	Err         error
}

type task struct {
	state     atomic.Int32
	length    uint64
	transport string
	st        *segState
	group     *submitGroup
	err       error // set before state leaves Pending
	doneOnce  atomic.Bool
}

// submitGroup is the tasks of one Submit call, which share a deadline.
type submitGroup struct {
	remaining atomic.Int32
	deadline  time.Time
	b         *Batch
	tasks     []*task
}

type batchNotify struct {
	segment, name, msg string
}

// Batch is a set of requests submitted together and waited on together.
// Submit may be called several times up to the capacity.
type Batch struct {
	e        *Engine
	capacity int

	mu      sync.Mutex
	tasks   []*task
	pending int
	done    chan struct{} // made by a waiter while tasks are pending; closed when none are
	notify  *batchNotify
	freed   bool
	efd     int         // eventfd from EventFD, 0 when none
	sum     BatchStatus // outcomes of the finished tasks
}

// AllocateBatch returns an empty batch for up to capacity requests.
func (e *Engine) AllocateBatch(capacity int) (*Batch, error) {
	if err := e.live("allocate batch"); err != nil {
		return nil, err
	}
	if capacity <= 0 || capacity > 1<<24 {
		return nil, errs.New(errs.InvalidArgument, "allocate batch", "capacity %d outside 1..%d", capacity, 1<<24)
	}
	b := &Batch{e: e, capacity: capacity, sum: BatchStatus{State: Completed}}
	e.batchMu.Lock()
	e.batches[b] = struct{}{}
	e.batchMu.Unlock()
	return b, nil
}

// Capacity returns the batch's capacity.
func (b *Batch) Capacity() int { return b.capacity }

// Submit validates every request, then starts them all; if any request is
// invalid nothing is started and the error names it. A request is valid when
// its length is non-zero, its local range lies in registered memory and its
// target range lies inside one buffer of the segment's descriptor.
func (b *Batch) Submit(reqs ...Request) error {
	return b.submit(nil, reqs)
}

// SubmitWithNotify submits like Submit and, once every task of the batch has
// COMPLETED, sends the notification (name, msg) to segment. No notification is
// sent if a task fails.
func (b *Batch) SubmitWithNotify(segment, name, msg string, reqs ...Request) error {
	return b.submit(&batchNotify{segment, name, msg}, reqs)
}

type prepared struct {
	t      transport.Transport
	tr     *transport.Request
	region *segment.Region
	task   *task
}

func (b *Batch) submit(n *batchNotify, reqs []Request) error {
	e := b.e
	if err := e.live("submit"); err != nil {
		return err
	}
	if len(reqs) == 0 {
		return errs.New(errs.InvalidArgument, "submit", "no requests")
	}
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return errs.New(errs.InvalidArgument, "submit", "batch was freed")
	}
	if len(b.tasks)+len(reqs) > b.capacity {
		b.mu.Unlock()
		return errs.New(errs.InvalidArgument, "submit", "%d requests exceed the batch's remaining capacity of %d",
			len(reqs), b.capacity-len(b.tasks))
	}
	b.mu.Unlock()

	// One allocation each for the tasks and transport requests of a submit:
	// per-request garbage was the largest cost at small block sizes.
	ps := make([]prepared, len(reqs))
	tasks := make([]task, len(reqs))
	trs := make([]transport.Request, len(reqs))
	release := func(k int) {
		for _, p := range ps[:k] {
			p.region.Release()
		}
	}
	for i := range reqs {
		r := &reqs[i]
		p, err := e.prepare(b, i, r, &tasks[i], &trs[i])
		if err != nil {
			release(i)
			return err
		}
		ps[i] = p
	}

	group := &submitGroup{}
	group.remaining.Store(int32(len(ps)))
	b.mu.Lock()
	if b.freed || len(b.tasks)+len(ps) > b.capacity {
		b.mu.Unlock()
		release(len(ps))
		return errs.New(errs.InvalidArgument, "submit", "batch freed or filled concurrently")
	}
	if n != nil {
		b.notify = n
	}
	for i := range ps {
		t := ps[i].task
		t.group = group
		b.tasks = append(b.tasks, t)
	}
	b.pending += len(ps)
	b.mu.Unlock()

	if e.cfg.TransferTimeout > 0 {
		group.b = b
		group.tasks = make([]*task, len(ps))
		for i := range ps {
			group.tasks[i] = ps[i].task
		}
		e.reaper.add(group, e.cfg.TransferTimeout)
	}

	// Hand each transport its requests in one call.
	for len(ps) > 0 {
		t := ps[0].t
		var mine []*transport.Request
		rest := ps[:0]
		for _, p := range ps {
			if p.t == t {
				mine = append(mine, p.tr)
			} else {
				rest = append(rest, p)
			}
		}
		t.Submit(mine)
		ps = rest
	}
	return nil
}

// prepare validates one request and builds its transport request; the local
// region is held in flight until the transport calls Done.
func (e *Engine) prepare(b *Batch, i int, r *Request, tk *task, tr *transport.Request) (prepared, error) {
	fail := func(code errs.Code, format string, args ...any) (prepared, error) {
		return prepared{}, errs.New(code, "submit", "request %d: "+format, append([]any{i}, args...)...)
	}
	if r.Op != Read && r.Op != Write {
		return fail(errs.InvalidArgument, "opcode %d is neither READ nor WRITE", r.Op)
	}
	if r.Length == 0 {
		return fail(errs.InvalidArgument, "zero length")
	}
	if r.Local+r.Length < r.Local || r.Remote+r.Length < r.Remote {
		return fail(errs.InvalidArgument, "range overflows")
	}
	if r.Segment == nil || r.Segment.e != e || r.Segment.closed.Load() {
		return fail(errs.InvalidArgument, "segment handle is nil, closed or of another engine")
	}
	st := r.Segment.st
	d, buf, t, err := e.target(st, r)
	if err != nil && !st.local {
		// The cached descriptor may predate a registration or a restart of
		// the peer: look again once before refusing.
		st.stale.Store(true)
		if d2, _ := e.current(st); d2 != nil && d2 != d {
			d, buf, t, err = e.target(st, r)
		}
	}
	if err != nil {
		return fail(errs.CodeOf(err), "%v", err)
	}
	region, err := e.reg.Acquire(r.Local, r.Length, 0, false)
	if err != nil {
		return fail(errs.CodeOf(err), "local range: %v", err)
	}
	tk.length, tk.transport, tk.st = r.Length, t.Name(), st
	tk.state.Store(int32(Pending))
	*tr = transport.Request{Op: r.Op, Local: r.Local, Remote: r.Remote, Length: r.Length, Peer: d, Buffer: buf}
	tr.Done = func(err error) {
		if !tk.doneOnce.CompareAndSwap(false, true) {
			return // a transport bug must not release the region twice
		}
		region.Release()
		if err != nil {
			b.finish(tk, Failed, err)
		} else {
			b.finish(tk, Completed, nil)
		}
	}
	return prepared{t: t, tr: tr, region: region, task: tk}, nil
}

// target resolves a request against the segment's current descriptor: the
// buffer holding the target range and the transport to use.
func (e *Engine) target(st *segState, r *Request) (*segment.Desc, *segment.BufferDesc, transport.Transport, error) {
	d, err := e.current(st)
	if err != nil {
		return nil, nil, nil, err
	}
	buf, err := d.Find(r.Remote, r.Length)
	if err != nil {
		return d, nil, nil, err
	}
	t, err := e.choose(st, d, r.Transport)
	if err != nil {
		return d, nil, nil, err
	}
	if t, err = e.routeDevice(d, buf, r, t); err != nil {
		return d, nil, nil, err
	}
	return d, buf, t, nil
}

// finish moves t from PENDING to state; a task finishes once.
func (b *Batch) finish(t *task, state TaskState, err error) {
	if t.state.Load() != int32(Pending) {
		return
	}
	if err != nil {
		// Before the batch can be seen done: a caller that resubmits on
		// failure must get the refreshed descriptor.
		b.e.invalidate(t.st, err)
	}
	b.mu.Lock()
	if t.state.Load() != int32(Pending) {
		b.mu.Unlock()
		return
	}
	t.err = err
	t.state.Store(int32(state))
	b.pending--
	if state == Completed {
		b.sum.Completed++
		b.sum.Transferred += t.length
	} else {
		b.sum.Failed++
		if b.sum.Err == nil {
			b.sum.Err = err
		}
	}
	if rank(state) > rank(b.sum.State) {
		b.sum.State = state
	}
	// Counted before the batch can be seen done, so a caller that reads
	// the stats after Wait sees this task.
	t.group.remaining.Add(-1)
	b.e.stats.count(t, state)
	var n *batchNotify
	if b.pending == 0 {
		if b.done != nil {
			close(b.done)
			b.done = nil
		}
		if b.efd > 0 {
			signalFD(b.efd)
		}
		if b.notify != nil && b.sum.Failed == 0 {
			n = b.notify
		}
		b.notify = nil
	}
	b.mu.Unlock()
	if n != nil && !b.e.closed.Load() {
		b.e.wg.Add(1)
		go func() {
			defer b.e.wg.Done()
			if err := b.e.SendNotify(n.segment, n.name, n.msg); err != nil {
				b.e.cfg.Logger.Warn("te: batch notify", "segment", n.segment, "err", err)
			}
		}()
	}
}

// failPending ends every pending task with err (engine close).
func (b *Batch) failPending(err error) {
	b.mu.Lock()
	tasks := append([]*task(nil), b.tasks...)
	b.mu.Unlock()
	for _, t := range tasks {
		b.finish(t, Failed, err)
	}
}

// TaskStatus returns the state of task i (in submission order).
func (b *Batch) TaskStatus(i int) (TaskStatus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if i < 0 || i >= len(b.tasks) {
		return TaskStatus{State: Invalid}, errs.New(errs.InvalidArgument, "task status", "task %d of %d", i, len(b.tasks))
	}
	return b.tasks[i].status(), nil
}

func (t *task) status() TaskStatus {
	s := TaskStatus{State: TaskState(t.state.Load()), Transport: t.transport}
	if s.State == Completed {
		s.Transferred = t.length
	} else if s.State != Pending {
		s.Err = t.err
	}
	return s
}

// Status sums up the batch.
func (b *Batch) Status() BatchStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statusLocked()
}

// statusLocked is O(1): finish keeps the sums, since Wait and pollers call
// this on every check and batches hold thousands of tasks.
func (b *Batch) statusLocked() BatchStatus {
	s := b.sum
	s.Tasks = len(b.tasks)
	switch {
	case len(b.tasks) == 0:
		s.State = Waiting
	case b.pending > 0:
		s.State = Pending
	}
	return s
}

// rank orders outcomes for a batch's summary: the worst one wins.
func rank(s TaskState) int {
	switch s {
	case Canceled:
		return 1
	case Timeout:
		return 2
	case Failed:
		return 3
	}
	return 0
}

// closed is the channel Done returns when nothing is pending.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Done returns a channel closed once every submitted task has finished. The
// channel is made only when someone waits while tasks are pending: a batch
// that finished before anyone looked costs no channel.
func (b *Batch) Done() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.doneLocked()
}

func (b *Batch) doneLocked() chan struct{} {
	if b.pending == 0 {
		return closed
	}
	if b.done == nil {
		b.done = make(chan struct{})
	}
	return b.done
}

// Wait blocks until every submitted task has finished or timeout passes
// (a negative timeout waits without limit) and returns the batch status. On
// timeout the error has code Timeout and the tasks go on.
func (b *Batch) Wait(timeout time.Duration) (BatchStatus, error) {
	b.mu.Lock()
	if b.pending == 0 {
		s := b.statusLocked()
		b.mu.Unlock()
		return s, nil
	}
	done := b.doneLocked()
	b.mu.Unlock()
	if timeout < 0 {
		<-done
		return b.Status(), nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return b.Status(), nil
	case <-t.C:
		return b.Status(), errs.New(errs.Timeout, "wait", "batch not finished within %v", timeout)
	}
}

// Free releases the batch. It is refused with BatchBusy while tasks are
// pending; freeing twice is an InvalidArgument error.
func (b *Batch) Free() error {
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return errs.New(errs.InvalidArgument, "free batch", "batch already freed")
	}
	if b.pending > 0 {
		n := b.pending
		b.mu.Unlock()
		return errs.New(errs.BatchBusy, "free batch", "%d tasks still in flight", n)
	}
	b.freed = true
	b.closeFD()
	b.mu.Unlock()
	b.e.batchMu.Lock()
	delete(b.e.batches, b)
	b.e.batchMu.Unlock()
	return nil
}
