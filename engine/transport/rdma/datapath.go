package rdma

import (
	"errors"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
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
	pl       *plan
	lkeys    []uint32
	rkeys    []uint32
	size     uint64 // slice size
	n        int32  // slices
	split    bool   // a buffer has several memory regions per NIC: keys per slice (keysAt)
	left     atomic.Int64
	err      atomic.Pointer[error]
	canceled atomic.Bool
}

// slice returns slice i's addresses and length.
func (q *request) slice(i int32) (local, remote uint64, n uint32) {
	off, sn := sliceAt(q.r.Length, q.size, int(i))
	return q.r.Local + off, q.r.Remote + off, uint32(sn)
}

// sliceLen is slice i's length.
func (q *request) sliceLen(i int32) uint64 {
	_, n := sliceAt(q.r.Length, q.size, int(i))
	return n
}

// spanBytes is the bytes of slices idx, idx+step, ... below end.
func (q *request) spanBytes(idx, end, step int32) uint64 {
	if idx >= end {
		return 0
	}
	k := uint64((end - idx + step - 1) / step)
	b := k * q.size
	last := q.n - 1
	if last >= idx && last < end && (last-idx)%step == 0 {
		b -= q.size - q.sliceLen(last)
	}
	return b
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
	rail          int32 // index in req.pi.rails
	lkey, rkey    uint32
	next          int32 // Submit's grouping: the next span for the same endpoint
}

func (s *span) bytes() uint64 { return s.req.spanBytes(s.idx, s.end, s.step) }

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
	rail         int32
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

// finish acts on an outcome: completed slices end (and count toward the
// rail's throughput), failed and taken-back ones are retried (or end),
// canceled ones end Canceled.
func (t *Transport) finish(ep *endpoint, out *outcome) {
	rl := ep.rail
	if len(out.ok) > 0 {
		var b uint64
		for _, e := range out.ok {
			b += e.req.sliceLen(e.idx)
		}
		now := nanotime()
		rl.Completed(b, now)
		ep.peerH.OK(now)
		for _, e := range out.ok {
			e.req.sliceDone(nil)
		}
	}
	now := nanotime()
	for i := range out.canceled {
		rl.Left(out.canceled[i].bytes(), now)
		out.canceled[i].req.slicesDone(out.canceled[i].count(), errCanceled)
	}
	for _, e := range out.failed {
		rl.Left(e.req.sliceLen(e.idx), now)
		t.retry(e, out.failErr)
	}
	if len(out.retry) > 0 || len(out.spans) > 0 {
		err := ep.error()
		for _, e := range out.retry {
			rl.Left(e.req.sliceLen(e.idx), now)
			t.retry(e, err)
		}
		for i := range out.spans {
			s := &out.spans[i]
			rl.Left(s.bytes(), now)
			for ; s.idx < s.end; s.idx += s.step {
				t.retry(wrEntry{req: s.req, idx: s.idx, attempt: s.attempt, rail: s.rail}, err)
			}
		}
	}
}

// Submit spreads each request over the rails of its plan (the NICs near
// its local memory paired with those near the target buffer): a request of
// one slice goes whole to the rail that would finish it first, a larger one
// is cut into one run of slices per rail, in proportion to each rail's
// measured throughput less what it already holds. The runs are grouped by
// endpoint and each endpoint gets its group at once: its slices go out as
// one chain of work requests, one doorbell per endpoint per submit (more
// only when a send queue or the completion queue is full). A submit
// allocates two slabs (requests, spans), nothing per slice, and takes no
// transport-wide lock once the endpoints are up.
func (t *Transport) Submit(reqs []transport.Request) {
	qs := make([]request, len(reqs))
	now := nanotime()
	var pi *peerInfo
	var m memo
	nspans := 0
	for i := range reqs {
		r := &reqs[i]
		if pi == nil || pi.desc != r.Peer {
			pi = t.peerOf(r.Peer)
		}
		q := &qs[i]
		if err := t.prepare(r, q, pi, &m); err != nil {
			r.Complete(err)
			continue
		}
		q.tk = r.Ticket()
		r.Priv = q
		nspans += min(len(m.active(t, q, now)), int(q.n))
	}
	slab := make([]span, 0, nspans)
	type group struct {
		ep         *endpoint
		head, tail int32
	}
	var small [8]group
	groups := small[:0]
	add := func(q *request, s span) {
		ep, err := t.route(q.pi, &s, now)
		if err != nil {
			q.slicesDone(s.count(), err)
			return
		}
		slab = append(slab, s)
		at := int32(len(slab) - 1)
		for x := range groups {
			if groups[x].ep == ep {
				slab[groups[x].tail].next = at
				groups[x].tail = at
				return
			}
		}
		groups = append(groups, group{ep: ep, head: at, tail: at})
	}
	var shares [maxSplit]share
	for i := range qs {
		q := &qs[i]
		if q.r == nil {
			continue
		}
		act := m.active(t, q, now)
		if q.n == 1 || len(act) == 1 {
			x := q.pi.pick(act, q.r.Length, t.rr.Add(1))
			add(q, span{req: q, idx: 0, end: q.n, step: 1, rail: x, next: -1})
			continue
		}
		k := q.pi.split(act, q.n, q.size, q.r.Length, &shares)
		at := int32(0)
		for _, sh := range shares[:k] {
			add(q, span{req: q, idx: at, end: at + sh.n, step: 1, rail: sh.rail, next: -1})
			at += sh.n
		}
	}
	for _, g := range groups {
		g.ep.post(slab, g.head)
	}
}

