package engine

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
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

// Task states. A task leaves PENDING only once its transport will never touch
// its memory again: every state after PENDING is a fence.
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
	// Window is the key of a window the target granted over the range
	// (Engine.GrantWindow, GrantWindowTo), presented instead of the
	// buffer's own key: the target can then revoke this transfer's access
	// alone. Such a request goes only over a transport that enforces
	// windows (Caps.Windows), or fails with NotSupported. 0: none.
	Window uint64
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

// Why the engine asked a transport to cancel a task; the outcome the task
// ends with when the transport confirms.
const (
	whyNone int32 = iota
	whyTimeout
	whyCanceled
)

// A task's word holds its state and the generation of the submission that
// filled it: gen<<stateBits | state. A completion must name the generation
// it was given, so a late or duplicated one cannot end the task that reuses
// the slot; and it is one compare-and-swap, so two completions cannot both
// win.
const (
	stateBits = 4
	stateMask = 1<<stateBits - 1
	// completing is held by the completion that won a task while it
	// records the outcome; readers see PENDING until it publishes.
	completing = stateMask
)

// submitGen numbers submissions, engine-wide: slots go back to a pool and
// out to other batches, so a generation must not repeat across batches.
var submitGen atomic.Uint64

type task struct {
	word   atomic.Uint64 // gen<<stateBits | state
	why    atomic.Int32  // whyTimeout / whyCanceled once the engine canceled it
	err    error         // written by the completion that won word, before it publishes the state
	length uint64
	t      transport.Transport
	st     *segState
	start  int64 // monoNow at submit (metrics.go)
	peer   uint8 // peer class of the target (metrics.go)
}

// state is the task's state; a completion recording its outcome is PENDING.
func (t *task) state() TaskState {
	s := TaskState(t.word.Load() & stateMask)
	if s == completing {
		return Pending
	}
	return s
}

// reset empties the slot. The word is stored atomically: a stray completion
// of an earlier generation may be comparing it at the same moment.
func (t *task) reset() {
	t.word.Store(0)
	t.why.Store(whyNone)
	t.err, t.length, t.t, t.st = nil, 0, nil, nil
}

func resetTasks(ts []task) {
	for i := range ts {
		ts[i].reset()
	}
}

// lastFound is a descriptor and one of its buffers.
type lastFound struct {
	d   *segment.Desc
	buf *segment.BufferDesc
}

type batchNotify struct {
	segment, name, msg string
}

// Batch is a set of requests submitted together and waited on together.
// Submit may be called several times up to the capacity; Reset makes the
// slots of a finished batch usable again.
//
// The slots (tasks and the transport requests) are allocated once per batch
// and reused, and a task's completion is an index into them with the
// submission's generation, so a submit allocates nothing per request in
// steady state.
//
// Locks: subMu serialises submits and is held while requests are validated,
// which may call the network (a descriptor refresh, a transport's first
// contact with a peer); nothing else takes it. smu orders the slot owners
// (a submit handing its tasks to the transports, Cancel, Reset, Free, an
// unregistration canceling tasks) and is only ever held briefly. mu guards
// the counters and is what status readers take.
type Batch struct {
	e        *Engine
	capacity int
	// tasks and reqs are set once, by AllocateBatch, and never replaced
	// (Free hands them to the pool but keeps them): a stray completion of
	// an old generation may still index them, and must find a task whose
	// generation differs rather than a nil slice.
	tasks []task
	reqs  []transport.Request // reqs[i] is task i's request

	subMu sync.Mutex // serialises submits (held across their network calls)
	last  lastFound  // target buffer of the previous request (under subMu)
	// now is when the submit in progress started; peerCls the peer class
	// (metrics) of the descriptor peerOf. Under subMu.
	now     time.Time
	peerOf  *segment.Desc
	peerCls uint8

	smu sync.Mutex // slot owners: a submit's hand-off, Cancel, Reset, Free

	histFrom int // first task not yet in the latency histograms (under mu)

	// The stage histograms' marks (metrics.go), where the last submit is
	// timed: when it handed its requests to a transport (index stageT, -1: none yet) and
	// when the batch last settled, monoNow.
	handAt   atomic.Int64
	settleAt atomic.Int64
	stageT   atomic.Int32
	stageOn  atomic.Bool // this batch's last submit is timed
	stageDue int         // requests until a submit is timed (under subMu)

	// pending counts submitted tasks not ended, plus a batch notify being
	// sent. Only the completion that brings it to zero takes mu.
	pending atomic.Int64
	nDone   atomic.Int64
	nFail   atomic.Int64
	bytes   atomic.Uint64

	mu        sync.Mutex
	n         int           // tasks submitted (slots in use)
	settled   bool          // nothing pending and any notify sent
	done      chan struct{} // made by a waiter while unsettled; closed on settling
	notify    *batchNotify
	worst     TaskState
	firstErr  error
	freed     bool
	preparing bool   // a submit is filling slots [n, ...): Reset and Free are refused
	gen       uint32 // bumped by Reset and Free: reaper entries of old tasks are void
	efd       int    // eventfd from EventFD, 0 when none
	flushDone int64  // counts already added to the engine's stats
	flushFail int64
	flushB    uint64
	timedOut  int64
	canceled  int64
	notifyErr error // the batch's notify could not be delivered
}

