package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"github.com/tecache/te/engine/transport/internal/rails"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	fab "github.com/tecache/te/internal/sys/fabric"
	"github.com/tecache/te/internal/wire"
)

// epKey names an endpoint to a peer: the peer's instance and the NIC pair.
type epKey struct {
	instance      string
	local, remote int
}

// peerEP is an endpoint of a local NIC to one NIC of a peer. Operations
// wait in pending while it connects. Each peer gets its own endpoint, so
// that closing it (to flush a canceled operation that does not complete)
// touches no other peer.
type peerEP struct {
	t        *Transport
	n        *nic
	key      epKey
	peerName string
	rpc      string
	rnic     string // the peer NIC's name
	// health is the peer's as a whole, shared by its endpoints.
	health *rails.Peer
	// peerFailed: this endpoint's failure was counted in health.
	peerFailed atomic.Bool

	ep *fab.Endpoint // nil until connected; the NIC's own when shared
	cq *fab.CQ       // its own completion queue (nil when shared)
	// closed: ep and cq are closed (poller-owned after connect).
	closed bool
	dest   uint64 // the peer NIC's fi_addr

	mu      sync.Mutex
	ready   bool
	pending []*op
	dead    atomic.Bool
	// up is closed when connect ended; err (read after up) says how.
	up  chan struct{}
	err error
	// fail, once set (before dead), ends the operations still waiting
	// for it instead of sending them to a new endpoint: the stall
	// watchdog's StaleDescriptor, since they carry the same stale key.
	fail atomic.Pointer[error]

	probe    *probe // the peer NIC's drain probe (nil: none)
	used     bool   // an operation was posted on it (poller-owned)
	out      int    // operations posted on it (poller-owned)
	outBytes uint64 // their bytes (poller-owned)
	// Poller-owned, for the stall watchdog: completions read, the count
	// at the last look, and since when it has not moved with operations
	// posted.
	done, seen uint64
	quiet      time.Time
	checking   bool // a key check with the owner is out
}

func (pe *peerEP) endpoint() *fab.Endpoint { return pe.ep }

func (pe *peerEP) shared() bool { return pe.n.shared }

// kill marks the endpoint failed and forgets it, so that the next request
// to the peer connects a new one.
func (pe *peerEP) kill() {
	pe.dead.Store(true)
	pe.t.mu.Lock()
	if pe.t.eps[pe.key] == pe {
		delete(pe.t.eps, pe.key)
	}
	pe.t.mu.Unlock()
}

// peerLocked returns the health of peer instance inst, made at first use.
// Called with mu held.
func (t *Transport) peerLocked(inst string) *rails.Peer {
	p := t.peers[inst]
	if p == nil {
		if len(t.peers) >= maxPeers {
			// Peers come and go (a restart is a new instance): forget
			// those with no endpoint open.
			live := map[string]bool{}
			for k := range t.eps {
				live[k.instance] = true
			}
			for i := range t.peers {
				if !live[i] {
					delete(t.peers, i)
				}
			}
		}
		p = &rails.Peer{}
		t.peers[inst] = p
	}
	return p
}

// endpointFor returns the endpoint to the peer's NIC pair, starting one
// (connected in the background) when there is none or the last one died.
func (t *Transport) endpointFor(d *segment.Desc, li, ri int, rnic string) (*peerEP, error) {
	key := epKey{instance: d.Instance, local: li, remote: ri}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closing.Load() {
		return nil, errs.New(errs.Closed, "fabric", "transport closed")
	}
	if pe := t.eps[key]; pe != nil && !pe.dead.Load() {
		return pe, nil
	}
	if len(t.eps) >= maxPeers*len(t.nics) {
		return nil, errs.New(errs.ResourceExhausted, "fabric", "%d peer endpoints open already", len(t.eps))
	}
	pe := &peerEP{t: t, n: t.nics[li], key: key, peerName: d.Name, rpc: d.RPC, rnic: rnic, up: make(chan struct{}),
		health: t.peerLocked(d.Instance)}
	t.eps[key] = pe
	t.wg.Add(1)
	go pe.connect()
	return pe, nil
}

// send hands operations to the endpoint: to the poller once connected,
// held until then.
func (pe *peerEP) send(ops []*op) bool {
	pe.mu.Lock()
	if pe.dead.Load() {
		pe.mu.Unlock()
		return false
	}
	if !pe.ready {
		pe.pending = append(pe.pending, ops...)
		pe.mu.Unlock()
		return true
	}
	pe.mu.Unlock()
	pe.n.enqueue(ops...)
	return true
}

