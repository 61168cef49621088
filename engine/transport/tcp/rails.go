package tcp

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport/internal/rails"
	"github.com/tecache/te/internal/errs"
)

// EndpointsKey is the descriptor entry (segment.Desc.Endpoints) listing
// every data endpoint of an engine with several NICs, comma separated, the
// primary (Endpoints["tcp"]) first. Peers that do not know it read the
// primary alone, as before.
const EndpointsKey = "tcp.rails"

// errWrongEngine is the cause of a request refused before it was sent
// because the endpoint answered as another engine than the descriptor's.
// On a rail it is the rail's fault (an endpoint at an address that is not
// the peer's from here), and its slices go to another rail.
var errWrongEngine = errors.New("the endpoint answered as another engine")

// Rail cooldown: a rail whose connection failed or stalled rests this long
// (doubling while it keeps failing) before one slice probes it again.
var railCooldown = rails.Cooldown{Cool: time.Second, CoolMax: 30 * time.Second}

// listenDevices works out the local NICs (tcp.devices, or the defaults) and
// the endpoints published for them. A data listener on the wildcard address
// already takes connections on each, at its port; otherwise each NIC the
// listener is not bound to gets a listener of its own, on the same port
// where it is free.
func (t *Transport) listenDevices(lc net.ListenConfig, primary *net.TCPAddr) error {
	wild := primary.IP.IsUnspecified()
	var devs []device
	switch {
	case t.opt.Devices != "":
		var err error
		if devs, err = parseDevices(t.opt.Devices); err != nil {
			return err
		}
	case wild:
		devs = defaultDevices()
	}
	t.devs = devs
	t.localIPs = hostIPs()
	port := strconv.Itoa(primary.Port)
	for _, d := range devs {
		if wild || d.ip.Equal(primary.IP) {
			t.devEps = append(t.devEps, net.JoinHostPort(d.ip.String(), port))
			continue
		}
		ln, err := lc.Listen(context.Background(), "tcp", net.JoinHostPort(d.ip.String(), port))
		if err != nil {
			ln, err = lc.Listen(context.Background(), "tcp", net.JoinHostPort(d.ip.String(), "0"))
		}
		if err != nil {
			t.closeExtra()
			return errs.Wrap(errs.TransportUnavailable, "tcp", err, "data listener on device %s", d.ip)
		}
		t.extra = append(t.extra, ln)
		t.devEps = append(t.devEps, ln.Addr().String())
	}
	return nil
}

// closeExtra closes the devices' own listeners.
func (t *Transport) closeExtra() {
	for _, ln := range t.extra {
		ln.Close()
	}
}

// via is how a rail's pool address names the local address it dials from:
// "10.0.1.2:4000 via 10.0.1.1", or "via any" (the pool shows it in errors
// as it is).
const via = " via "

// tcpRail is one local NIC to one peer endpoint.
type tcpRail struct {
	rails.Rail
	addr string // the pool's address: remote, or remote via local
	name string // in Stats: "L-R", L "any" when unbound, R the peer's IP
	peer atomic.Pointer[pipe.Peer[item]]
}

// railSet is the rails to one peer engine that publishes several endpoints.
type railSet struct {
	t     *Transport
	rails []*tcpRail
	used  atomic.Int64 // unix nanoseconds of the last request
	rot   atomic.Uint64
}

// railSets holds the rail sets by peer instance and endpoints.
type railSets struct {
	mu      sync.Mutex
	m       map[string]*railSet
	retired map[string]rails.Counters // sets dropped: their rails' totals
}

// railsOf returns the rails to d's engine, or nil when it publishes one
// tcp endpoint (or is a Mooncake engine): its requests go the single path.
func (t *Transport) railsOf(d *segment.Desc) *railSet {
	list := d.Endpoints[EndpointsKey]
	if list == "" || d.IsMooncake() {
		return nil
	}
	primary := d.Endpoints[Name]
	eps := t.reachable(parseEndpoints(primary, list))
	if len(eps) < 2 {
		return nil
	}
	key := d.Instance + "|" + strings.Join(eps, ",")
	s := &t.railSets
	now := time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	if rs := s.m[key]; rs != nil {
		rs.used.Store(now)
		return rs
	}
	s.prune(now, t.opt.PeerIdle)
	rs := &railSet{t: t}
	rs.used.Store(now)
	for _, sp := range pairRails(t.devs, eps) {
		l := sp.local
		if l == "" {
			l = anyLocal
		}
		r := &tcpRail{addr: sp.remote + via + l}
		h, _, _ := net.SplitHostPort(sp.remote)
		r.name = l + "-" + h
		rs.rails = append(rs.rails, r)
	}
	if s.m == nil {
		s.m = map[string]*railSet{}
	}
	s.m[key] = rs
	return rs
}