// AllocateBatch returns an empty batch for up to capacity requests.
func (e *Engine) AllocateBatch(capacity int) (*Batch, error) {
	if err := e.live("allocate batch"); err != nil {
		return nil, err
	}
	if capacity <= 0 || capacity > 1<<24 {
		return nil, errs.New(errs.InvalidArgument, "allocate batch", "capacity %d outside 1..%d", capacity, 1<<24)
	}
	// A fresh batch's first submit is timed with the odds of any other.
	b := &Batch{e: e, capacity: capacity, settled: true, stageDue: rand.IntN(stageSampleReqs)}
	b.tasks, b.reqs = getSlots(capacity)
	e.batchMu.Lock()
	e.batches[b] = struct{}{}
	e.batchMu.Unlock()
	return b, nil
}

// Slots are pooled per capacity class, so an AllocateBatch/Free cycle (the
// Mooncake pattern: one batch per transfer) reuses them too.
var slotPools [25]sync.Pool

type slots struct {
	tasks []task
	reqs  []transport.Request
}

func slotClass(capacity int) int {
	c := 0
	for 1<<c < capacity {
		c++
	}
	return c
}

func getSlots(capacity int) ([]task, []transport.Request) {
	c := slotClass(capacity)
	if s, ok := slotPools[c].Get().(*slots); ok {
		return s.tasks[:capacity], s.reqs[:capacity]
	}
	n := 1 << c
	return make([]task, n)[:capacity], make([]transport.Request, n)[:capacity]
}

func putSlots(ts []task, rs []transport.Request) {
	resetTasks(ts[:cap(ts)])
	clear(rs[:cap(rs)])
	slotPools[slotClass(cap(ts))].Put(&slots{ts[:cap(ts)], rs[:cap(rs)]})
}

// Capacity returns the batch's capacity.
func (b *Batch) Capacity() int { return b.capacity }

// Submit validates every request, then starts them all; if any request is
// invalid nothing is started and the error names it. A request is valid when
// its length is non-zero, its local range lies in registered memory and its
// target range lies inside one buffer of the segment's descriptor. Submit
// does not wait for the transfers.
func (b *Batch) Submit(reqs ...Request) error {
	return b.submit(nil, reqs)
}

// SubmitWithNotify submits like Submit and, once every task of the batch has
// COMPLETED, sends the notification (name, msg) to segment before the batch
// reports COMPLETED. No notification is sent if a task fails; a notification
// that cannot be delivered fails the batch.
func (b *Batch) SubmitWithNotify(segment, name, msg string, reqs ...Request) error {
	return b.submit(&batchNotify{segment, name, msg}, reqs)
}