// hello is the endpoint exchange, both ways: the caller's instance and
// endpoint address, the instance and NIC it means to reach; the reply the
// NIC's address.
type hello struct {
	Instance string `json:"instance"`
	Segment  string `json:"segment,omitempty"`
	To       string `json:"to,omitempty"`  // the instance the caller means
	NIC      string `json:"nic,omitempty"` // the callee's NIC
	Addr     []byte `json:"addr"`
	// Check asks the callee, instead of an exchange, which of these keys
	// it no longer holds (Stale in the reply): the stall watchdog's
	// question (nic.stalls).
	Check []uint64 `json:"check,omitempty"`
	Stale []uint64 `json:"stale,omitempty"`
	// Probe is the callee NIC's drain probe region (nic.drain), where it
	// has one.
	Probe *probe `json:"probe,omitempty"`
}

// probe names a NIC's drain probe region: the address an RMA names (an
// offset under offset addressing) and its key.
type probe struct {
	Addr uint64 `json:"addr"`
	Key  uint64 `json:"key"`
}

// connect opens the endpoint, exchanges addresses with the peer over the
// control plane (authenticated when the cluster has a secret) and inserts
// the peer NIC's address.
func (pe *peerEP) connect() {
	defer pe.t.wg.Done()
	err := pe.dial()
	if err != nil {
		pe.kill()
		pe.t.st.errors.Add(1)
		pe.t.h.Logf("te: fabric: endpoint %s -> %s@%s: %v", pe.n.name, pe.peerName, pe.rnic, err)
	}
	pe.mu.Lock()
	ops := pe.pending
	pe.pending = nil
	if err == nil {
		pe.ready = true
	}
	pe.mu.Unlock()
	pe.err = err
	close(pe.up)
	if err != nil {
		// Never posted: they may go over another pair, if one is left.
		if len(ops) > 0 && pe.t.railFailed(pe) {
			for _, o := range ops {
				pe.t.retry(o, err)
			}
			return
		}
		for _, o := range ops {
			pe.t.settle(o, err)
		}
		return
	}
	if len(ops) > 0 {
		pe.n.enqueue(ops...)
	}
}

func (pe *peerEP) dial() error {
	t, n := pe.t, pe.n
	ep := n.ep
	addr := n.addr
	var cq *fab.CQ
	if !n.shared {
		// Its own queue: closing the endpoint and then the queue leaves
		// the provider no completion of it to deliver anywhere.
		var err error
		if cq, err = n.d.OpenCQ(2*n.depth, false); err != nil {
			return err
		}
		if ep, err = n.d.Endpoint(n.av, cq); err != nil {
			_ = cq.Close()
			return err
		}
		if addr, err = ep.Name(); err != nil {
			_ = ep.Close()
			_ = cq.Close()
			return err
		}
	}
	body, _ := json.Marshal(hello{Instance: t.h.Instance(), Segment: t.h.SegmentName(), To: pe.key.instance, NIC: pe.rnic, Addr: addr})
	ctx, cancel := context.WithTimeout(t.ctx, t.opt.HandshakeTimeout)
	rep, err := t.h.Control().Call(ctx, pe.rpc, wire.KindFabric, body)
	cancel()
	var h hello
	if err == nil {
		if json.Unmarshal(rep, &h) != nil || h.Instance != pe.key.instance || len(h.Addr) == 0 {
			err = errs.New(errs.Protocol, "fabric", "bad endpoint exchange reply from %s", pe.peerName)
		}
	}
	if err == nil {
		pe.dest, err = n.insert(h.Addr)
		if n.drain {
			pe.probe = h.Probe
		}
	}
	if err != nil {
		if !n.shared {
			_ = ep.Close()
			_ = cq.Close()
		}
		return err
	}
	pe.ep, pe.cq = ep, cq
	if !n.shared {
		n.mu.Lock()
		closed := n.open == nil
		if !closed {
			n.open[pe] = struct{}{}
			n.openGen++
		}
		n.mu.Unlock()
		if closed {
			pe.ep, pe.cq = nil, nil
			_ = ep.Close()
			_ = cq.Close()
			return errs.New(errs.Closed, "fabric", "transport closed")
		}
	}
	return nil
}

// close closes the endpoint, then its queue: once both return the
// provider touches none of its operations' memory (the flush).
func (pe *peerEP) close(t *Transport) {
	if pe.closed || pe.shared() {
		return
	}
	pe.closed = true
	if err := pe.ep.Close(); err != nil {
		t.h.Logf("te: fabric: closing the endpoint to %s: %v", pe.peerName, err)
	}
	if err := pe.cq.Close(); err != nil {
		t.h.Logf("te: fabric: closing the queue of the endpoint to %s: %v", pe.peerName, err)
	}
}

