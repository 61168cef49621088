package rdma

import (
	"context"
	"github.com/tecache/te/engine/transport/internal/rails"
	"math"
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
	peerH *rails.Peer
	peer  peerRef
	state atomic.Int32
	// busy is when the work requests outstanding on the endpoint last made
	// progress (a completion, or the post that ended an idle spell); 0
	// when none is outstanding. The stall watchdog reads it (watchOnce).
	busy atomic.Int64
	// used is when slices were last posted on it (or it was made): the
	// idle reaper destroys an endpoint unused for Options.PeerIdle.
	used atomic.Int64

	mu         sync.Mutex
	qps        []*qpState
	pend       []span // waiting, oldest from ph on
	ph         int
	pn         int // slices waiting
	rr         int
	wrs        []workRequest // reused by flushLocked
	err        error
	torn       bool // failed on purpose, to cancel requests posted on it
	stalled    bool // failed by the stall watchdog
	connecting bool // connect() still owns qps
	released   bool
	up         chan struct{} // closed when connect() ends, ready or failed (Warmup waits on it)
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
	ubyte uint64 // their bytes
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

// signalBytes bounds the bytes between signaled work requests too: the
// stall watchdog judges an endpoint by how long its next completion takes,
// and large slices a quarter queue apart would be tens of MiB (at 64 KiB
// slices a completion costs nothing next to the bytes).
const signalBytes = 4 << 20

// stallFactor is the margin of the stall limit over the time the bytes
// ahead of an endpoint's next completion should take: a NIC shared with
// other endpoints, a rate that dropped since it was measured.
const stallFactor = 8

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
	defer close(ep.up)
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
	if ep.pn > 0 {
		ep.used.Store(nanotime())
	}
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
			lkey, rkey := s.lkey, s.rkey
			if s.req.split {
				lkey, rkey = s.req.keysAt(local, remote, s.rail)
			}
			qs.unsig++
			qs.ubyte += uint64(n)
			sig := qs.unsig >= qs.every || qs.ubyte >= signalBytes
			if sig {
				qs.unsig, qs.ubyte = 0, 0
			}
			id := qs.push(wrEntry{req: s.req, idx: s.idx, attempt: s.attempt, rail: s.rail}, sig)
			ep.wrs = append(ep.wrs, workRequest{id: id, read: s.req.r.Op == transport.Read, signaled: sig,
				local: local, n: n, lkey: lkey, remote: remote, rkey: rkey})
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
			qs.unsig, qs.ubyte = 0, 0
		}
		posted, err := qs.qp.Post(ep.wrs)
		ep.nic.posts.Add(1)
		if err == nil {
			if ep.busy.Load() == 0 {
				ep.busy.Store(nanotime())
				ep.t.wake()
			}
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
	switch {
	case status == ibv.WCWRFlushErr && ep.torn:
		out.failErr = errTornDown
	case status == ibv.WCWRFlushErr && ep.stalled:
		out.failErr = ep.err // the watchdog's verdict, not the flush
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
	now := nanotime()
	ep.nic.doneAt.Store(now)
	ep.progressLocked(now)
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

// progressLocked notes a completion: the endpoint made progress now, or
// has nothing outstanding any more.
func (ep *endpoint) progressLocked(now int64) {
	for _, q := range ep.qps {
		if q.n > 0 {
			ep.busy.Store(now)
			return
		}
	}
	ep.busy.Store(0)
}

// stallLimitLocked is how long the endpoint may go without a completion
// while work requests are outstanding on it: stallFactor times what the
// bytes ahead of its next signaled work request take at its rail's
// measured rate, and at least Options.StallTimeout. A rail not yet
// measured is not judged (its NIC's retry timer is).
func (ep *endpoint) stallLimitLocked() int64 {
	var bytes uint64
	for _, q := range ep.qps {
		for k := 0; k < q.n; k++ {
			e, sig := q.at(k)
			if e.req != nil {
				bytes += e.req.sliceLen(e.idx)
			}
			if sig {
				break
			}
		}
	}
	rate := ep.rail.Rate()
	if rate <= 0 {
		return math.MaxInt64
	}
	return max(int64(ep.t.opt.StallTimeout), int64(min(stallFactor*float64(bytes)/rate*1e9, math.MaxInt64/2)))
}

// watchdog fails endpoints that stall (see checkStall): while any
// endpoint has work outstanding it looks every quarter of
// Options.StallTimeout; otherwise it sleeps until flushLocked wakes it
// (wake), so an idle transport costs no wake-ups and a busy one a few
// hundred a second, none per request.
func (t *Transport) watchdog() {
	defer close(t.wdDone)
	tick := max(t.opt.StallTimeout/4, time.Millisecond)
	timer := time.NewTimer(tick)
	defer timer.Stop()
	for {
		if !t.watchOnce() {
			// Idle: say so, then look once more, so a post that found the
			// watchdog busy a moment ago is not missed.
			t.wdIdle.Store(true)
			if !t.watchOnce() || !t.wdIdle.CompareAndSwap(true, false) {
				select {
				case <-t.wdKick:
				case <-t.ctx.Done():
					return
				}
			}
		}
		timer.Reset(tick)
		select {
		case <-timer.C:
		case <-t.ctx.Done():
			return
		}
	}
}

// errIdle is why an endpoint unused for Options.PeerIdle was destroyed.
var errIdle error = errs.New(errs.Closed, "rdma", "idle endpoint closed")

// reaper destroys, every quarter of Options.PeerIdle (at most 30s),
// the endpoints that went PeerIdle without a post and have nothing
// outstanding: nothing else would, for a peer that died and is not asked
// for again (its queue pairs never fail on their own).
func (t *Transport) reaper() {
	defer close(t.reaperDone)
	tk := time.NewTicker(min(max(t.opt.PeerIdle/4, 10*time.Millisecond), 30*time.Second))
	defer tk.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
			t.reapIdle(nanotime())
		}
	}
}

