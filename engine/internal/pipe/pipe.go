package pipe

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Item is one unit of work on a connection: a slice of a transfer, a control
// call. Implementations are small values or pointers; the pipe copies them.
type Item interface {
	// Canceled reports whether the item's owner gave it up (read after the
	// owner called Peer.Cancel, from any goroutine).
	Canceled() bool
	// Holds reports whether writing the item reads its owner's memory (a
	// WRITE's payload): such an item is settled only once the writer is
	// past it.
	Holds() bool
	// Done settles the item: called exactly once, from any goroutine, once
	// nothing of the connection touches its memory or sends its bytes.
	Done(err error)
}

// Dialect is a framing: how a connection to a peer is made and opened, and
// the halves that write requests and read replies on it.
type Dialect[T Item] interface {
	// Dial connects to addr; ctx ends when the pool closes.
	Dial(ctx context.Context, addr string) (net.Conn, error)
	// Open runs the connection's opening exchange (preface,
	// authentication) in the writer goroutine. A Close of nc by the pool
	// ends it.
	Open(nc net.Conn, addr string) (Encoder[T], Decoder[T], error)
}

// Out is an item the writer is sending: ID is what the connection numbered
// it (unique on the connection, increasing in the order of the write), End
// is set by Encode to the offset just past its last byte in that write.
type Out[T Item] struct {
	Item T
	ID   uint64
	End  int64
}

// Encoder is a connection's writing half; only the writer goroutine calls it.
type Encoder[T Item] interface {
	// Admit says whether it may go on this connection: nil, or the error
	// it fails with (it was built for another peer than the one that
	// answered the opening, say).
	Admit(it T) error
	// Encode writes the frames of out in order, sets each End, and returns
	// how many bytes reached the socket. It returns only once it no longer
	// touches any item's memory.
	Encode(nc net.Conn, out []Out[T]) (int64, error)
	// Close releases what the half holds; the pipe calls it before it
	// settles anything the connection still held.
	Close()
}

// Decoder is a connection's reading half; only the reader goroutine calls
// it.
type Decoder[T Item] interface {
	// Decode reads one reply, claims its item (Reader.Take or
	// Reader.Oldest) and settles it (Reader.Done). An error ends the
	// connection (wrap it with Requeue to send the other items again); an
	// item claimed and not settled is settled with that error.
	Decode(r *Reader[T]) error
	// Close releases what the half holds, as Encoder.Close.
	Close()
}

// Options are a pool's parameters.
type Options struct {
	// Conns is the number of connections per peer (at least 1).
	Conns int
	// Ordered: replies come in the order of the requests and carry no id.
	Ordered bool
	// Retries bounds how often an item in flight is sent again after its
	// connection was cut for another item's sake (Requeue, Ordered
	// cancellation).
	Retries int
	// Silence fails a connection with items in flight whose peer sent
	// nothing for this long (0: no bound; the callers have their own).
	Silence time.Duration
	// PeerIdle prunes a peer, with its connections, after this long without
	// an item (0: never).
	PeerIdle time.Duration
	// MaxInFlight bounds the items written and not yet answered on one
	// connection (default 4096).
	MaxInFlight int
	// ReadBuffer is the reader's buffer size (default 64 KiB): small
	// replies that arrive together are read with one system call.
	ReadBuffer int
	// Component and Label name the pool and a peer in errors ("tcp" and
	// "Mooncake peer " make "tcp: connection to Mooncake peer h:p lost").
	Component, Label string
}

func (o *Options) fill() {
	o.Conns = max(o.Conns, 1)
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 4096
	}
	if o.ReadBuffer <= 0 {
		o.ReadBuffer = 64 << 10
	}
	o.Retries = max(o.Retries, 0)
}

// requeued marks a Decode error after which the connection's other items
// go to another connection.
type requeued struct{ error }

func (r requeued) Unwrap() error { return r.error }

// Requeue wraps a Decode error so that the items the connection still
// carries, other than the one the error is about, are sent again on another
// connection rather than failed: the peer refused one item and closed, so it
// served none after it.
func Requeue(err error) error { return requeued{err} }

func isRequeue(err error) (error, bool) {
	var r requeued
	if errors.As(err, &r) {
		return r.error, true
	}
	return err, false
}

func (o *Options) canceled() error {
	return errs.New(errs.Canceled, o.Component, "request canceled before it finished")
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
