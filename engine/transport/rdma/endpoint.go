package rdma

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/ibv"
	"github.com/tecache/te/internal/wire"
)

// epKey names an endpoint: a peer engine instance, a local NIC, the peer's
// NIC.
type epKey struct {
	instance string
	local    int
	remote   string
}

const (
	epConnecting int32 = iota
	epReady
	epFailed
)

// endpoint is the initiating side of one NIC pair with one peer: its RC
// queue pairs, the spans of slices waiting for room on them, and the work
// requests each has posted.
type endpoint struct {
	t     *Transport
	key   epKey
	nic   *nic
	rail  *rail
	peerH *peerHealth
	peer  peerRef
	state atomic.Int32

	mu         sync.Mutex
	qps        []*qpState
	pend       []span // waiting, oldest from ph on
	ph         int
	pn         int // slices waiting
	rr         int
	wrs        []workRequest // reused by flushLocked
	err        error
	torn       bool // failed on purpose, to cancel requests posted on it
	connecting bool // connect() still owns qps
	released   bool
}

// qpState is one queue pair of an endpoint and the work requests posted on
// it, in posting order: a completion (signaled every sigEvery work
// requests and at the end of every chain) accounts for its work request and
// every earlier one. A work request's wr_id is the queue pair's slot on its
// NIC (upper half) and its sequence number (lower half).
type qpState struct {
	ep    *endpoint
	qp    queuePair
	slot  uint32
	ring  []wrEntry // posted, oldest at head
	sig   []bool    // whether ring[i] was posted signaled
	head  int
	n     int
	seq   uint32 // sequence number of ring[head]
	unsig int    // work requests posted since the last signaled one
	every int    // signal at least every this many work requests
}

// signalEvery is how many work requests of a queue pair go unsignaled in a
// row at most: a quarter of its send queue, at least minSignalEvery. Every
// completion the NIC writes may wake the poller, so fewer of them is less
// CPU per request; a quarter keeps the send queue freeing up steadily.
// The end of every chain is signaled too, so a batch's last work request
// never waits for a later post.
func signalEvery(depth int) int { return max(minSignalEvery, depth/4) }

const minSignalEvery = 16

func newQPState(ep *endpoint, q queuePair) *qpState {
	d := q.Depth()
	return &qpState{ep: ep, qp: q, ring: make([]wrEntry, d), sig: make([]bool, d), every: signalEvery(d)}
}

func (q *qpState) room() int { return len(q.ring) - q.n }

// push records a posted work request and returns its wr_id.
func (q *qpState) push(e wrEntry, signaled bool) uint64 {
	i := (q.head + q.n) % len(q.ring)
	q.ring[i], q.sig[i] = e, signaled
	id := uint64(q.slot)<<32 | uint64(q.seq+uint32(q.n))
	q.n++
	return id
}

func (q *qpState) popHead() wrEntry {
	e := q.ring[q.head]
	q.ring[q.head] = wrEntry{}
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	q.seq++
	return e
}

func (q *qpState) popTail() wrEntry {
	i := (q.head + q.n - 1) % len(q.ring)
	e := q.ring[i]
	q.ring[i] = wrEntry{}
	q.n--
	return e
}

func (q *qpState) at(k int) (wrEntry, bool) {
	i := (q.head + k) % len(q.ring)
	return q.ring[i], q.sig[i]
}

// peerRef is what an endpoint needs of the peer's descriptor.
type peerRef struct {
	name     string
	instance string
	rpc      string
	nic      string // the peer NIC's name
}

func (ep *endpoint) failed() bool { return ep.state.Load() == epFailed }

// connect creates the queue pairs, exchanges them with the peer over the
// control plane and brings them to RTS, then posts what queued meanwhile.
func (ep *endpoint) connect() {
	defer ep.t.wg.Done()
	err := ep.handshake()
	var out outcome
	ep.mu.Lock()
	ep.connecting = false
	if err == nil && ep.state.Load() != epFailed {
		ep.state.Store(epReady)
		ep.flushLocked(&out)
		ep.mu.Unlock()
		ep.t.finish(ep, &out)
		return
	}
	if err == nil {
		err = ep.err // failed (closed) while connecting
	}
	ep.failLocked(err)
	out.spans = ep.takePendingLocked(out.spans)
	ep.releaseIfIdleLocked()
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
}

