package fabric

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/transport/internal/rails"
	"github.com/tecache/te/internal/errs"
)

var (
	errCanceled error = errs.New(errs.Canceled, "fabric", "canceled")
	// errTornDown ends operations of other requests on an endpoint closed
	// to flush a canceled one: they go again on a new endpoint.
	errTornDown error = errs.New(errs.Canceled, "fabric", "endpoint closed to flush canceled operations")
)

// maxTries bounds how often an operation goes again after its endpoint was
// torn down under it.
const maxTries = 3

// railCooldown is how long a NIC pair whose operations failed takes no
// new slices (doubling with each failure in a row).
var railCooldown = rails.Cooldown{Cool: time.Second, CoolMax: 30 * time.Second}

// peerHealth is when failing NIC pairs make a whole peer unreachable over
// fabric, so that the engine takes another transport (tcp) for it: three
// endpoint failures within 10 s, spread over a second at least, with no
// bytes moved between them, for 30 s (doubling while nothing moves, up to
// 5 min), as rdma's defaults. The span keeps one moment's burst (a refused
// key that drops a provider's connection, on a loaded machine where
// nothing completes in between) from sending a live peer to tcp for 30 s.
var peerHealth = rails.Health{Limit: 3, Window: 10 * time.Second, MinSpan: time.Second, Cooldown: rails.Cooldown{Cool: 30 * time.Second, CoolMax: 5 * time.Minute}}

// request is a transport.Request in flight: its slices are operations,
// spread over the NIC pairs to the peer.
type request struct {
	tk       transport.Ticket
	left     atomic.Int32
	err      atomic.Pointer[error]
	canceled atomic.Bool
	d        *segment.Desc
	nd       []nicDesc
	// What later slices need of the transport.Request, copied in Submit:
	// the engine reuses the Request's memory once it completed.
	local, remote, length uint64
	buf                   *segment.BufferDesc
	region                *segment.Region // held by the engine until the request completes

	mu  sync.Mutex
	pes []*peerEP // the endpoints its operations went to (for Cancel)
}

// used records an endpoint the request's operations go to.
func (q *request) used(pe *peerEP) {
	q.mu.Lock()
	if !slices.Contains(q.pes, pe) {
		q.pes = append(q.pes, pe)
	}
	q.mu.Unlock()
}

// route is one NIC pair as a request uses it: the endpoint, the rail, and
// the key and addressing of the peer NIC.
type route struct {
	pe     *peerEP
	rail   *rails.Rail
	key    uint64
	desc   uintptr
	remote uint64 // the request's remote address in the peer NIC's addressing
}

// op is one fi_write or fi_read of a request.
type op struct {
	q      *request
	pe     *peerEP
	rail   *rails.Rail
	write  bool
	off    uint64 // in the request
	local  uint64
	remote uint64 // in the owner's addressing: virtual, or offset in its region
	n      uint64
	key    uint64
	desc   uintptr
	slot   int32
	tries  int
}

func (o *op) kind() string {
	if o.write {
		return "write"
	}
	return "read"
}

// Submit cuts each request into operations of at most fabric.slice bytes
// and spreads them over the NIC pairs to the peer by their load (rails);
// each NIC's poller posts its own.
func (t *Transport) Submit(reqs []transport.Request) {
	for i := range reqs {
		if err := t.submit(&reqs[i]); err != nil {
			reqs[i].Complete(err)
		}
	}
}

// routeFor prepares NIC pair p for q: its endpoint (connected in the
// background), rail, key and descriptor.
func (t *Transport) routeFor(q *request, p nicPair) (route, error) {
	key, err := bufferKey(q.buf, p.ri)
	if err != nil {
		return route{}, errs.Wrap(errs.StaleDescriptor, "fabric", err, "segment %q", q.d.Name)
	}
	desc, ok := t.localDesc(q.region, p.li)
	if !ok {
		return route{}, errs.New(errs.AddressNotRegistered, "fabric", "local memory [%#x,+%d) is not registered with %s", q.local, q.length, t.nics[p.li].name)
	}
	remote := q.remote
	if !q.nd[p.ri].Virt {
		remote -= q.buf.Addr
	}
	pe, err := t.endpointFor(q.d, p.li, p.ri, q.nd[p.ri].Name)
	if err != nil {
		return route{}, err
	}
	return route{pe: pe, rail: t.railOf(pe.key), key: key, desc: desc, remote: remote}, nil
}