func (b *Batch) submit(n *batchNotify, reqs []Request) error {
	e := b.e
	if err := e.live("submit"); err != nil {
		return err
	}
	if len(reqs) == 0 {
		return errs.New(errs.InvalidArgument, "submit", "no requests")
	}
	b.subMu.Lock()
	defer b.subMu.Unlock()
	b.last = lastFound{}
	// One clock read per submit, for the tasks' start (metrics.go) and the
	// reaper's deadline.
	b.now = time.Now()
	// Reserve the slots: from here until the hand-off below, [lo, lo+len)
	// are this submit's alone (status readers and Cancel stop at b.n, and
	// Reset and Free refuse while preparing), so they are filled without
	// a lock that anyone else waits on while validation calls the network.
	b.mu.Lock()
	lo, freed := b.n, b.freed
	fits := lo+len(reqs) <= b.capacity
	if !freed && fits {
		b.preparing = true
	}
	b.mu.Unlock()
	if freed {
		return errs.New(errs.InvalidArgument, "submit", "batch was freed")
	}
	if !fits {
		return errs.New(errs.InvalidArgument, "submit", "%d requests exceed the batch's remaining capacity of %d",
			len(reqs), b.capacity-lo)
	}
	abandon := func(hi int) {
		b.clearSlots(lo, hi)
		b.mu.Lock()
		b.preparing = false
		b.mu.Unlock()
	}
	gen := submitGen.Add(1)
	// The local region is looked up once per run of requests in it, and
	// retained once per run below.
	var region *segment.Region
	for i := range reqs {
		r := &reqs[i]
		if region == nil || r.Local < region.Addr || r.Local+r.Length > region.End() || r.Local+r.Length < r.Local {
			region, _ = e.reg.Lookup(r.Local, r.Length)
		}
		if err := e.prepare(b, i, lo+i, gen, r, region); err != nil {
			abandon(lo + i + 1)
			return err
		}
	}
	if err := b.retain(lo, lo+len(reqs)); err != nil {
		abandon(lo + len(reqs))
		return err
	}

	// Publish the tasks and hand them over under smu, so that Cancel (and
	// an unregistration's cancel) sees them only once their transport has
	// them: a transport's Cancel must not race its own Submit on a request.
	// Under handMu, and only while the engine is open: no request reaches
	// a transport once Close began.
	b.smu.Lock()
	e.handMu.RLock()
	if e.closed.Load() {
		e.handMu.RUnlock()
		b.smu.Unlock()
		b.releaseSlots(lo, lo+len(reqs))
		abandon(lo + len(reqs))
		return errs.New(errs.Closed, "submit", "engine closed")
	}
	b.mu.Lock()
	b.preparing = false
	if n != nil {
		b.notify = n
	}
	b.n = lo + len(reqs)
	b.settled = false
	b.pending.Add(int64(len(reqs)))
	bgen := b.gen
	b.mu.Unlock()

	b.markHanded(lo, len(reqs))
	// Hand each transport its run of requests in one call.
	for i := lo; i < lo+len(reqs); {
		t := b.tasks[i].t
		j := i + 1
		for j < lo+len(reqs) && b.tasks[j].t == t {
			j++
		}
		t.Submit(b.reqs[i:j])
		i = j
	}
	e.handMu.RUnlock()
	b.smu.Unlock()
	if e.cfg.TransferTimeout > 0 {
		e.reaper.add(b, bgen, lo, lo+len(reqs), b.now.Add(e.cfg.TransferTimeout))
	}
	return nil
}

// retain holds the local regions of slots [lo, hi) for their requests: one
// atomic update per run of requests in one region, undone if a region began
// to unregister meanwhile.
func (b *Batch) retain(lo, hi int) error {
	for i := lo; i < hi; {
		g := b.reqs[i].Region
		j := i + 1
		for j < hi && b.reqs[j].Region == g {
			j++
		}
		if !g.Retain(int64(j - i)) {
			for k := lo; k < i; {
				h := b.reqs[k].Region
				m := k + 1
				for m < i && b.reqs[m].Region == h {
					m++
				}
				h.ReleaseN(int64(m - k))
				k = m
			}
			return errs.New(errs.AddressNotRegistered, "submit", "request %d: local [%#x,+%d) is being unregistered",
				i-lo, b.reqs[i].Local, b.reqs[i].Length)
		}
		i = j
	}
	return nil
}

// releaseSlots releases the regions retain held for slots [lo, hi).
func (b *Batch) releaseSlots(lo, hi int) {
	for i := lo; i < hi; {
		g := b.reqs[i].Region
		j := i + 1
		for j < hi && b.reqs[j].Region == g {
			j++
		}
		g.ReleaseN(int64(j - i))
		i = j
	}
}

func (b *Batch) clearSlots(lo, hi int) {
	resetTasks(b.tasks[lo:hi])
	clear(b.reqs[lo:hi])
}