// handleHandshake answers a peer's endpoint exchange with the address of
// the NIC it names.
func (t *Transport) handleHandshake(ctx context.Context, body []byte) ([]byte, error) {
	var h hello
	if err := json.Unmarshal(body, &h); err != nil || h.Instance == "" || len(h.Addr) > 256 || len(h.Check) > maxCheck ||
		len(h.Addr) == 0 && len(h.Check) == 0 {
		return nil, errs.New(errs.Protocol, "fabric", "bad endpoint exchange")
	}
	// With a secret the session proved who calls: the body's instance,
	// which the NIC's peer accounting is keyed by, must be that one.
	if by := transport.CallerOf(ctx); by.Known && (h.Instance != by.Instance || h.Segment != by.Name) {
		return nil, errs.New(errs.Unauthenticated, "fabric",
			"endpoint exchange names segment %q instance %s, but its session proved segment %q instance %s", h.Segment, h.Instance, by.Name, by.Instance)
	}
	if h.To != t.h.Instance() {
		return nil, errs.New(errs.StaleDescriptor, "fabric", "endpoint exchange for instance %s reached %s", h.To, t.h.Instance())
	}
	if t.closing.Load() {
		return nil, errs.New(errs.Closed, "fabric", "transport closed")
	}
	if len(h.Check) > 0 {
		return json.Marshal(hello{Instance: t.h.Instance(), Stale: t.staleKeys(h.Check)})
	}
	for _, n := range t.nics {
		if n.name != h.NIC {
			continue
		}
		key := n.name + "\x00" + h.Instance
		t.mu.Lock()
		_, seen := t.accepts[key]
		if !seen {
			if len(t.accepts) >= maxPeers*len(t.nics) {
				t.mu.Unlock()
				return nil, errs.New(errs.ResourceExhausted, "fabric", "%d peers accepted already", len(t.accepts))
			}
			t.accepts[key] = struct{}{}
			n.peers.Add(1)
		}
		t.mu.Unlock()
		n.wake()
		return json.Marshal(hello{Instance: t.h.Instance(), Addr: n.addr, Probe: n.probeOf()})
	}
	return nil, errs.New(errs.NotFound, "fabric", "no NIC %q here", h.NIC)
}

// failPending ends the operations waiting for the endpoint to connect.
func (pe *peerEP) failPending(err error) {
	pe.kill()
	pe.mu.Lock()
	ops := pe.pending
	pe.pending = nil
	pe.mu.Unlock()
	for _, o := range ops {
		pe.t.settle(o, err)
	}
}

// Warmup opens the endpoints to the peer NICs its requests would use and
// exchanges addresses, returning once that is done or failed
// (transport.Warmer); an endpoint already up costs nothing. The provider's
// own connection (rxm over tcp forms it at the first operation) is not
// made here.
func (t *Transport) Warmup(ctx context.Context, d *segment.Desc) error {
	if err := t.Reachable(d); err != nil {
		return err
	}
	nd, err := parseEndpoint(d)
	if err != nil {
		return err
	}
	pairs, err := t.pairs(d, nd)
	if err != nil {
		return err
	}
	// Every NIC pair requests stripe over; it fails only when none came
	// up (requests avoid a pair that fails).
	var first error
	up := false
	for _, p := range pairs {
		pe, err := t.endpointFor(d, p.li, p.ri, nd[p.ri].Name)
		if err == nil {
			select {
			case <-pe.up:
				err = pe.err
			case <-ctx.Done():
				code := errs.Canceled
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					code = errs.Timeout
				}
				return errs.Wrap(code, "fabric", ctx.Err(), "endpoint to %s", d.Name)
			}
		}
		if err == nil {
			up = true
		} else if first == nil {
			first = err
		}
	}
	if up {
		return nil
	}
	return first
}

// maxCheck bounds the keys one stall check asks about (an endpoint's
// posted operations carry at most that many).
const maxCheck = 4096

// staleKeys returns those of keys no registration here holds on any NIC.
func (t *Transport) staleKeys(keys []uint64) []uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var stale []uint64
	for _, k := range keys {
		held := false
		for _, mrs := range t.regs {
			for _, m := range mrs {
				held = held || m.Key == k
			}
			if held {
				break
			}
		}
		if !held {
			stale = append(stale, k)
		}
	}
	return stale
}
