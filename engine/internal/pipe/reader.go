package pipe

import (
	"bufio"
	"net"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Reader is a connection's reading side as a Decoder sees it: the buffered
// socket, and the claims on the items replies answer.
type Reader[T Item] struct {
	c     *conn[T]
	nc    net.Conn
	br    *bufio.Reader
	armed time.Time // when the silence deadline was last pushed out
	moved bool      // a Decoder set a read deadline of its own
	own   *Slot[T]  // claimed and not yet settled
	slot  Slot[T]
}

// Slot is a reply's claim on the item it answers.
type Slot[T Item] struct {
	// Item is the item answered.
	Item     T
	id       uint64
	held     bool // the writer is still sending it
	released bool
}

// Released reports whether the item was canceled and settled already: its
// reply is to be read (a payload into scratch) and dropped.
func (s Slot[T]) Released() bool { return s.released }

// Buf returns the buffered socket.
func (r *Reader[T]) Buf() *bufio.Reader { return r.br }

// Conn returns the socket, for reads that bypass the buffer.
func (r *Reader[T]) Conn() net.Conn { return r.nc }

// Addr returns the peer's address.
func (r *Reader[T]) Addr() string { return r.c.pe.addr }

// Moved tells the reader that the Decoder set a read deadline of its own,
// so the reader sets its own again before it waits for the next reply.
func (r *Reader[T]) Moved() { r.moved = true }

// Lost is the error of a connection whose read failed.
func (r *Reader[T]) Lost(err error) error {
	o := &r.c.pe.pool.o
	return errs.Wrap(errs.PeerUnreachable, o.Component, err, "connection to %s%s lost", o.Label, r.c.pe.addr)
}

// Protocol is the error of a connection whose peer broke the framing.
func (r *Reader[T]) Protocol(format string, args ...any) error {
	o := &r.c.pe.pool.o
	return errs.New(errs.Protocol, o.Component, "%s%s: "+format, append([]any{o.Label, r.c.pe.addr}, args...)...)
}

// Take claims the item the writer numbered id. An id not in flight (never
// sent, or answered already) is a Protocol error: the connection cannot be
// trusted past it.
func (r *Reader[T]) Take(id uint64) (Slot[T], error) {
	c := r.c
	c.mu.Lock()
	s, ok := c.pending[id]
	if !ok || s.answered {
		c.mu.Unlock()
		return Slot[T]{}, r.Protocol("answered request %d, which is not in flight", id)
	}
	return r.claim(id, s), nil
}

// Oldest claims the oldest item in flight, for Ordered dialects; none in
// flight is a Protocol error.
func (r *Reader[T]) Oldest() (Slot[T], error) {
	c := r.c
	c.mu.Lock()
	for c.oldest < c.nextID {
		id := c.oldest
		c.oldest++
		if s, ok := c.pending[id]; ok {
			return r.claim(id, s), nil
		}
	}
	c.mu.Unlock()
	return Slot[T]{}, r.Protocol("answered with nothing in flight")
}

// claim hands the item of pending slot s to the reader; c.mu is held and
// released here.
func (r *Reader[T]) claim(id uint64, s slot[T]) Slot[T] {
	c := r.c
	if c.held(id, s) {
		c.mu.Unlock()
		return Slot[T]{Item: s.item, id: id, held: true}
	}
	delete(c.pending, id)
	if c.starved {
		c.starved = false
		c.signal()
	}
	if s.released {
		c.mu.Unlock()
		return Slot[T]{Item: s.item, id: id, released: true}
	}
	c.owned.Add(1)
	c.mu.Unlock()
	r.slot = Slot[T]{Item: s.item, id: id}
	r.own = &r.slot
	return r.slot
}

// Done settles the claimed item with the reply's outcome: at once, or, while
// the writer still sends its payload, once the writer is past it (an item
// whose payload never leaves fails instead). Released items are left alone.
func (r *Reader[T]) Done(s Slot[T], err error) {
	if s.released {
		return
	}
	c := r.c
	if s.held {
		c.mu.Lock()
		p, ok := c.pending[s.id]
		switch {
		case !ok || p.released || p.answered:
			// Settled already (the connection ended; released once sent).
			c.mu.Unlock()
			return
		case c.held(s.id, p):
			p.answered = true
			c.pending[s.id] = p
			c.answers = append(c.answers, answer{s.id, err})
			c.mu.Unlock()
			return
		}
		// The writer got past it since Take: the reader's now.
		delete(c.pending, s.id)
		c.mu.Unlock()
		s.Item.Done(err)
		return
	}
	if r.own != nil && r.own.id == s.id {
		r.own = nil
	}
	c.owned.Add(-1)
	s.Item.Done(err)
}

// settleOwned settles an item the Decoder claimed and left unsettled.
func (r *Reader[T]) settleOwned(err error) {
	if r.own != nil {
		r.Done(*r.own, err)
	}
}

// wait returns once the next reply's first byte is buffered. With Silence,
// a connection with items in flight whose peer says nothing for that long
// fails; an idle one waits on. The deadline moves at most every quarter of
// Silence: a timer update per reply would cost more than the reply.
func (r *Reader[T]) wait() error {
	if r.br.Buffered() > 0 {
		return nil
	}
	o := &r.c.pe.pool.o
	for rearmed := false; ; {
		if rearmed {
			rearmed = false
		} else if o.Silence > 0 {
			if now := time.Now(); r.moved || now.Sub(r.armed) > o.Silence/4 {
				r.nc.SetReadDeadline(now.Add(o.Silence))
				r.armed, r.moved = now, false
			}
		} else if r.moved {
			r.nc.SetReadDeadline(time.Time{})
			r.moved = false
		}
		_, err := r.br.Peek(1)
		if err == nil {
			return nil
		}
		if o.Silence > 0 && isTimeout(err) {
			r.c.mu.Lock()
			busy, since := r.c.busyLocked(), r.c.busySince
			r.c.mu.Unlock()
			if !busy {
				r.armed = time.Time{} // an idle pool connection: fine
				continue
			}
			if end := since.Add(o.Silence); time.Now().Before(end) {
				// Armed while idle: the requests have waited less than
				// Silence; give them the rest.
				r.nc.SetReadDeadline(end)
				rearmed = true
				continue
			}
			return errs.New(errs.PeerUnreachable, o.Component, "no answer from %s%s for %v with requests in flight", o.Label, r.c.pe.addr, o.Silence)
		}
		return r.Lost(err)
	}
}