// prepare validates request i (slot k) of the submission gen and fills its
// task and transport request. It may call the network (refreshing a stale
// descriptor, a transport's first contact with a peer): the caller holds
// no lock but subMu.
func (e *Engine) prepare(b *Batch, i, k int, gen uint64, r *Request, region *segment.Region) error {
	tk, tr := &b.tasks[k], &b.reqs[k]
	fail := func(code errs.Code, format string, args ...any) error {
		return errs.New(code, "submit", "request %d: "+format, append([]any{i}, args...)...)
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
	if region == nil {
		return fail(errs.AddressNotRegistered, "local range: [%#x,+%d) is not inside one registered buffer", r.Local, r.Length)
	}
	st := r.Segment.st
	d, buf, t, err := e.target(st, r, region, b.last)
	if err != nil && !st.local && e.mayRefresh(st, err) {
		// The cached descriptor may predate a registration or a restart of
		// the peer: look again once (this segment only) before refusing.
		if d2, err2 := e.refresh(st, d); err2 == nil && d2 != d {
			d, buf, t, err = e.target(st, r, region, lastFound{})
		}
	}
	if err != nil {
		if errors.Is(err, errUnenforced) {
			e.stats.windowsUnenforced.Add(1)
		}
		return errs.Wrap(errs.CodeOf(err), "submit", err, "request %d", i) // the cause's code is not said twice
	}
	b.last = lastFound{d, buf}
	key := buf.Key
	if r.Window != 0 {
		key = r.Window // t enforces windows: pick chose no other
	}
	tk.length, tk.t, tk.st = r.Length, t, st
	if d != b.peerOf {
		b.peerOf, b.peerCls = d, e.peerClass(st, d)
	}
	tk.start, tk.peer = int64(b.now.Sub(epoch)), b.peerCls
	tk.err = nil
	tk.why.Store(whyNone)
	tk.word.Store(gen<<stateBits | uint64(Pending))
	*tr = transport.Request{Op: r.Op, Local: r.Local, Remote: r.Remote, Length: r.Length, Peer: d, Buffer: buf,
		Key: key, Region: region, Owner: (*completer)(b), Index: k, Gen: gen}
	return nil
}

// target resolves a request against the segment's current descriptor: the
// buffer holding the target range and the transport to use. last is the
// buffer the previous request of the submit found, tried before a search.
func (e *Engine) target(st *segState, r *Request, region *segment.Region, last lastFound) (*segment.Desc, *segment.BufferDesc, transport.Transport, error) {
	d, err := e.current(st)
	if err != nil {
		return nil, nil, nil, err
	}
	buf := last.buf
	if last.d != d || !buf.Contains(r.Remote, r.Length) {
		if buf, err = d.Find(r.Remote, r.Length); err != nil {
			return d, nil, nil, err
		}
	}
	t, err := e.pick(st, d, buf, region, r)
	if err != nil {
		return d, nil, nil, err
	}
	return d, buf, t, nil
}

// completer is the batch as its transports see it: unexported, so only a
// transport can end a task.
type completer Batch

// Complete ends task i of generation gen with the transport's outcome
// (transport.Completer). The transport calls it once, after it stopped
// touching the task's memory.
func (c *completer) Complete(i int, gen uint64, err error) { (*Batch)(c).complete(i, gen, err) }

func (b *Batch) complete(i int, gen uint64, err error) {
	if i < 0 || i >= len(b.tasks) {
		b.e.stats.strayCompletions.Add(1)
		return
	}
	t := &b.tasks[i]
	// Win the task first, then record: a completion of another generation
	// (late, duplicated: a transport bug) finds another word and changes
	// nothing, not even the error of the task that reuses the slot. A
	// success has nothing to record first, so it publishes its state in the
	// same compare-and-swap.
	pending := gen<<stateBits | uint64(Pending)
	if err == nil {
		if !t.word.CompareAndSwap(pending, gen<<stateBits|uint64(Completed)) {
			b.e.stats.strayCompletions.Add(1)
			return
		}
		region := b.reqs[i].Region
		b.nDone.Add(1)
		b.bytes.Add(t.length)
		if b.pending.Add(-1) == 0 {
			b.settle()
		}
		region.Release()
		return
	}
	if !t.word.CompareAndSwap(pending, gen<<stateBits|completing) {
		b.e.stats.strayCompletions.Add(1)
		return
	}
	var state TaskState
	switch t.why.Load() {
	case whyTimeout:
		state = Timeout
		if errs.CodeOf(err) == errs.Canceled {
			err = errs.Wrap(errs.Timeout, "transfer", err, "not finished within %v", b.e.cfg.TransferTimeout)
		}
	case whyCanceled:
		state = Canceled
	default:
		state = Failed
	}
	t.err = err
	t.word.Store(gen<<stateBits | uint64(state))
	// The hold on the local region goes last, once the task is counted:
	// UnregisterMemory returns when its regions are idle and promises the
	// tasks on them have ended, so a caller must not find one pending then.
	// (A settled batch may be reset at once, so the region is read first.)
	region := b.reqs[i].Region
	b.failed(t, state, err)
	if b.pending.Add(-1) == 0 {
		b.settle()
	}
	region.Release()
}

// failed records a task that did not complete (the rare path, under mu).
func (b *Batch) failed(t *task, state TaskState, err error) {
	// Before the batch can be seen done: a caller that resubmits on
	// failure must get a refreshed descriptor.
	b.e.invalidate(t.st, err)
	b.mu.Lock()
	b.nFail.Add(1)
	if b.firstErr == nil {
		b.firstErr = err
	}
	if rank(state) > rank(b.worst) {
		b.worst = state
	}
	switch state {
	case Timeout:
		b.timedOut++
	case Canceled:
		b.canceled++
	}
	b.mu.Unlock()
}

// settle runs when nothing is pending: it sends the batch's notify first (the
// batch stays PENDING until it is on the wire), then wakes the waiters.
func (b *Batch) settle() {
	b.mu.Lock()
	if b.pending.Load() != 0 || b.settled {
		b.mu.Unlock() // a submit reopened the batch, or a notify settles it
		return
	}
	if n := b.notify; n != nil {
		b.notify = nil
		if b.nFail.Load() == 0 {
			b.pending.Add(1) // held by the notify until it is delivered
			b.mu.Unlock()
			if !b.e.goTracked(func() { b.sendNotify(n) }) {
				b.notifyFailed(errs.New(errs.Closed, "notify", "engine closed before the batch's notify was sent"))
			}
			return
		}
	}
	b.settled = true
	b.flushStats()
	b.observeTransfer(b.flushHistograms())
	b.logBatch()
	if b.done != nil {
		close(b.done)
		b.done = nil
	}
	if b.efd > 0 {
		signalFD(b.efd)
	}
	b.mu.Unlock()
}

func (b *Batch) sendNotify(n *batchNotify) {
	if err := b.e.SendNotify(n.segment, n.name, n.msg); err != nil {
		b.notifyFailed(err)
		return
	}
	if b.pending.Add(-1) == 0 {
		b.settle()
	}
}

// notifyFailed fails the batch: every task completed but the peer was not
// told, and callers count on the notify to know the bytes are there.
func (b *Batch) notifyFailed(err error) {
	err = errs.Wrap(errs.CodeOf(err), "notify", err, "tasks completed but the batch's notify was not delivered")
	b.mu.Lock()
	b.notifyErr = err
	b.mu.Unlock()
	b.e.cfg.Logger.Warn("te: batch notify", "err", err)
	if b.pending.Add(-1) == 0 {
		b.settle()
	}
}

// flushStats adds what the batch did since the last flush to the engine's
// counters: one update per settle instead of two global atomics per task.
// Called with mu held.
func (b *Batch) flushStats() {
	d, f, by := b.nDone.Load(), b.nFail.Load(), b.bytes.Load()
	s := &b.e.stats
	if x := d - b.flushDone; x > 0 {
		s.completed.Add(uint64(x))
	}
	if x := by - b.flushB; x > 0 {
		s.bytes.Add(x)
	}
	if x := f - b.flushFail; x > 0 {
		s.failed.Add(uint64(x) - uint64(b.timedOut+b.canceled))
		s.timedOut.Add(uint64(b.timedOut))
		s.canceled.Add(uint64(b.canceled))
	}
	b.flushDone, b.flushFail, b.flushB = d, f, by
	b.timedOut, b.canceled = 0, 0
}

// cancel asks the transports to end tasks [lo, hi) of generation gen that are
// still pending; they end with state why (TIMEOUT or CANCELED) once the
// transport has let go of them.
func (b *Batch) cancel(gen uint32, lo, hi int, why int32) {
	b.smu.Lock()
	defer b.smu.Unlock()
	b.mu.Lock()
	if b.gen != gen || b.freed {
		b.mu.Unlock()
		return
	}
	hi = min(hi, b.n)
	b.mu.Unlock()
	b.cancelWhere(lo, hi, why, nil)
}

// cancelWhere cancels the pending tasks in [lo, hi) (those whose local region
// is in rs, if rs is not nil). Called with smu held.
func (b *Batch) cancelWhere(lo, hi int, why int32, rs []*segment.Region) {
	byT := map[transport.Transport][]*transport.Request{}
	for i := lo; i < hi; i++ {
		t := &b.tasks[i]
		if t.state() != Pending {
			continue
		}
		if rs != nil && !holds(rs, &b.reqs[i], b.e.instance) {
			continue
		}
		t.why.CompareAndSwap(whyNone, why)
		byT[t.t] = append(byT[t.t], &b.reqs[i])
	}
	for tr, reqs := range byT {
		tr.Cancel(reqs)
	}
}

// holds reports whether request q touches one of rs: its local memory, or
// a file of this engine it targets (a file is only ever a target, reached
// through this engine's own segment).
func holds(rs []*segment.Region, q *transport.Request, self string) bool {
	for _, x := range rs {
		if x == q.Region {
			return true
		}
		if x.Storage != nil && q.Peer != nil && q.Peer.Instance == self &&
			q.Remote >= x.Addr && q.Remote-x.Addr < x.Length {
			return true
		}
	}
	return false
}

// Cancel ends every pending task early: each ends CANCELED (or with its real
// outcome if it finished first) once its transport has stopped touching its
// memory, which Wait then reports. Cancel itself does not block on the
// network, nor on a Submit validating its requests in another goroutine;
// that Submit's tasks are not pending yet and are not canceled.
func (b *Batch) Cancel() error {
	b.smu.Lock()
	defer b.smu.Unlock()
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return errs.New(errs.InvalidArgument, "cancel", "batch was freed")
	}
	n := b.n
	b.mu.Unlock()
	b.cancelWhere(0, n, whyCanceled, nil)
	return nil
}