func (ep *endpoint) handshake() error {
	t, n := ep.t, ep.nic
	psn := rand.Uint32() & (1<<24 - 1)
	qps, err := t.createQPs(n, t.opt.QPs)
	if err != nil {
		return err
	}
	states := make([]*qpState, len(qps))
	for i, q := range qps {
		states[i] = newQPState(ep, q)
		n.addQP(states[i])
	}
	ep.mu.Lock()
	ep.qps = states
	ep.mu.Unlock()
	req := handshake{
		LocalNICPath: t.h.SegmentName() + "@" + n.name, PeerNICPath: ep.peer.name + "@" + ep.peer.nic,
		LID: n.lid, GID: formatGID(n.gid), MTU: n.mtu, PSN: psn,
		Instance: t.h.Instance(), PeerInstance: ep.peer.instance,
	}
	for _, q := range qps {
		req.QPNum = append(req.QPNum, q.Num())
	}
	body, err := req.encode()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(t.ctx, handshakeTimeout)
	defer cancel()
	out, err := t.h.Control().Call(ctx, ep.peer.rpc, wire.KindRDMA, body)
	if err != nil {
		return errs.Wrap(errs.CodeOf(err), "rdma", err, "handshake with %s@%s", ep.peer.name, ep.peer.nic)
	}
	rep, gid, err := decodeHandshake(out)
	if err != nil {
		return err
	}
	if len(rep.QPNum) != len(qps) || (ep.peer.instance != "" && rep.Instance != ep.peer.instance) {
		return errs.New(errs.Protocol, "rdma", "handshake reply from %s has %d queue pairs for %d, instance %q for %q",
			ep.peer.name, len(rep.QPNum), len(qps), rep.Instance, ep.peer.instance)
	}
	for i, q := range qps {
		if err := q.Connect(n.rcParams(rep, gid, i, psn)); err != nil {
			return err
		}
	}
	return nil
}

// handshakeTimeout bounds one handshake call.
const handshakeTimeout = 10 * time.Second

// rcParams connects local QP i to the peer's QP i of handshake h.
func (n *nic) rcParams(h *handshake, gid ibv.GID, i int, localPSN uint32) ibv.RCParams {
	return ibv.RCParams{
		Port: n.port, GIDIndex: uint8(n.gidIndex), MTU: min(n.mtu, h.MTU),
		RemoteQPN: h.QPNum[i], RemoteLID: h.LID, RemoteGID: gid,
		// Mooncake routes globally on both link layers; RoCE requires it.
		Global:   true,
		LocalPSN: localPSN, RemotePSN: h.PSN, MaxRdAtomic: n.maxRdAtom,
	}
}

// post queues the spans linked from slab[head] and posts what fits; on a
// failed endpoint they go back for a retry.
func (ep *endpoint) post(slab []span, head int32) {
	var out outcome
	ep.mu.Lock()
	failed := ep.state.Load() == epFailed
	for i := head; i >= 0; i = slab[i].next {
		if failed {
			out.spans = append(out.spans, slab[i])
		} else {
			ep.pend = append(ep.pend, slab[i])
			ep.pn += slab[i].count()
		}
	}
	if !failed && ep.state.Load() == epReady {
		ep.flushLocked(&out)
	}
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
}

// takePendingLocked moves every waiting span to out.
func (ep *endpoint) takePendingLocked(out []span) []span {
	out = append(out, ep.pend[ep.ph:]...)
	clear(ep.pend)
	ep.pend, ep.ph, ep.pn = ep.pend[:0], 0, 0
	return out
}

