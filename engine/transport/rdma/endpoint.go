package rdma

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/wire"
	"github.com/tecache/te/internal/sys/ibv"
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
// queue pairs, the slices waiting for room on them, and the slices each has
// posted.
type endpoint struct {
	t     *Transport
	key   epKey
	nic   *nic
	peer  peerRef
	state atomic.Int32

	mu         sync.Mutex
	qps        []*qpState
	pending    list
	rr         int
	depth      int
	wrs        []workRequest // reused by flushLocked
	err        error
	torn       bool // failed on purpose, to cancel requests posted on it
	connecting bool // connect() still owns qps
	released   bool
}

// qpState is one queue pair of an endpoint and the work requests posted on
// it, in posting order: a completion (signaled every signalEvery work
// requests and at the end of every chain) accounts for its work request and
// every earlier one. A work request's wr_id is the queue pair's slot on its
// NIC (upper half) and its sequence number (lower half).
type qpState struct {
	ep    *endpoint
	qp    queuePair
	slot  uint32
	ring  []*slice // posted, oldest at head; nil for a fence
	sig   []bool   // whether ring[i] was posted signaled
	head  int
	n     int
	seq   uint32 // sequence number of ring[head]
	unsig int    // work requests posted since the last signaled one
}

// signalEvery is how many work requests may go unsignaled in a row: fewer
// completions to poll, while the send queue still frees up steadily.
const signalEvery = 16

func newQPState(ep *endpoint, q queuePair) *qpState {
	d := q.Depth()
	return &qpState{ep: ep, qp: q, ring: make([]*slice, d), sig: make([]bool, d)}
}

func (q *qpState) room() int { return len(q.ring) - q.n }

// push records a posted work request and returns its wr_id.
func (q *qpState) push(s *slice, signaled bool) uint64 {
	i := (q.head + q.n) % len(q.ring)
	q.ring[i], q.sig[i] = s, signaled
	id := uint64(q.slot)<<32 | uint64(q.seq+uint32(q.n))
	q.n++
	return id
}

func (q *qpState) popHead() *slice {
	s := q.ring[q.head]
	q.ring[q.head] = nil
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	q.seq++
	return s
}

func (q *qpState) popTail() *slice {
	i := (q.head + q.n - 1) % len(q.ring)
	s := q.ring[i]
	q.ring[i] = nil
	q.n--
	return s
}

func (q *qpState) at(k int) (*slice, bool) {
	i := (q.head + k) % len(q.ring)
	return q.ring[i], q.sig[i]
}

// outcome collects what happened to slices under an endpoint's lock, to be
// acted on (completions, retries) once it is released.
type outcome struct {
	ok, failed, retry, canceled list
	failErr                     error // why the slices in failed failed
}

// finish acts on an outcome: completed slices end, failed and taken-back
// ones are retried (or end), canceled ones end Canceled.
func (t *Transport) finish(ep *endpoint, out *outcome) {
	for s := out.ok.pop(); s != nil; s = out.ok.pop() {
		s.req.sliceDone(nil)
	}
	for s := out.canceled.pop(); s != nil; s = out.canceled.pop() {
		s.req.sliceDone(errCanceled)
	}
	for s := out.failed.pop(); s != nil; s = out.failed.pop() {
		t.retry(s, out.failErr)
	}
	if out.retry.n > 0 {
		err := ep.error()
		for s := out.retry.pop(); s != nil; s = out.retry.pop() {
			t.retry(s, err)
		}
	}
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
	out.retry.appendList(&ep.pending)
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
	ep.depth = qps[0].Depth()
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

// post queues slices and posts what fits; on a failed endpoint they go
// back for a retry.
func (ep *endpoint) post(l *list) {
	var out outcome
	ep.mu.Lock()
	if ep.state.Load() == epFailed {
		out.retry.appendList(l)
	} else {
		ep.pending.appendList(l)
		if ep.state.Load() == epReady {
			ep.flushLocked(&out)
		}
	}
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
}

// flushLocked posts pending slices while a queue pair has room: each time
// as one chain on one queue pair (one doorbell), signaled every signalEvery
// work requests and at its end. Slices of canceled requests are left out;
// a refused post fails the endpoint and sends the rest back for a retry.
func (ep *endpoint) flushLocked(out *outcome) {
	for ep.pending.n > 0 {
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
		take := ep.nic.reserve(min(qs.room(), ep.pending.n), ep)
		if take == 0 {
			return // the NIC's CQ is full: its next completion flushes ep
		}
		ep.wrs = ep.wrs[:0]
		for len(ep.wrs) < take && ep.pending.n > 0 {
			s := ep.pending.pop()
			if s.req.canceled.Load() {
				out.canceled.push(s)
				continue
			}
			qs.unsig++
			sig := qs.unsig >= signalEvery
			if sig {
				qs.unsig = 0
			}
			id := qs.push(s, sig)
			ep.wrs = append(ep.wrs, workRequest{id: id, read: s.read, signaled: sig, local: s.local, n: s.n,
				lkey: s.lkey, remote: s.remote, rkey: s.rkey})
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
			out.retry.push(qs.popTail())
		}
		ep.nic.unreserve(k - posted)
		out.retry.appendList(&ep.pending)
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
	like.id, like.signaled = qs.push(nil, true), true
	_, err := qs.qp.Post([]workRequest{like})
	ep.nic.posts.Add(1)
	if err == nil {
		return
	}
	qs.popTail()
	ep.nic.unreserve(1)
	for qs.n > 0 {
		s, sig := qs.at(qs.n - 1)
		if sig {
			break
		}
		qs.popTail()
		ep.nic.unreserve(1)
		if s != nil {
			out.retry.push(s)
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
// failed endpoint, sends what is pending back.
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
		s := qs.popHead()
		if s == nil {
			continue // a fence
		}
		switch {
		case status == ibv.WCSuccess, i < k-1 && status != ibv.WCWRFlushErr:
			out.ok.push(s)
		default:
			out.failed.push(s)
		}
	}
	ep.nic.unreserve(k)
	if err != nil && ep.state.Load() != epFailed {
		ep.failLocked(err)
	}
	if ep.state.Load() == epFailed {
		out.retry.appendList(&ep.pending)
		ep.releaseIfIdleLocked()
		return
	}
	ep.flushLocked(out)
}

// cancel ends the slices of canceled requests on ep: pending ones at once;
// if any is posted, the endpoint's queue pairs go to the error state, and
// the flushed completions end them (and send the other requests' slices to
// a new endpoint).
func (ep *endpoint) cancel() {
	var out outcome
	ep.mu.Lock()
	var keep list
	for s := ep.pending.pop(); s != nil; s = ep.pending.pop() {
		if s.req.canceled.Load() {
			out.canceled.push(s)
		} else {
			keep.push(s)
		}
	}
	ep.pending = keep
	posted := false
	for _, qs := range ep.qps {
		for k := 0; k < qs.n && !posted; k++ {
			s, _ := qs.at(k)
			posted = s != nil && s.req.canceled.Load()
		}
	}
	if posted && ep.state.Load() != epFailed {
		ep.torn = true
		ep.failLocked(errTornDown)
		out.retry.appendList(&ep.pending)
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
	out.retry.appendList(&ep.pending)
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

// drainLocked takes every slice still posted on the (destroyed) queue pairs.
func (ep *endpoint) drainLocked(l *list) {
	for _, q := range ep.qps {
		k := q.n
		for q.n > 0 {
			if s := q.popHead(); s != nil {
				l.push(s)
			}
		}
		ep.nic.unreserve(k)
	}
}