// TaskStatus returns the state of task i (in submission order). It is safe
// to call at any time, from any goroutine, Reset and Free included: a task
// of a reset or freed batch is Invalid.
func (b *Batch) TaskStatus(i int) (TaskStatus, error) {
	// The slot is read under mu, which Reset and Free hold while they
	// empty the slots and a submit holds while it publishes new ones.
	b.mu.Lock()
	defer b.mu.Unlock()
	if i < 0 || i >= b.n { // a freed batch has no tasks
		return TaskStatus{State: Invalid}, errs.New(errs.InvalidArgument, "task status", "task %d of %d", i, b.n)
	}
	t := &b.tasks[i]
	s := TaskStatus{State: t.state(), Transport: t.t.Name()}
	if s.State == Completed {
		s.Transferred = t.length
	} else if s.State != Pending {
		s.Err = t.err
	}
	return s, nil
}

// Status sums up the batch. It is O(1): Wait and pollers call it on every
// check and batches hold thousands of tasks.
func (b *Batch) Status() BatchStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.statusLocked()
}

func (b *Batch) statusLocked() BatchStatus {
	s := BatchStatus{
		State: Completed, Tasks: b.n, Completed: int(b.nDone.Load()), Transferred: b.bytes.Load(),
		Err: b.firstErr,
	}
	s.Failed = int(b.nFail.Load())
	if b.worst != 0 {
		s.State = b.worst
	}
	if b.notifyErr != nil {
		s.State = Failed
		if s.Err == nil {
			s.Err = b.notifyErr
		}
	}
	switch {
	case b.n == 0:
		s.State = Waiting
	case !b.settled:
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

// Done returns a channel closed once every submitted task has finished (and a
// batch notify was sent). The channel is made only when someone waits while
// tasks are pending: a batch that finished before anyone looked costs none.
func (b *Batch) Done() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.doneLocked()
}

func (b *Batch) doneLocked() chan struct{} {
	if b.settled {
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
	if b.settled {
		s := b.statusLocked()
		b.mu.Unlock()
		return s, nil
	}
	done := b.doneLocked()
	var hs [2]transport.Harvester
	harvest := b.harvestersLocked(hs[:0])
	b.mu.Unlock()
	for _, h := range harvest {
		// Completions collected here end the wait without the poller
		// handing them over; whatever is left, the channel gets.
		h.Harvest(done)
	}
	if timeout < 0 {
		<-done
		b.observeWakeup()
		return b.Status(), nil
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		b.observeWakeup()
		return b.Status(), nil
	case <-t.C:
		return b.Status(), errs.New(errs.Timeout, "wait", "batch not finished within %v", timeout)
	}
}

// harvestMax is the largest batch whose waiter collects completions itself
// (transport.Harvester): a large batch keeps the transport's pollers busy
// for long, and a waiter spinning beside them only takes their CPU.
const harvestMax = 32

// harvestersLocked appends the harvesting transports of a small batch's
// tasks to hs (each once). Called with mu held.
func (b *Batch) harvestersLocked(hs []transport.Harvester) []transport.Harvester {
	if b.n > harvestMax {
		return hs
	}
	for i := range b.tasks[:b.n] {
		h, ok := b.tasks[i].t.(transport.Harvester)
		if !ok || slices.Contains(hs, h) {
			continue
		}
		if len(hs) == cap(hs) {
			break
		}
		hs = append(hs, h)
	}
	return hs
}

// Reset empties a finished batch so its slots can take new requests; it is
// refused with BatchBusy while tasks are pending or a Submit is in progress.
// A reused batch allocates nothing per submit.
func (b *Batch) Reset() error {
	b.smu.Lock()
	defer b.smu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed {
		return errs.New(errs.InvalidArgument, "reset batch", "batch was freed")
	}
	if !b.settled {
		return errs.New(errs.BatchBusy, "reset batch", "%d tasks still in flight", b.pending.Load())
	}
	if b.preparing {
		return errs.New(errs.BatchBusy, "reset batch", "a submit is in progress")
	}
	resetTasks(b.tasks[:b.n])
	clear(b.reqs[:b.n])
	b.n = 0
	b.gen++
	b.nDone.Store(0)
	b.nFail.Store(0)
	b.bytes.Store(0)
	b.flushDone, b.flushFail, b.flushB = 0, 0, 0
	b.histFrom, b.peerOf = 0, nil
	b.worst, b.firstErr, b.notify, b.notifyErr = 0, nil, nil, nil
	return nil
}

// Free releases the batch. It is refused with BatchBusy while tasks are
// pending or a Submit is in progress; freeing twice is an InvalidArgument
// error. It does not block on the network.
func (b *Batch) Free() error {
	b.smu.Lock()
	defer b.smu.Unlock()
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return errs.New(errs.InvalidArgument, "free batch", "batch already freed")
	}
	if !b.settled || b.preparing {
		n := b.pending.Load()
		b.mu.Unlock()
		if n == 0 {
			return errs.New(errs.BatchBusy, "free batch", "a submit is in progress")
		}
		return errs.New(errs.BatchBusy, "free batch", "%d tasks still in flight", n)
	}
	b.freed = true
	b.gen++
	b.closeFD()
	b.n = 0
	b.nDone.Store(0) // a freed batch reports nothing, like a reset one
	b.nFail.Store(0)
	b.bytes.Store(0)
	b.flushDone, b.flushFail, b.flushB = 0, 0, 0
	b.worst, b.firstErr, b.notify, b.notifyErr = 0, nil, nil, nil
	b.mu.Unlock()
	putSlots(b.tasks, b.reqs)
	b.e.batchMu.Lock()
	delete(b.e.batches, b)
	b.e.batchMu.Unlock()
	return nil
}

// failUnclaimed ends, after Close closed the transports (which complete all
// they hold), whatever is still pending: nothing can run it any more.
func (b *Batch) failUnclaimed() {
	b.smu.Lock()
	defer b.smu.Unlock()
	b.mu.Lock()
	n := b.n
	b.mu.Unlock()
	for i := 0; i < n; i++ {
		if w := b.tasks[i].word.Load(); TaskState(w&stateMask) == Pending {
			b.complete(i, w>>stateBits, errs.New(errs.Closed, "transfer", "engine closed"))
		}
	}
}