// reapIdle fails the ready endpoints idle since before now-PeerIdle with
// nothing pending or posted, which destroys their queue pairs.
func (t *Transport) reapIdle(now int64) {
	limit := now - int64(t.opt.PeerIdle)
	var idle []*endpoint
	t.mu.Lock()
	for _, ep := range t.eps {
		if ep.used.Load() < limit && ep.state.Load() == epReady {
			idle = append(idle, ep)
		}
	}
	t.mu.Unlock()
	for _, ep := range idle {
		ep.mu.Lock()
		busy := ep.pn > 0 || ep.used.Load() >= limit || ep.state.Load() != epReady
		for _, q := range ep.qps {
			busy = busy || q.n > 0
		}
		if !busy {
			ep.failLocked(errIdle)
			ep.releaseIfIdleLocked()
		}
		ep.mu.Unlock()
	}
}

// wake starts the watchdog's looks if it sleeps: work was just posted on
// an idle endpoint.
func (t *Transport) wake() {
	if t.wdIdle.Load() && t.wdIdle.CompareAndSwap(true, false) {
		select {
		case t.wdKick <- struct{}{}:
		default:
		}
	}
}

// watchOnce is one look: it fails the endpoint that has gone longest
// without a completion if that is over its stall limit while another rail
// to the same peer completed work since and its own NIC completed nothing
// (a NIC shared with busy endpoints may serve them first; a dead one
// completes nothing); one endpoint a look, since
// several rails going quiet at once is more likely the machine than as
// many dead links, and the next look comes soon. It reports whether any
// endpoint has work outstanding.
//
// A dead link or NIC shows as work requests the NIC retransmits until its
// retry timer runs out (about half a second at the default ACK timeout)
// while the other rails to the peer keep moving bytes. Failing the
// endpoint moves its queue pairs to the error state, so the NIC flushes
// what is posted: a slice goes to another rail only once its flushed
// completion says the NIC is done with it (the fence), and what waited
// is retried at once. With every rail to a peer quiet, the NICs' own
// timers decide, as for a peer that went away.
func (t *Transport) watchOnce() bool {
	now := nanotime()
	var worst *endpoint
	oldest := now - int64(t.opt.StallTimeout)
	busy := false
	t.mu.Lock()
	for e := range t.all {
		b := e.busy.Load()
		if b == 0 {
			continue
		}
		busy = true
		if b < oldest && e.peerH != nil && e.peerH.LastOK() > b && e.state.Load() == epReady {
			worst, oldest = e, b
		}
	}
	t.mu.Unlock()
	// Lock order: an endpoint's lock is never taken under the transport's.
	if worst != nil {
		worst.checkStall(now)
	}
	return busy
}

// stallError is the watchdog's verdict on an endpoint. Its flushed slices
// go to the other rails without spending an attempt: the verdict says the
// rail went quiet while the peer's other rails moved bytes, which says
// nothing against the slices themselves (and a busy host, or a software
// NIC on one, can make a live rail look dead for a moment). The rail's
// cooldown keeps them off it; the transfer timeout still bounds the task.
type stallError struct{ error }

func (e stallError) Unwrap() error { return e.error }

// checkStall fails the endpoint if it still has gone without a completion
// for longer than its stall limit (see Transport.watchOnce): its queue pairs go
// to the error state, the NIC flushes their work requests, and the flushed
// slices go to other rails as after any failure.
func (ep *endpoint) checkStall(now int64) {
	var out outcome
	ep.mu.Lock()
	b := ep.busy.Load()
	limit := ep.stallLimitLocked()
	n := ep.nic
	if ep.state.Load() != epReady || b == 0 || now-b <= limit || n.doneAt.Load() > b ||
		(!n.parked.Load() && n.emptyAt.Load() <= b+limit) {
		ep.mu.Unlock()
		return
	}
	ep.t.st.stalls.Add(1)
	ep.stalled = true
	ep.failLocked(stallError{errs.New(errs.PeerUnreachable, "rdma",
		"no completion on %s -> %s@%s for %v (limit %v) while other rails to the peer moved bytes (a dead link or NIC)",
		ep.nic.name, ep.peer.name, ep.peer.nic, time.Duration(now-b).Round(time.Millisecond), time.Duration(limit).Round(time.Millisecond))})
	out.spans = ep.takePendingLocked(out.spans)
	ep.releaseIfIdleLocked()
	ep.mu.Unlock()
	ep.t.finish(ep, &out)
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
	if wasReady && !ep.t.closing.Load() && err != errTornDown && err != errIdle {
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
	ep.t.st.qps.Add(-int64(len(ep.qps)))
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
