package rdma

import (
	"sync/atomic"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
)

// request is one transfer cut into slices of Options.Slice bytes (its
// Priv). Slices are not objects: slice i is [i*Slice, +Slice) of the
// request, generated when it is posted, so a submit costs per request, not
// per slice.
type request struct {
	r        *transport.Request // read only while a slice is outstanding
	tk       transport.Ticket   // completes it (kept: the slot is the engine's)
	pi       *peerInfo
	lkeys    []uint32
	rkeys    []uint32
	size     uint64 // slice size
	n        int32  // slices
	start    int    // pair of slice 0
	left     atomic.Int64
	err      atomic.Pointer[error]
	canceled atomic.Bool
}

// slice returns slice i's addresses and length.
func (q *request) slice(i int32) (local, remote uint64, n uint32) {
	off, sn := sliceAt(q.r.Length, q.size, int(i))
	return q.r.Local + off, q.r.Remote + off, uint32(sn)
}

func (q *request) sliceDone(err error) { q.slicesDone(1, err) }

// slicesDone ends k slices; the request completes with its last one, with
// the first error any slice had.
func (q *request) slicesDone(k int, err error) {
	if k <= 0 {
		return
	}
	if err != nil {
		e := err // only a failure pays for the pointer
		q.err.CompareAndSwap(nil, &e)
	}
	if q.left.Add(-int64(k)) == 0 {
		var e error
		if p := q.err.Load(); p != nil {
			e = *p
		}
		q.tk.Complete(e)
	}
}

// span is a run of a request's slices bound for one endpoint: slices idx,
// idx+step, ... below end, on their attempt-th try, under the keys of the
// endpoint's NIC pair.
type span struct {
	req           *request
	idx, end      int32
	step, attempt int32
	lkey, rkey    uint32
	next          int32 // Submit's grouping: the next span for the same endpoint
}

// count is how many slices the span still holds.
func (s *span) count() int {
	if s.idx >= s.end {
		return 0
	}
	return int((s.end - s.idx + s.step - 1) / s.step)
}

// wrEntry is a posted work request: which slice of which request, on which
// attempt. A fence (see fenceLocked) has no request.
type wrEntry struct {
	req          *request
	idx, attempt int32
}

// outcome collects what happened to slices under an endpoint's lock, to be
// acted on (completions, retries) once it is released.
type outcome struct {
	ok, failed, retry []wrEntry
	spans             []span // pending spans taken back: each slice retried
	canceled          []span // pending spans of canceled requests
	failErr           error  // why the entries in failed failed
}

func (o *outcome) reset() {
	clear(o.ok)
	clear(o.failed)
	clear(o.retry)
	clear(o.spans)
	clear(o.canceled)
	o.ok, o.failed, o.retry, o.spans, o.canceled = o.ok[:0], o.failed[:0], o.retry[:0], o.spans[:0], o.canceled[:0]
	o.failErr = nil
}

// finish acts on an outcome: completed slices end, failed and taken-back
// ones are retried (or end), canceled ones end Canceled.
func (t *Transport) finish(ep *endpoint, out *outcome) {
	for _, e := range out.ok {
		e.req.sliceDone(nil)
	}
	for i := range out.canceled {
		out.canceled[i].req.slicesDone(out.canceled[i].count(), errCanceled)
	}
	for _, e := range out.failed {
		t.retry(e, out.failErr)
	}
	if len(out.retry) > 0 || len(out.spans) > 0 {
		err := ep.error()
		for _, e := range out.retry {
			t.retry(e, err)
		}
		for i := range out.spans {
			s := &out.spans[i]
			for ; s.idx < s.end; s.idx += s.step {
				t.retry(wrEntry{req: s.req, idx: s.idx, attempt: s.attempt}, err)
			}
		}
	}
}

// Submit cuts each request into at most one span per NIC pair, groups the
// spans by endpoint and hands each endpoint its group at once: its slices
// go out as one chain of work requests, one doorbell per endpoint per
// submit (more only when a send queue or the completion queue is full).
// A submit allocates two slabs (requests, spans), nothing per slice, and
// takes no transport-wide lock once the endpoints are up.
func (t *Transport) Submit(reqs []transport.Request) {
	qs := make([]request, len(reqs))
	var pi *peerInfo
	nspans := 0
	for i := range reqs {
		r := &reqs[i]
		if pi == nil || pi.desc != r.Peer {
			pi = t.peerOf(r.Peer)
		}
		q := &qs[i]
		if err := t.prepare(r, q, pi); err != nil {
			r.Complete(err)
			continue
		}
		q.tk = r.Ticket()
		r.Priv = q
		nspans += min(len(pi.pairs), int(q.n))
	}
	slab := make([]span, 0, nspans)
	type group struct {
		ep         *endpoint
		head, tail int32
	}
	var small [8]group
	groups := small[:0]
	for i := range qs {
		q := &qs[i]
		if q.r == nil {
			continue
		}
		np := int32(len(q.pi.pairs))
		for k := int32(0); k < np && k < q.n; k++ {
			// Slice i goes to pair (start+i) mod np (pickPair, attempt 0).
			p := (q.start + int(k)) % int(np)
			s := span{req: q, idx: k, end: q.n, step: np, next: -1}
			ep, err := t.route(q.pi, p, &s)
			if err != nil {
				q.slicesDone(s.count(), err)
				continue
			}
			slab = append(slab, s)
			at := int32(len(slab) - 1)
			g := -1
			for x := range groups {
				if groups[x].ep == ep {
					g = x
					break
				}
			}
			if g < 0 {
				groups = append(groups, group{ep: ep, head: at, tail: at})
			} else {
				slab[groups[g].tail].next = at
				groups[g].tail = at
			}
		}
	}
	for _, g := range groups {
		g.ep.post(slab, g.head)
	}
}