// flushLocked posts waiting slices while a queue pair has room: each time
// as one chain on one queue pair (one doorbell), signaled every qs.every
// work requests and at its end. Slices of canceled requests are left out;
// a refused post fails the endpoint and sends the rest back for a retry.
func (ep *endpoint) flushLocked(out *outcome) {
	for ep.pn > 0 {
		var qs *qpState
		for k := range ep.qps {
			j := (ep.rr + k) % len(ep.qps)
			if ep.qps[j].room() > 0 {
				qs, ep.rr = ep.qps[j], j+1
				break
			}
		}
		if qs == nil {
			return // full: completions post the rest
		}
		take := ep.nic.reserve(min(qs.room(), ep.pn), ep)
		if take == 0 {
			return // the NIC's CQ is full: its next completion flushes ep
		}
		ep.wrs = ep.wrs[:0]
		for len(ep.wrs) < take && ep.ph < len(ep.pend) {
			s := &ep.pend[ep.ph]
			if s.req.canceled.Load() {
				ep.pn -= s.count()
				out.canceled = append(out.canceled, *s)
				*s = span{}
				ep.ph++
				continue
			}
			local, remote, n := s.req.slice(s.idx)
			qs.unsig++
			sig := qs.unsig >= qs.every
			if sig {
				qs.unsig = 0
			}
			id := qs.push(wrEntry{req: s.req, idx: s.idx, attempt: s.attempt, rail: s.rail}, sig)
			ep.wrs = append(ep.wrs, workRequest{id: id, read: s.req.r.Op == transport.Read, signaled: sig,
				local: local, n: n, lkey: s.lkey, remote: remote, rkey: s.rkey})
			ep.pn--
			if s.idx += s.step; s.idx >= s.end {
				*s = span{}
				ep.ph++
			}
		}
		if ep.ph == len(ep.pend) {
			ep.pend, ep.ph = ep.pend[:0], 0
		} else if ep.ph > 64 && ep.ph > len(ep.pend)/2 {
			n := copy(ep.pend, ep.pend[ep.ph:])
			clear(ep.pend[n:])
			ep.pend, ep.ph = ep.pend[:n], 0
		}
		if left := take - len(ep.wrs); left > 0 {
			ep.nic.unreserve(left)
		}
		k := len(ep.wrs)
		if k == 0 {
			continue
		}
		if !ep.wrs[k-1].signaled {
			// The end of a chain is signaled: nothing posted waits for a
			// later post to be accounted for.
			ep.wrs[k-1].signaled = true
			qs.sig[(qs.head+qs.n-1)%len(qs.ring)] = true
			qs.unsig = 0
		}
		posted, err := qs.qp.Post(ep.wrs)
		ep.nic.posts.Add(1)
		if err == nil {
			continue
		}
		// The rest of the chain was not posted: take it back, and give up
		// on this endpoint (a queue pair that refuses posts is in error).
		for i := k - 1; i >= posted; i-- {
			out.retry = append(out.retry, qs.popTail())
		}
		ep.nic.unreserve(k - posted)
		out.spans = ep.takePendingLocked(out.spans)
		ep.failLocked(err)
		if posted > 0 && !ep.wrs[posted-1].signaled {
			ep.fenceLocked(qs, ep.wrs[posted-1], out)
		}
		ep.releaseIfIdleLocked()
		return
	}
}

// fenceLocked follows a chain the queue pair took only in part, whose
// signaled end was not posted: without a signaled work request after them,
// the ones it took might never be accounted for. The queue pair is in error
// now, so a work request posted to it is flushed with a completion, and
// that completion covers the ones before. Should even that post be
// refused, the unsignaled ones are given up as flushed: the queue pair is
// in error and will not start them.
func (ep *endpoint) fenceLocked(qs *qpState, like workRequest, out *outcome) {
	ep.nic.used.Add(1)
	like.id, like.signaled = qs.push(wrEntry{}, true), true
	_, err := qs.qp.Post([]workRequest{like})
	ep.nic.posts.Add(1)
	if err == nil {
		return
	}
	qs.popTail()
	ep.nic.unreserve(1)
	for qs.n > 0 {
		e, sig := qs.at(qs.n - 1)
		if sig {
			break
		}
		qs.popTail()
		ep.nic.unreserve(1)
		if e.req != nil {
			out.retry = append(out.retry, e)
		}
	}
}

// kick posts what waited for room on the NIC's completion queue.
func (ep *endpoint) kick() {
	var out outcome
	ep.mu.Lock()
	if ep.state.Load() == epReady {
		ep.flushLocked(&out)
	}
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
}

