package rdma

import (
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

var (
	errCanceled error = errs.New(errs.Canceled, "rdma", "canceled")
	// errTornDown is why slices of other requests were flushed from an
	// endpoint that Cancel moved to the error state: they go again, on a
	// new endpoint, without spending an attempt.
	errTornDown error = errs.New(errs.Canceled, "rdma", "endpoint torn down to cancel requests posted on it")
)

// Cancel ends the requests early. Slices not yet posted end at once. For
// slices posted on a queue pair, the endpoint's queue pairs are moved to
// the error state: the NIC flushes every outstanding work request with a
// completion, and each canceled request completes (Canceled) once the
// completions of all its slices have been polled, that is once the NIC
// will not touch its memory again. The other requests' slices on those
// queue pairs go again over a new endpoint (reconnected), as after a
// failure. Cancel does not wait for any of it.
func (t *Transport) Cancel(reqs []*transport.Request) {
	var small [8]*endpoint
	eps := small[:0]
	for _, r := range reqs {
		q, ok := r.Priv.(*request)
		if !ok || q == nil {
			continue
		}
		q.canceled.Store(true)
		for p := range q.pi.eps {
			ep := q.pi.eps[p].Load()
			if ep == nil {
				continue
			}
			seen := false
			for _, e := range eps {
				seen = seen || e == ep
			}
			if !seen {
				eps = append(eps, ep)
			}
		}
	}
	for _, ep := range eps {
		ep.cancel()
	}
}

// Quiesce has nothing to wait for: peers reach this engine's memory with
// one-sided RDMA, which the owner neither sees nor counts. The fence is
// Unregister, which deregisters the region's memory regions on every NIC:
// once ibv_dereg_mr returns, the NIC refuses the region's rkeys and no
// access of a peer touches the range any more.
func (t *Transport) Quiesce(*segment.Region) error { return nil }