func (t *Transport) prepare(r *transport.Request, q *request, pi *peerInfo) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "rdma", "transport closed")
	}
	if r.Length == 0 {
		return errs.New(errs.InvalidArgument, "rdma", "zero length")
	}
	n := sliceCount(r.Length, t.opt.Slice)
	if n <= 0 || n > 1<<30 {
		return errs.New(errs.InvalidArgument, "rdma", "%d bytes are too many slices of %d", r.Length, t.opt.Slice)
	}
	if pi.err != nil {
		return pi.err
	}
	if r.Buffer == nil || len(r.Buffer.Rkey) != len(pi.nics) {
		k := 0
		if r.Buffer != nil {
			k = len(r.Buffer.Rkey)
		}
		return errs.New(errs.StaleDescriptor, "rdma", "buffer at %#x of %q has %d rkeys for %d devices",
			r.Remote, r.Peer.Name, k, len(pi.nics))
	}
	if r.Region == nil {
		return errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) is not registered", r.Local, r.Length)
	}
	if len(r.Region.Desc.Lkey) != len(t.nics) {
		return errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) has no memory region on every NIC", r.Local, r.Length)
	}
	q.r, q.pi, q.lkeys, q.rkeys, q.size, q.n = r, pi, r.Region.Desc.Lkey, r.Buffer.Rkey, t.opt.Slice, int32(n)
	q.start = int(t.rr.Add(1) % uint64(len(pi.pairs)))
	q.left.Store(int64(n))
	return nil
}

// route returns the endpoint of pair p of the request's peer, lock-free
// when it is up, and sets the span's keys for that pair.
func (t *Transport) route(pi *peerInfo, p int, s *span) (*endpoint, error) {
	pair := pi.pairs[p]
	s.lkey, s.rkey = s.req.lkeys[pair[0]], s.req.rkeys[pair[1]]
	if ep := pi.eps[p].Load(); ep != nil && !ep.failed() {
		return ep, nil
	}
	ep, err := t.endpoint(pi, pair[0], pair[1])
	if err != nil {
		return nil, err
	}
	pi.eps[p].Store(ep)
	return ep, nil
}

// dispatch sends one slice to the endpoint of its NIC pair for its attempt.
func (t *Transport) dispatch(e wrEntry) {
	q := e.req
	p := pickPair(len(q.pi.pairs), q.start, int(e.idx), int(e.attempt))
	one := [1]span{{req: q, idx: e.idx, end: e.idx + 1, step: 1, attempt: e.attempt, next: -1}}
	ep, err := t.route(q.pi, p, &one[0])
	if err != nil {
		q.sliceDone(err)
		return
	}
	ep.post(one[:], 0)
}

// complete handles the completion of work request id on n (called by the
// NIC's poller only). A completion stands for every earlier work request
// of its queue pair too: the send queue of an RC queue pair completes in
// order, and only every few work requests are signaled.
func (t *Transport) complete(n *nic, id uint64, status, vendorErr uint32) {
	qs := n.qpAt(uint32(id >> 32))
	if qs == nil {
		return // its queue pair is gone: Close accounted for it
	}
	ep := qs.ep
	var err error
	if status != ibv.WCSuccess {
		err = wcError(ep, status, vendorErr)
	}
	out := &n.scratch // the poller's own: no allocation per completion
	ep.mu.Lock()
	ep.completedLocked(qs, uint32(id), status, err, out)
	ep.mu.Unlock()
	t.finish(ep, out)
	out.reset()
	for _, e := range n.takeStarved() {
		e.kick()
	}
}

// wcError turns a failed completion into a te error.
func wcError(ep *endpoint, status, vendorErr uint32) error {
	code := errs.PeerUnreachable
	if status == ibv.WCRemAccessErr {
		// The peer's NIC refused the rkey or range: the region was
		// unregistered (and maybe registered again) since the descriptor.
		code = errs.StaleDescriptor
	}
	return errs.New(code, "rdma", "work request on %s -> %s@%s: %s (vendor error %#x)",
		ep.nic.name, ep.peer.name, ep.peer.nic, ibv.WCStatusString(status), vendorErr)
}

// retryable says whether a slice that failed with err may be tried again
// on another NIC pair: transport-level failures yes; a refused key, a
// stale peer or a closed transport no.
func retryable(err error) bool {
	switch errs.CodeOf(err) {
	case errs.PeerUnreachable, errs.Timeout, errs.Internal, errs.NoMemory, errs.Protocol:
		return true
	}
	return false
}

// retry sends a slice that did not run to the next NIC pair, or ends it.
// A slice of a canceled request ends Canceled; one flushed because its
// endpoint was torn down for someone else's cancellation goes again
// without spending an attempt.
func (t *Transport) retry(e wrEntry, err error) {
	switch {
	case t.closing.Load():
		e.req.sliceDone(errs.Wrap(errs.Closed, "rdma", err, "transport closed"))
	case e.req.canceled.Load():
		e.req.sliceDone(errCanceled)
	case err == errTornDown:
		t.dispatch(e)
	case int(e.attempt) >= t.opt.Retries || !retryable(err):
		e.req.sliceDone(err)
	default:
		e.attempt++
		t.dispatch(e)
	}
}
