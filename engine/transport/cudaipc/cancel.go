package cudaipc

import (
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

// reqState is a request's Priv: the request, the ticket that completes it,
// and whether its Submit goroutine has taken it (from then on its copy may
// be on a stream) or Cancel has ended it first.
type reqState struct {
	r  *transport.Request // read only by whoever claimed s
	tk transport.Ticket
	s  atomic.Int32
}

const (
	reqWaiting int32 = iota
	reqClaimed
	reqCanceled
)

// claim takes the request for copying unless it was canceled.
func (s *reqState) claim() bool { return s.s.CompareAndSwap(reqWaiting, reqClaimed) }

// Cancel ends the requests whose copy has not been prepared yet: they
// complete Canceled at once, having touched nothing. A copy already
// enqueued on a stream cannot be torn mid-way (the driver has no way to
// withdraw it), so such a request completes, with its real outcome, once
// its stream has synchronised: never earlier, since until then the GPU may
// still read or write its memory.
func (t *Transport) Cancel(reqs []*transport.Request) {
	for _, r := range reqs {
		if s, ok := r.Priv.(*reqState); ok && s != nil && s.s.CompareAndSwap(reqWaiting, reqCanceled) {
			s.tk.Complete(errs.New(errs.Canceled, "cudaipc", "canceled before its copy was enqueued"))
		}
	}
}

// Quiesce has nothing to cut: a peer's copies into r go through its own
// mapping of r's IPC handle, which the owner does not count. Unregister is
// the fence: it runs the close protocol, which returns once every peer that
// opened the handle has confirmed that its copies ended and its mapping is
// closed, or has exited. Copies within this engine are counted by the
// registry, which the engine waits for.
func (t *Transport) Quiesce(*segment.Region) error { return nil }