// completedLocked accounts for the completion of work request seq of qs,
// and for every earlier one: before a success or an error of its own they
// succeeded (an RC send queue completes in order and an error always
// completes); before a flush, they may have been flushed without a
// completion of their own, so they go again. Then it posts more, or, on a
// failed endpoint, sends what is waiting back.
func (ep *endpoint) completedLocked(qs *qpState, seq uint32, status uint32, err error, out *outcome) {
	d := seq - qs.seq
	if qs.n == 0 || int64(d) >= int64(qs.n) {
		return // covered already
	}
	out.failErr = err
	if status == ibv.WCWRFlushErr && ep.torn {
		out.failErr = errTornDown
	}
	k := int(d) + 1
	for i := 0; i < k; i++ {
		e := qs.popHead()
		if e.req == nil {
			continue // a fence
		}
		if status == ibv.WCSuccess || (i < k-1 && status != ibv.WCWRFlushErr) {
			out.ok = append(out.ok, e)
		} else {
			out.failed = append(out.failed, e)
		}
	}
	ep.nic.unreserve(k)
	if err != nil && ep.state.Load() != epFailed {
		ep.failLocked(err)
	}
	if ep.state.Load() == epFailed {
		out.spans = ep.takePendingLocked(out.spans)
		ep.releaseIfIdleLocked()
		return
	}
	ep.flushLocked(out)
}

// cancel ends the slices of canceled requests on ep: waiting ones at once;
// if any is posted, the endpoint's queue pairs go to the error state, and
// the flushed completions end them (and send the other requests' slices to
// a new endpoint).
func (ep *endpoint) cancel() {
	var out outcome
	ep.mu.Lock()
	keep := ep.pend[:0]
	for _, s := range ep.pend[ep.ph:] {
		if s.req.canceled.Load() {
			ep.pn -= s.count()
			out.canceled = append(out.canceled, s)
		} else {
			keep = append(keep, s)
		}
	}
	clear(ep.pend[len(keep):])
	ep.pend, ep.ph = keep, 0
	posted := false
	for _, qs := range ep.qps {
		for k := 0; k < qs.n && !posted; k++ {
			e, _ := qs.at(k)
			posted = e.req != nil && e.req.canceled.Load()
		}
	}
	if posted && ep.state.Load() != epFailed {
		ep.torn = true
		ep.failLocked(errTornDown)
		out.spans = ep.takePendingLocked(out.spans)
		ep.releaseIfIdleLocked()
	}
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
}

// error is why slices taken back from the endpoint did not run.
func (ep *endpoint) error() error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.torn {
		return errTornDown
	}
	if ep.err != nil {
		return ep.err
	}
	return errs.New(errs.PeerUnreachable, "rdma", "endpoint failed")
}

// fail marks the endpoint failed: its queue pairs go to the error state so
// every outstanding work request completes (flushed) and is retried, and
// the next slice for this NIC pair connects a new endpoint.
func (ep *endpoint) fail(err error) {
	var out outcome
	ep.mu.Lock()
	ep.failLocked(err)
	out.spans = ep.takePendingLocked(out.spans)
	ep.releaseIfIdleLocked()
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
}

func (ep *endpoint) failLocked(err error) {
	if ep.state.Load() == epFailed {
		return
	}
	wasReady := ep.state.Load() == epReady
	ep.err = err
	ep.state.Store(epFailed)
	for _, q := range ep.qps {
		_ = q.qp.Fail()
	}
	// A handshake that fails is reported through the requests; an
	// established endpoint that breaks is worth a line.
	if wasReady && !ep.t.closing.Load() && err != errTornDown {
		ep.t.h.Logf("te: rdma: endpoint %s -> %s@%s failed: %v", ep.nic.name, ep.peer.name, ep.peer.nic, err)
	}
	ep.t.railError(ep, err)
	// Lock order is endpoint.mu before Transport.mu: the transport never
	// takes an endpoint's lock while holding its own.
	ep.t.forget(ep)
}

// releaseIfIdleLocked destroys the queue pairs of a failed endpoint once no
// work request is outstanding on them.
func (ep *endpoint) releaseIfIdleLocked() {
	if ep.released || ep.connecting || ep.state.Load() != epFailed {
		return
	}
	for _, q := range ep.qps {
		if q.n > 0 {
			return
		}
	}
	ep.released = true
	ep.destroyLocked()
	ep.t.released(ep)
}

// destroyLocked destroys the queue pairs; their rings stay for drainLocked.
func (ep *endpoint) destroyLocked() {
	for _, q := range ep.qps {
		_ = q.qp.Destroy()
		ep.nic.dropQP(q)
	}
}

// drainLocked takes every work request still posted on the (destroyed)
// queue pairs.
func (ep *endpoint) drainLocked(out []wrEntry) []wrEntry {
	for _, q := range ep.qps {
		k := q.n
		for q.n > 0 {
			if e := q.popHead(); e.req != nil {
				out = append(out, e)
			}
		}
		ep.nic.unreserve(k)
	}
	return out
}