// reachable drops the endpoints of a peer on another host that carry an
// address of this host (a container bridge's, the same on every host, say):
// dialing one reaches this host, not the peer. A peer whose primary
// endpoint is one of this host's addresses is on this host, and keeps all.
func (t *Transport) reachable(eps []string) []string {
	ours := func(ep string) bool {
		h, _, _ := net.SplitHostPort(ep)
		ip := net.ParseIP(h)
		if ip == nil {
			return false
		}
		for _, a := range t.localIPs {
			if a.Equal(ip) {
				return true
			}
		}
		return false
	}
	if ours(eps[0]) {
		return eps
	}
	out := eps[:1]
	for _, ep := range eps[1:] {
		if !ours(ep) {
			out = append(out, ep)
		}
	}
	return out
}

// prune drops the sets unused for idle (at least a minute): a restarted
// peer publishes new endpoints and the old set goes. Their counters stay
// in Stats. The caller holds s.mu.
func (s *railSets) prune(now int64, idle time.Duration) {
	idle = max(idle, time.Minute)
	for k, rs := range s.m {
		if now-rs.used.Load() < int64(idle) {
			continue
		}
		delete(s.m, k)
		if s.retired == nil {
			s.retired = map[string]rails.Counters{}
		}
		for _, r := range rs.rails {
			s.retired[r.name] = addCounters(s.retired[r.name], r.Counters())
		}
	}
}

func addCounters(a, b rails.Counters) rails.Counters {
	return rails.Counters{Bytes: a.Bytes + b.Bytes, Errors: a.Errors + b.Errors, Retries: a.Retries + b.Retries, Cooldowns: a.Cooldowns + b.Cooldowns}
}

// stats adds the rails' counters to out (Transport.Stats).
func (s *railSets) stats(out map[string]uint64) {
	s.mu.Lock()
	tot := make(map[string]rails.Counters, len(s.retired))
	for k, v := range s.retired {
		tot[k] = v
	}
	for _, rs := range s.m {
		for _, r := range rs.rails {
			tot[r.name] = addCounters(tot[r.name], r.Counters())
			out["rail."+r.name+".rate"] = uint64(r.Rate()) // a gauge: the estimate now
		}
	}
	s.mu.Unlock()
	for _, k := range []string{"rail_bytes", "rail_errors", "rail_retries", "rail_cooldowns"} {
		out[k] = 0
	}
	for k, c := range tot {
		for _, f := range []struct {
			n string
			v uint64
		}{{"bytes", c.Bytes}, {"errors", c.Errors}, {"retries", c.Retries}, {"cooldowns", c.Cooldowns}} {
			out["rail."+k+"."+f.n] += f.v
			out["rail_"+f.n] += f.v
		}
	}
}

// active returns the rails that may take slices now; when every one cools
// down, all of them (the request then fails with their error, or finds one
// back).
func (rs *railSet) active(now int64, except *tcpRail) []*tcpRail {
	out := make([]*tcpRail, 0, len(rs.rails))
	for _, r := range rs.rails {
		if r != except && r.Usable(now) {
			out = append(out, r)
		}
	}
	if len(out) == 0 && except == nil {
		out = append(out, rs.rails...)
	}
	return out
}

func railsOfSet(rs []*tcpRail) []*rails.Rail {
	out := make([]*rails.Rail, len(rs))
	for i, r := range rs {
		out[i] = &r.Rail
	}
	return out
}

// peerOf returns the rail's pooled peer, marked used.
func (rs *railSet) peerOf(r *tcpRail) (*pipe.Peer[item], error) {
	p, err := rs.t.tef.pool.Peer(r.addr)
	if err == nil {
		r.peer.Store(p)
	}
	return p, err
}

// slot is a connection of a rail's peer, for grouping a submit's items.
type slot struct {
	p *pipe.Peer[item]
	i int
}

