package pipe

import (
	"bufio"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
)

// entry is a queued item and how often it was sent before.
type entry[T Item] struct {
	item  T
	tries uint8
}

// slot is an item the writer took: in flight until its reply settles it.
// It is small (a map value per item in flight); whether the writer is still
// sending it follows from its id (conn.sentThrough).
type slot[T Item] struct {
	entry[T]
	released bool // canceled and settled: its reply, when it comes, is dropped
	answered bool // its reply came while the writer held it (conn.answers)
}

// answer is the outcome of a reply that came while the writer held its
// item; the writer settles the item with it once past it.
type answer struct {
	id  uint64
	err error
}

// conn is one connection: the writer goroutine dials, opens, then writes
// queued items; the reader goroutine settles them as replies come. The last
// of the two to exit settles whatever is left.
type conn[T Item] struct {
	pe *Peer[T]

	mu      sync.Mutex
	queue   []entry[T]
	pending map[uint64]slot[T]
	// sentThrough: every item with a lower id had all its bytes handed
	// to the socket. The writer writes items in id order, so an item
	// that Holds and is at or above it is the writer's.
	sentThrough uint64
	// answers are the outcomes of replies that came for items the
	// writer still held; they are settled once it is past them.
	answers    []answer
	cancelHeld bool // cancel skipped a held item: sent looks again
	// busySince is when the connection last went from idle to busy: the
	// reader's silence bound counts from it, not from a deadline armed
	// while the connection was idle.
	busySince time.Time
	nextID    uint64
	oldest    uint64       // Ordered: the id the next reply answers
	owned     atomic.Int32 // items the reader claimed and has not settled
	starved   bool         // the writer left items queued at MaxInFlight
	dead      bool
	err       error
	requeue   bool // cut for another's sake: what it carries goes elsewhere
	nc        net.Conn
	running   int // goroutines not yet exited
	// settled and settledItems are the writer's scratch in sent.
	settled      []answer
	settledItems []T
	wake         chan struct{} // queue not empty, or room in flight again
	down         chan struct{} // closed when dead
	opened       chan struct{} // closed once dialed and opened (Peer.Warm waits on it)
}

func (p *Pool[T]) newConn(pe *Peer[T]) *conn[T] {
	c := &conn[T]{pe: pe, pending: map[uint64]slot[T]{}, wake: make(chan struct{}, 1), down: make(chan struct{}),
		opened: make(chan struct{}), running: 1}
	p.mu.Lock()
	if p.closed != nil {
		err := p.closed
		p.mu.Unlock()
		c.dead, c.err, c.running = true, err, 0
		close(c.down)
		return c
	}
	p.wg.Add(1)
	p.mu.Unlock()
	go c.writeLoop()
	return c
}

// deadConn is a connection that failed before it started, for items whose
// peer could not be had.
func deadConn[T Item](pe *Peer[T], err error) *conn[T] {
	c := &conn[T]{pe: pe, dead: true, err: err, down: make(chan struct{})}
	close(c.down)
	return c
}

func (c *conn[T]) alive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.dead
}

// held reports whether the writer still sends the item with id; c.mu is
// held.
func (c *conn[T]) held(id uint64, s slot[T]) bool { return id >= c.sentThrough && s.item.Holds() }

// state reports whether the connection has items queued, in flight or being
// read, and whether it is alive.
func (c *conn[T]) state() (busy, alive bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.busyLocked(), !c.dead
}

func (c *conn[T]) busyLocked() bool {
	return len(c.queue) > 0 || len(c.pending) > 0 || c.owned.Load() > 0
}

func (c *conn[T]) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// enqueue queues items (or entries sent before); on a dead connection they
// fail with its error, or go to another connection if it was cut for
// another's sake.
func (c *conn[T]) enqueue(items []T, es []entry[T]) {
	c.mu.Lock()
	if c.dead {
		err, rq := c.err, c.requeue
		c.mu.Unlock()
		if rq {
			if es == nil {
				es = make([]entry[T], len(items))
				for i, it := range items {
					es[i].item = it
				}
			}
			c.pe.retry(es, err)
			return
		}
		for _, it := range items {
			it.Done(err)
		}
		for _, e := range es {
			e.item.Done(err)
		}
		return
	}
	if !c.busyLocked() {
		c.busySince = time.Now()
	}
	c.queue = slices.Grow(c.queue, len(items)+len(es))
	for _, it := range items {
		c.queue = append(c.queue, entry[T]{item: it})
	}
	c.queue = append(c.queue, es...)
	c.mu.Unlock()
	c.signal()
}