func (t *Transport) submit(r *transport.Request) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "fabric", "transport closed")
	}
	nd, err := parseEndpoint(r.Peer)
	if err != nil {
		return err
	}
	pairs, err := t.pairs(r.Peer, nd)
	if err != nil {
		return err
	}
	q := &request{tk: r.Ticket(), d: r.Peer, nd: nd, local: r.Local, remote: r.Remote, length: r.Length, buf: r.Buffer, region: r.Region}
	// The pairs that may take slices now: not cooling down after a
	// failure (all of them when every one is).
	now := rails.Now()
	var routes []route
	var firstErr error
	for _, p := range pairs {
		if len(pairs) > 1 && t.railOf(t.keyOf(r.Peer, p)).Cooling(now) {
			continue
		}
		rt, err := t.routeFor(q, p)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		routes = append(routes, rt)
	}
	if len(routes) == 0 {
		for _, p := range pairs {
			rt, err := t.routeFor(q, p)
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			routes = append(routes, rt)
		}
	}
	if len(routes) == 0 {
		return firstErr
	}
	slice := t.opt.Slice
	count := int((r.Length + slice - 1) / slice)
	counts := make([]int, len(routes))
	if len(routes) == 1 {
		counts[0] = count
	} else {
		rs := make([]*rails.Rail, len(routes))
		for i, rt := range routes {
			rs[i] = rt.rail
			rt.rail.Usable(now) // a cooldown that ended turns into a probe
		}
		rails.Split(rs, count, slice, r.Length, counts)
	}
	ops := make([][]*op, len(routes))
	i, off := 0, uint64(0)
	for k, c := range counts {
		rt := routes[k]
		for ; c > 0; c-- {
			o := &op{q: q, write: r.Op == transport.Write, off: off, n: min(slice, r.Length-off), slot: -1}
			o.on(rt)
			ops[k] = append(ops[k], o)
			off += slice
			i++
		}
	}
	q.left.Store(int32(i))
	r.Priv = q
	for k, rt := range routes {
		if len(ops[k]) == 0 {
			continue
		}
		var n uint64
		for _, o := range ops[k] {
			n += o.n
		}
		rt.rail.Routed(n, now)
		q.used(rt.pe)
		if !rt.pe.send(ops[k]) {
			// It died between the lookup and now: one more try on a new one.
			for _, o := range ops[k] {
				t.retry(o, errTornDown)
			}
		}
	}
	return nil
}

// on points the operation at a route.
func (o *op) on(rt route) {
	o.pe, o.rail = rt.pe, rt.rail
	o.local = o.q.local + o.off
	o.remote = rt.remote + o.off
	o.key, o.desc = rt.key, rt.desc
}

// bufferKey returns the key of the owner's NIC ri for buf.
func bufferKey(buf *segment.BufferDesc, ri int) (uint64, error) {
	s := buf.Extra[ExtraKeys]
	for i := 0; i < ri && s != ""; i++ {
		_, s, _ = strings.Cut(s, ",")
	}
	k, _, _ := strings.Cut(s, ",")
	v, err := strconv.ParseUint(k, 16, 64)
	if err != nil || k == "" {
		return 0, errs.New(errs.StaleDescriptor, "fabric", "buffer [%#x,+%d) has no fabric key for NIC %d", buf.Addr, buf.Length, ri)
	}
	return v, nil
}

// opDone ends one operation; the last one ends its request with the
// first error any of them had.
func (t *Transport) opDone(o *op, err error) {
	q := o.q
	if err != nil {
		q.err.CompareAndSwap(nil, &err)
	}
	if q.left.Add(-1) != 0 {
		return
	}
	var out error
	if p := q.err.Load(); p != nil {
		out = *p
	}
	q.tk.Complete(out)
}

// settle ends an operation that left its rail without completing.
func (t *Transport) settle(o *op, err error) {
	o.rail.Left(o.n, rails.Now())
	t.opDone(o, err)
}

// retry sends an operation whose endpoint died under it (flushed: closed,
// or its completion read) again: on a new endpoint of the same NIC pair
// when the pair is healthy, else on the pair that would finish it first
// among those not cooling down (its own again when none is). It ends with
// why after a bounded number of tries; a canceled request's operation ends
// canceled. Operations are idempotent (the same bytes to the same place),
// so one that ran before the flush may run again.
func (t *Transport) retry(o *op, why error) {
	if o.q.canceled.Load() {
		t.settle(o, errCanceled)
		return
	}
	o.tries++
	if o.tries > maxTries || t.closing.Load() {
		t.settle(o, why)
		return
	}
	t.st.retries.Add(1)
	now := rails.Now()
	if !o.rail.Cooling(now) {
		t.resend(o, why)
		return
	}
	t.failover(o, why, now)
}