// spread cuts op o (length bytes) into slices and spreads them over the
// usable rails by rate and backlog (rails.Split), each rail's run striped
// over its connections; the items are added to groups. An error (the pool
// closed) completes nothing: the caller completes the request with it.
func (rs *railSet) spread(o *op, length, slice uint64, groups map[slot][]item) error {
	now := rails.Now()
	act := rs.active(now, nil)
	n := int((length + slice - 1) / slice)
	counts := make([]int, len(act))
	if n == 1 {
		counts[rails.Pick(railsOfSet(act), length, rs.rot.Add(1))] = 1
	} else {
		rails.Split(railsOfSet(act), n, slice, length, counts)
	}
	peers := make([]*pipe.Peer[item], len(act))
	for i, r := range act {
		if counts[i] == 0 {
			continue
		}
		p, err := rs.peerOf(r)
		if err != nil {
			return err
		}
		peers[i] = p
	}
	o.rs = rs
	o.remaining.Store(int32(n))
	s := uint64(0)
	for i, r := range act {
		if counts[i] == 0 {
			continue
		}
		p := peers[i]
		start, conns := p.Stripe(), p.Conns()
		var bytes uint64
		for k := 0; k < counts[i]; k++ {
			off := s * slice
			it := item{op: o, off: off, n: min(slice, length-off), rail: r}
			bytes += it.n
			sk := slot{p, (start + k) % conns}
			groups[sk] = append(groups[sk], it)
			s++
		}
		r.Routed(bytes, now)
	}
	return nil
}

// settle accounts for a rail's slice that ended: its bytes count only when
// the target acknowledged them. A slice lost with its connection (failed,
// stalled past the progress timeout, never opened) cools the rail down and
// goes to another rail; settle then reports true and the slice is not done.
func (rs *railSet) settle(it item, err error) bool {
	r := it.rail
	now := rails.Now()
	if err == nil {
		r.Completed(it.n, now)
		return false
	}
	r.Left(it.n, now)
	if (errs.CodeOf(err) != errs.PeerUnreachable && !errors.Is(err, errWrongEngine)) || it.op.canceled.Load() {
		return false
	}
	if r.Failed(railCooldown, now) && rs.t.logf != nil {
		rs.t.logf("te: tcp: rail %s cools down: %v", r.addr, err)
	}
	if int(it.tries) >= 2*len(rs.rails) || len(rs.active(now, r)) == 0 {
		return false
	}
	r.Retried()
	it.tries++
	// Not from here: Done may run on the connection's own goroutines.
	// Close waits for it (after the pools closed, a slice settles with
	// Closed, which is never sent again, so none starts after that).
	rs.t.resends.Add(1)
	go func() {
		defer rs.t.resends.Done()
		rs.resend(it, err)
	}()
	return true
}

// resend sends a slice that failed on it.rail again, on the rail that
// would finish it first among the others; with none left it fails with
// the error it had.
func (rs *railSet) resend(it item, why error) {
	from := it.rail
	it.rail = nil // settled below without the rails, if it cannot go
	if it.op.canceled.Load() {
		it.Done(errs.New(errs.Canceled, "tcp", "request canceled before it finished"))
		return
	}
	now := rails.Now()
	act := rs.active(now, from)
	if len(act) == 0 {
		it.Done(why)
		return
	}
	r := act[rails.Pick(railsOfSet(act), it.n, rs.rot.Add(1))]
	p, err := rs.peerOf(r)
	if err != nil {
		it.Done(err)
		return
	}
	it.rail = r
	r.Routed(it.n, now)
	p.Send(p.Stripe(), it)
}

// cancel releases the canceled items on every rail's connections.
func (rs *railSet) cancel(peers map[*pipe.Peer[item]]bool) {
	for _, r := range rs.rails {
		if p := r.peer.Load(); p != nil {
			peers[p] = true
		}
	}
}

// warm opens every rail's connections; it fails only when no rail opens.
func (rs *railSet) warm(ctx context.Context, inst string) error {
	var first error
	ok := false
	for _, r := range rs.rails {
		p, err := rs.peerOf(r)
		if err == nil {
			err = p.Warm(ctx)
		}
		if err == nil {
			err = rs.t.ping(ctx, p, inst)
		}
		if err == nil {
			ok = true
		} else if first == nil {
			first = err
		}
	}
	if ok {
		return nil
	}
	return first
}

// anyLocal is a rail's local address when the kernel chooses it.
const anyLocal = "any"

// splitVia parses a pool address: the peer's endpoint, the local address to
// dial from ("" for none), and whether it is a rail's.
func splitVia(addr string) (remote, local string, rail bool) {
	remote, local, rail = strings.Cut(addr, via)
	if local == anyLocal {
		local = ""
	}
	return remote, local, rail
}