// cut marks the connection dead with err and closes its socket, so both
// goroutines return promptly; requeue sends what it carries elsewhere. It
// reports whether it was alive.
func (c *conn[T]) cut(err error, requeue bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cutLocked(err, requeue)
}

func (c *conn[T]) cutLocked(err error, requeue bool) bool {
	if c.dead {
		return false
	}
	c.dead, c.err, c.requeue = true, err, requeue
	close(c.down)
	if c.nc != nil {
		c.nc.Close()
	}
	return true
}

// cancel settles the canceled items nobody is moving: queued ones, and those
// in flight (released: their replies are dropped). One being written is the
// writer's to release once it is past it; one being read is the reader's.
// With an Ordered dialect an item in flight cannot be released: the
// connection is cut and the others go elsewhere.
func (c *conn[T]) cancel() {
	var out []T
	heldCanceled := false
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return // its last goroutine settles the canceled items
	}
	keep := c.queue[:0]
	for _, e := range c.queue {
		if e.item.Canceled() {
			out = append(out, e.item)
		} else {
			keep = append(keep, e)
		}
	}
	clear(c.queue[len(keep):])
	c.queue = keep
	o := &c.pe.pool.o
	for id, s := range c.pending {
		if s.released || !s.item.Canceled() {
			continue
		}
		if s.answered {
			continue // the writer settles it with its reply
		}
		if c.held(id, s) {
			c.cancelHeld = true // the writer releases it once past it
			heldCanceled = true
			continue
		}
		if o.Ordered {
			c.cutLocked(errs.New(errs.PeerUnreachable, o.Component,
				"connection to %s%s closed to abandon a canceled request", o.Label, c.pe.addr), true)
			break
		}
		s.released = true
		c.pending[id] = s
		out = append(out, s.item)
	}
	c.mu.Unlock()
	if heldCanceled {
		// The writer is inside a canceled item's payload: on a live peer
		// it is past it in moments. A peer that stopped reading would keep
		// it there for the progress timeout, and the cancel (a transfer
		// timeout shorter than that) with it: past heldCancelGrace the
		// connection is cut, which stops the writer, and the other items
		// go elsewhere.
		time.AfterFunc(heldCancelGrace, c.cutIfStillHeld)
	}
	err := o.canceled()
	for _, it := range out {
		it.Done(err)
	}
}

// heldCancelGrace is how long a canceled item may stay with a writer stuck
// in its payload before its connection is cut.
const heldCancelGrace = 200 * time.Millisecond

// cutIfStillHeld cuts the connection if the writer still holds a canceled
// item.
func (c *conn[T]) cutIfStillHeld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	for id, s := range c.pending {
		if !s.released && !s.answered && s.item.Canceled() && c.held(id, s) {
			o := &c.pe.pool.o
			c.cutLocked(errs.New(errs.PeerUnreachable, o.Component,
				"connection to %s%s closed to abandon a canceled request its peer does not read", o.Label, c.pe.addr), true)
			return
		}
	}
}

// exit is the last thing each goroutine does; the last one out settles
// every item still queued or in flight.
func (c *conn[T]) exit() {
	p := c.pe.pool
	c.mu.Lock()
	c.running--
	if c.running > 0 {
		c.mu.Unlock()
		p.wg.Done()
		return
	}
	if !c.dead {
		c.dead, c.err = true, errs.New(errs.PeerUnreachable, p.o.Component, "connection to %s%s ended", p.o.Label, c.pe.addr)
		close(c.down)
	}
	if c.nc != nil {
		c.nc.Close()
	}
	err, requeue := c.err, c.requeue
	queue, pending := c.queue, c.pending
	answered := make(map[uint64]error, len(c.answers))
	for _, a := range c.answers {
		answered[a.id] = a.err
	}
	c.queue, c.pending, c.answers = nil, nil, nil
	c.mu.Unlock()
	canceled := p.o.canceled()
	var again []entry[T]
	// In the order they were sent: an Ordered peer gets them again so.
	ids := make([]uint64, 0, len(pending))
	for id := range pending {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := pending[id]
		reply := answered[id]
		switch {
		case s.released:
		case s.answered && reply != nil:
			s.item.Done(reply)
		case s.answered: // an OK for bytes that never left
			s.item.Done(errs.New(errs.Protocol, p.o.Component,
				"%s%s answered request %d before its payload was sent", p.o.Label, c.pe.addr, id))
		case s.item.Canceled():
			s.item.Done(canceled)
		case requeue:
			s.tries++
			again = append(again, s.entry)
		default:
			s.item.Done(err)
		}
	}
	for _, e := range queue {
		switch {
		case e.item.Canceled():
			e.item.Done(canceled)
		case requeue:
			again = append(again, e)
		default:
			e.item.Done(err)
		}
	}
	if len(again) > 0 {
		c.pe.retry(again, err)
	}
	p.forgetDead(c.pe)
	p.wg.Done()
}