// memo keeps what consecutive requests of a submit share: the plan of one
// (local region, target buffer) pair and the rails of one plan usable now,
// so a run of requests between the same buffers looks them up once.
type memo struct {
	pi     *peerInfo
	region *segment.Region
	buf    *segment.BufferDesc
	pl     *plan
	actPl  *plan
	act    []int32
	abuf   [maxSplit]int32
}

// plan returns the routing plan of q's buffers.
func (m *memo) plan(t *Transport, q *request) *plan {
	r := q.r
	if m.pl == nil || m.pi != q.pi || m.region != r.Region || m.buf != r.Buffer {
		m.pi, m.region, m.buf = q.pi, r.Region, r.Buffer
		m.pl = q.pi.plan(t, r.Region.Location, r.Buffer.Extra[ExtraNear])
	}
	return m.pl
}

// active returns the rails of q's plan usable now (see peerInfo.active),
// once per plan and submit.
func (m *memo) active(t *Transport, q *request, now int64) []int32 {
	if m.actPl != q.pl {
		m.actPl, m.act = q.pl, q.pi.active(t, q.pl, now, m.abuf[:0])
	}
	return m.act
}

func (t *Transport) prepare(r *transport.Request, q *request, pi *peerInfo, m *memo) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "rdma", "transport closed")
	}
	if r.Length == 0 {
		return errs.New(errs.InvalidArgument, "rdma", "zero length")
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
	size, split := t.opt.Slice, false
	if b, l := r.Buffer, &r.Region.Desc; b.MRStep != 0 || l.MRStep != 0 {
		// A buffer split into overlapping memory regions: slices no longer
		// than the overlaps fit inside one region on each side.
		for _, d := range [2]*segment.BufferDesc{b, l} {
			if d.MRStep != 0 {
				size = min(size, d.MRSpan-d.MRStep)
			}
		}
		if len(l.MoreLkey) != len(l.MoreRkey) {
			return errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) has no memory region on every NIC", r.Local, r.Length)
		}
		split = true
	}
	n := sliceCount(r.Length, size)
	if n <= 0 || n > 1<<30 {
		return errs.New(errs.InvalidArgument, "rdma", "%d bytes are too many slices of %d", r.Length, size)
	}
	q.r, q.pi, q.lkeys, q.rkeys, q.size, q.n, q.split = r, pi, r.Region.Desc.Lkey, r.Buffer.Rkey, size, int32(n), split
	q.pl = m.plan(t, q)
	q.left.Store(int64(n))
	return nil
}

// keysAt returns the keys of a split request's slice at local and remote
// on rail x: those of the memory regions holding it on each side.
func (q *request) keysAt(local, remote uint64, x int32) (lkey, rkey uint32) {
	rl := q.pi.rails[x]
	l := &q.r.Region.Desc
	lk, _ := l.Keys(l.MRIndex(local - l.Addr))
	_, rk := q.r.Buffer.Keys(q.r.Buffer.MRIndex(remote - q.r.Buffer.Addr))
	return lk[rl.local], rk[q.pi.remoteIndex(x)]
}

// route returns the endpoint of the span's rail, lock-free when it is up,
// sets the span's keys for that rail's NICs and counts its bytes on it.
func (t *Transport) route(pi *peerInfo, s *span, now int64) (*endpoint, error) {
	rl := pi.rails[s.rail]
	s.lkey, s.rkey = s.req.lkeys[rl.local], s.req.rkeys[pi.remoteIndex(s.rail)]
	ep := pi.eps[s.rail].Load()
	if ep == nil || ep.failed() {
		var err error
		if ep, err = t.endpoint(pi, s.rail); err != nil {
			return nil, err
		}
		pi.eps[s.rail].Store(ep)
	}
	rl.Routed(s.bytes(), now)
	return ep, nil
}

// dispatch sends one slice to rail x.
func (t *Transport) dispatch(e wrEntry, x int32) {
	q := e.req
	one := [1]span{{req: q, idx: e.idx, end: e.idx + 1, step: 1, attempt: e.attempt, rail: x, next: -1}}
	ep, err := t.route(q.pi, &one[0], nanotime())
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

// retry sends a slice that did not run to another rail (retryRail), or
// ends it. A slice of a canceled request ends Canceled; one flushed because
// its endpoint was torn down for someone else's cancellation goes again on
// the same rail without spending an attempt, and one flushed by the stall
// watchdog goes to another rail without spending one (stallError). Every slice that gets here
// can no longer touch memory through its last attempt: its completion was
// polled (after a failure, from a queue pair in the error state), or it was
// never posted.
func (t *Transport) retry(e wrEntry, err error) {
	switch {
	case t.closing.Load():
		e.req.sliceDone(errs.Wrap(errs.Closed, "rdma", err, "transport closed"))
	case e.req.canceled.Load():
		e.req.sliceDone(errCanceled)
	case err == errTornDown:
		t.dispatch(e, e.rail)
	case isStall(err):
		q := e.req
		q.pi.rails[e.rail].Retried()
		t.dispatch(e, q.pi.retryRail(q.pl, e.rail, q.sliceLen(e.idx), nanotime(), t.rr.Add(1)))
	case int(e.attempt) >= t.opt.Retries || !retryable(err):
		e.req.sliceDone(err)
	default:
		e.attempt++
		q := e.req
		q.pi.rails[e.rail].Retried()
		t.dispatch(e, q.pi.retryRail(q.pl, e.rail, q.sliceLen(e.idx), nanotime(), t.rr.Add(1)))
	}
}

// isStall reports whether err is the stall watchdog's verdict.
func isStall(err error) bool {
	var s stallError
	return errors.As(err, &s)
}
