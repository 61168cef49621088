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
// queue pairs, the slices waiting for room on them, and how many work
// requests each has outstanding.
type endpoint struct {
	t     *Transport
	key   epKey
	nic   *nic
	peer  peerRef
	state atomic.Int32

	mu          sync.Mutex
	qps         []queuePair
	outstanding []int
	pending     []*slice
	rr          int
	depth       int
	wrs         []workRequest // reused by flushLocked
	err         error
	connecting  bool // connect() still owns qps
	released    bool
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
	ep.mu.Lock()
	ep.connecting = false
	if err == nil && ep.state.Load() != epFailed {
		ep.state.Store(epReady)
		retry := ep.flushLocked()
		ep.mu.Unlock()
		ep.t.retryAll(retry)
		return
	}
	if err == nil {
		err = ep.err // failed (closed) while connecting
	}
	ep.failLocked(err)
	retry := ep.pending
	ep.pending = nil
	ep.releaseIfIdleLocked()
	ep.mu.Unlock()
	ep.t.retryAll(retry)
}

func (ep *endpoint) handshake() error {
	t, n := ep.t, ep.nic
	psn := rand.Uint32() & (1<<24 - 1)
	qps, err := t.createQPs(n, t.opt.QPs)
	if err != nil {
		return err
	}
	ep.mu.Lock()
	ep.qps = qps
	ep.outstanding = make([]int, len(qps))
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

// post queues a slice and posts what fits.
func (ep *endpoint) post(s *slice) {
	ep.mu.Lock()
	if ep.state.Load() == epFailed {
		err := ep.err
		ep.mu.Unlock()
		ep.t.retry(s, err)
		return
	}
	s.ep = ep
	ep.pending = append(ep.pending, s)
	var retry []*slice
	if ep.state.Load() == epReady {
		retry = ep.flushLocked()
	}
	ep.mu.Unlock()
	ep.t.retryAll(retry)
}

// flushLocked posts pending slices while a queue pair has room, as chains of
// up to one batch. It returns slices that could not be posted (the endpoint
// failed), to retry once ep.mu is released.
func (ep *endpoint) flushLocked() []*slice {
	for len(ep.pending) > 0 {
		qi := -1
		for k := range ep.qps {
			j := (ep.rr + k) % len(ep.qps)
			if ep.outstanding[j] < ep.depth {
				qi = j
				break
			}
		}
		if qi < 0 {
			return nil // full: completions post the rest
		}
		ep.rr = qi + 1
		take := min(ep.depth-ep.outstanding[qi], len(ep.pending), batchSize)
		ep.wrs = ep.wrs[:0]
		for _, s := range ep.pending[:take] {
			id, ok := ep.nic.track(s, ep)
			if !ok {
				break // the NIC's CQ is full: its next completion flushes ep
			}
			s.qp = qi
			ep.wrs = append(ep.wrs, workRequest{id: id, read: s.read, local: s.local, n: s.n,
				lkey: s.lkey, remote: s.remote, rkey: s.rkey})
		}
		if len(ep.wrs) == 0 {
			return nil
		}
		take = len(ep.wrs)
		posted, err := ep.qps[qi].Post(ep.wrs)
		ep.outstanding[qi] += posted
		if err == nil {
			ep.pending = ep.pending[take:]
			continue
		}
		// The rest of the chain was not posted: take it back, and give up
		// on this endpoint (a QP that refuses posts is in error).
		var retry []*slice
		for _, w := range ep.wrs[posted:] {
			if s := ep.nic.untrack(w.id); s != nil {
				retry = append(retry, s)
			}
		}
		retry = append(retry, ep.pending[take:]...)
		ep.pending = nil
		ep.failLocked(err)
		ep.releaseIfIdleLocked()
		return retry
	}
	return nil
}

// kick posts what waited for room on the NIC's completion queue.
func (ep *endpoint) kick() {
	ep.mu.Lock()
	var retry []*slice
	if ep.state.Load() == epReady {
		retry = ep.flushLocked()
	}
	ep.mu.Unlock()
	ep.t.retryAll(retry)
}

// batchSize is the longest chain of work requests posted in one call.
const batchSize = 32

// completed accounts for a finished work request of s and posts more.
func (ep *endpoint) completed(s *slice, failed error) []*slice {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if s.qp >= 0 && s.qp < len(ep.outstanding) {
		ep.outstanding[s.qp]--
	}
	if failed != nil && ep.state.Load() != epFailed {
		ep.failLocked(failed)
	}
	if ep.state.Load() == epFailed {
		retry := ep.pending
		ep.pending = nil
		ep.releaseIfIdleLocked()
		return retry
	}
	return ep.flushLocked()
}

// fail marks the endpoint failed: its queue pairs go to the error state so
// every outstanding work request completes (flushed) and is retried, and
// the next slice for this NIC pair connects a new endpoint.
func (ep *endpoint) fail(err error) {
	ep.mu.Lock()
	ep.failLocked(err)
	retry := ep.pending
	ep.pending = nil
	ep.releaseIfIdleLocked()
	ep.mu.Unlock()
	ep.t.retryAll(retry)
}

func (ep *endpoint) failLocked(err error) {
	if ep.state.Load() == epFailed {
		return
	}
	wasReady := ep.state.Load() == epReady
	ep.err = err
	ep.state.Store(epFailed)
	for _, q := range ep.qps {
		_ = q.Fail()
	}
	// A handshake that fails is reported through the requests; an
	// established endpoint that breaks is worth a line.
	if wasReady && !ep.t.closing.Load() {
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
	for _, o := range ep.outstanding {
		if o > 0 {
			return
		}
	}
	ep.released = true
	destroyQPs(ep.qps)
	ep.qps = nil
	ep.t.released(ep)
}