func (c *conn[T]) writeLoop() {
	defer c.exit()
	p := c.pe.pool
	o := &p.o
	nc, err := p.d.Dial(p.ctx, c.pe.addr)
	if err != nil {
		c.cut(err, false)
		return
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		nc.Close()
		return
	}
	c.nc = nc
	c.mu.Unlock()
	enc, dec, err := p.d.Open(nc, c.pe.addr)
	if err != nil {
		c.cut(err, false)
		return
	}
	defer enc.Close() // before exit: what it holds is released before anything is settled
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		dec.Close()
		return
	}
	c.running++
	p.wg.Add(1)
	c.mu.Unlock()
	go c.readLoop(nc, dec)
	close(c.opened)

	var spare []entry[T]
	var out []Out[T]
	type refused struct {
		it  T
		err error
	}
	var stale []refused
	for {
		select {
		case <-c.wake:
		case <-c.down:
			return
		}
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return
		}
		room := o.MaxInFlight - len(c.pending)
		if len(c.queue) == 0 || room <= 0 {
			c.starved = len(c.queue) > 0
			c.mu.Unlock()
			continue
		}
		batch := c.queue
		if len(batch) > room {
			c.queue = append(spare[:0], batch[room:]...)
			batch = batch[:room]
		} else {
			c.queue = spare[:0]
		}
		out = out[:0]
		for _, e := range batch {
			if err := enc.Admit(e.item); err != nil {
				stale = append(stale, refused{e.item, err})
				continue
			}
			id := c.nextID
			c.nextID++
			c.pending[id] = slot[T]{entry: e}
			out = append(out, Out[T]{Item: e.item, ID: id})
		}
		if len(c.queue) > 0 {
			c.signal() // the rest, once there is room
		}
		c.mu.Unlock()
		clear(batch[:cap(batch)])
		spare = batch[:0]
		for i, s := range stale {
			s.it.Done(s.err)
			stale[i] = refused{}
		}
		stale = stale[:0]
		if len(out) == 0 {
			continue
		}
		n, err := enc.Encode(nc, out)
		c.sent(out, n)
		clear(out)
		if err != nil {
			c.cut(errs.Wrap(errs.PeerUnreachable, o.Component, err, "send to %s%s", o.Label, c.pe.addr), false)
			return
		}
	}
}

// sent ends the writer's hold on the items of its last write whose bytes all
// reached the socket (the first n): those answered meanwhile are settled with
// their reply, those canceled are released. The others (the write failed)
// stay held: the last goroutine out settles them.
func (c *conn[T]) sent(out []Out[T], n int64) {
	c.mu.Lock()
	through := out[len(out)-1].ID + 1
	for _, x := range out {
		if x.End > n {
			through = x.ID
			break
		}
	}
	c.sentThrough = through
	done, items := c.settled[:0], c.settledItems[:0]
	keep := c.answers[:0]
	for _, a := range c.answers {
		if a.id >= through {
			keep = append(keep, a)
			continue
		}
		done = append(done, a)
		items = append(items, c.pending[a.id].item)
		delete(c.pending, a.id)
	}
	clear(c.answers[len(keep):])
	c.answers = keep
	recancel := c.cancelHeld
	c.cancelHeld = false
	if len(done) > 0 && c.starved {
		c.starved = false
		c.signal()
	}
	c.mu.Unlock()
	for i, a := range done {
		items[i].Done(a.err)
	}
	clear(done)
	clear(items)
	c.settled, c.settledItems = done[:0], items[:0]
	if recancel {
		c.cancel()
	}
}

func (c *conn[T]) readLoop(nc net.Conn, dec Decoder[T]) {
	defer c.exit()
	defer dec.Close() // before exit, as the encoder's
	r := &Reader[T]{c: c, nc: nc, br: bufio.NewReaderSize(nc, c.pe.pool.o.ReadBuffer)}
	for {
		if err := r.wait(); err != nil {
			c.cut(err, false)
			return
		}
		if err := dec.Decode(r); err != nil {
			err, rq := isRequeue(err)
			c.cut(err, rq)
			r.settleOwned(err)
			return
		}
		if r.own != nil {
			r.settleOwned(errs.New(errs.Internal, c.pe.pool.o.Component, "a reply's request was not settled"))
		}
	}
}