// resend sends o again on a new endpoint of its own NIC pair.
func (t *Transport) resend(o *op, why error) {
	pe, err := t.endpointFor(o.q.d, o.pe.key.local, o.pe.key.remote, o.pe.rnic)
	if err != nil {
		t.settle(o, err)
		return
	}
	o.pe = pe
	o.q.used(pe)
	if !pe.send([]*op{o}) {
		t.settle(o, why)
	}
}

// failover moves an operation off its failed NIC pair to the healthy one
// that would finish it first; with none left it goes again on its own.
func (t *Transport) failover(o *op, why error, now int64) {
	pairs, err := t.pairs(o.q.d, o.q.nd)
	if err != nil {
		t.settle(o, why)
		return
	}
	var routes []route
	var rs []*rails.Rail
	for _, p := range pairs {
		if t.railOf(t.keyOf(o.q.d, p)).Cooling(now) {
			continue
		}
		rt, err := t.routeFor(o.q, p)
		if err != nil {
			continue
		}
		routes = append(routes, rt)
		rs = append(rs, rt.rail)
	}
	if len(routes) == 0 {
		// No other pair takes it: the cooling one is all there is (one
		// NIC each side), so it goes again there, within maxTries, as
		// before there were rails.
		t.resend(o, why)
		return
	}
	rt := routes[rails.Pick(rs, o.n, uint64(o.off))]
	o.rail.Left(o.n, now)
	o.rail.Retried()
	t.st.failovers.Add(1)
	o.on(rt)
	rt.rail.Routed(o.n, now)
	o.q.used(rt.pe)
	if !rt.pe.send([]*op{o}) {
		t.settle(o, why)
	}
}

// railFailed cools the NIC pair of an endpoint down after a failure of its
// operations (an error completion, a stall), so that they and new slices go
// over the others; it reports whether another pair to the peer is there to
// take them.
func (t *Transport) railFailed(pe *peerEP) bool {
	now := rails.Now()
	rl := t.railOf(pe.key)
	if rl.Failed(railCooldown, now) {
		t.h.Logf("te: fabric: NIC pair %s -> %s@%s failed: cooling down", pe.n.name, pe.peerName, pe.rnic)
	}
	// The peer counts each endpoint's failure once (every operation posted
	// on a connection that dropped fails with it), and none while this
	// transport closes (its endpoint setups end canceled).
	if pe.health != nil && !t.closing.Load() && pe.peerFailed.CompareAndSwap(false, true) &&
		pe.health.Failed(peerHealth, now, nil, "fabric") {
		for u := pe.health.CoolUntil(); ; {
			c := t.coolingUntil.Load()
			if c >= u || t.coolingUntil.CompareAndSwap(c, u) {
				break
			}
		}
		t.h.Logf("te: fabric: %s unreachable over fabric for %v: its NIC pairs keep failing; other transports take it",
			pe.peerName, time.Duration(pe.health.CoolUntil()-now))
	}
	return t.otherPair(pe)
}

// otherPair reports whether a NIC pair to pe's peer other than pe's is
// known and not cooling down.
func (t *Transport) otherPair(pe *peerEP) bool {
	now := rails.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, r := range t.rails {
		if k.instance == pe.key.instance && k != pe.key && !r.Cooling(now) {
			return true
		}
	}
	return false
}

// Cancel ends requests early: operations not yet posted end at once;
// posted ones end at their completion, and if one is still posted after
// fabric's cancel grace its endpoint is closed, the flush after which the
// provider touches none of its memory (the other requests' operations on
// it go again on a new endpoint). Cancel does not wait.
func (t *Transport) Cancel(reqs []*transport.Request) {
	deadline := time.Now().Add(t.opt.CancelGrace)
	for _, r := range reqs {
		q, ok := r.Priv.(*request)
		if !ok || q == nil {
			continue
		}
		q.canceled.Store(true)
		q.mu.Lock()
		pes := slices.Clone(q.pes)
		q.mu.Unlock()
		for _, pe := range pes {
			t.cancelOn(q, pe, deadline)
		}
	}
}

// cancelOn ends q's operations waiting on pe and asks pe's poller to flush
// the posted ones after the grace.
func (t *Transport) cancelOn(q *request, pe *peerEP, deadline time.Time) {
	pe.mu.Lock()
	var drop []*op
	if !pe.ready {
		keep := pe.pending[:0]
		for _, o := range pe.pending {
			if o.q == q {
				drop = append(drop, o)
			} else {
				keep = append(keep, o)
			}
		}
		pe.pending = keep
	}
	pe.mu.Unlock()
	for _, o := range drop {
		t.settle(o, errCanceled)
	}
	n := pe.n
	n.mu.Lock()
	n.cancels = append(n.cancels, cancelReq{pe: pe, deadline: deadline})
	n.mu.Unlock()
	n.wake()
}
