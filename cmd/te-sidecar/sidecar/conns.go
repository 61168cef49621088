package sidecar

import (
	"container/list"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
)

// gate admits the connections the sidecar serves, before any byte is read,
// so that connections that never authenticate cannot take the slots of
// clients that do:
//
//   - every connection counts against MaxConns and MaxConnsPerIP
//     (connlimit.Limiter);
//   - a connection is pending until a request on it passes a route's access
//     check (the token, or a route open to all without a secret). Pending
//     connections may hold at most MaxConns-ReservedConns slots in all and
//     MaxPendingPerIP from one address, and each read on one (the request
//     line and headers, a keep-alive wait) gets HeaderTimeout;
//   - a newcomer that finds the pending slots of its address taken closes
//     that address's oldest pending connection; one that finds the pending
//     share of all addresses taken closes the oldest pending connection of
//     the address holding the most (a flood loses its own first). Either
//     only if the victim has had HeaderTimeout/20 to send a request; else
//     the newcomer is admitted over the share, so that a client opening
//     many connections at once does not close its own. A newcomer that
//     finds every slot taken closes the heaviest address's oldest pending
//     connection, else it is answered 503 and closed.
//
// So idle or slow connections, from any number of addresses, hold at most
// the pending share for at most HeaderTimeout each, and a client that sends
// its token at once always gets a slot and keeps it.
type gate struct {
	lim           *connlimit.Limiter
	maxPending    int
	pendingPerIP  int
	headerTimeout time.Duration
	m             gateMetrics
	instance      string // the sidecar's, for refusals

	mu      sync.Mutex
	pending *list.List                // *gconn, oldest first
	byIP    map[netip.Addr]*list.List // pending *gconn per address, oldest first
	authed  int
}

type gateMetrics struct {
	open      Gauge   // te_sidecar_connections{state}
	accepted  Counter // te_sidecar_connections_accepted_total
	authed    Counter // te_sidecar_connections_authenticated_total
	evicted   Counter // te_sidecar_connections_evicted_total{reason}
	refused   Counter // te_sidecar_connections_refused_total{reason}
	timeouts  Counter // te_sidecar_connection_read_timeouts_total{state}
	onRefusal func(remote net.Addr, reason string)
}

func newGate(maxConns, perIP, reserved, pendingPerIP int, headerTimeout time.Duration, m *Metrics) *gate {
	g := &gate{
		lim: connlimit.New(maxConns, perIP), maxPending: max(1, maxConns-reserved), pendingPerIP: pendingPerIP,
		headerTimeout: headerTimeout, pending: list.New(), byIP: map[netip.Addr]*list.List{},
	}
	g.m = gateMetrics{
		open: m.Gauge("te_sidecar_connections", "Connections open, by state: pending (no request has authenticated on it yet) "+
			"or authenticated.", "state"),
		accepted: m.Counter("te_sidecar_connections_accepted_total", "Connections accepted and admitted."),
		authed: m.Counter("te_sidecar_connections_authenticated_total",
			"Connections that passed a route's access check and left the pending share."),
		evicted: m.Counter("te_sidecar_connections_evicted_total",
			"Pending connections closed to admit a newcomer, by the bound that was full: pending_per_ip (-max-pending-conns-per-ip), "+
				"pending (-max-conns less -reserved-conns), conns_per_ip (-max-conns-per-ip), conns (-max-conns).", "reason"),
		refused: m.Counter("te_sidecar_connections_refused_total",
			"Connections answered 503 and closed because every slot was held by authenticated connections, by the bound: "+
				"conns (-max-conns) or conns_per_ip (-max-conns-per-ip).", "reason"),
		timeouts: m.Counter("te_sidecar_connection_read_timeouts_total",
			"Connections closed because a read passed its deadline, by state (pending connections get -header-timeout).", "state"),
	}
	g.m.open.Set(0, "pending")
	g.m.open.Set(0, "authenticated")
	return g
}

// listener admits accepted connections through a gate.
type listener struct {
	net.Listener
	g *gate
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if gc := l.g.admit(c); gc != nil {
			return gc, nil
		}
	}
}

// gconn is an admitted connection.
type gconn struct {
	net.Conn
	g       *gate
	ip      netip.Addr
	hasIP   bool
	at      time.Time // admitted
	release func()

	mu     sync.Mutex
	authed bool
	closed bool
	want   time.Time     // the read deadline the server asked for
	elem   *list.Element // in g.pending while pending
	ipElem *list.Element // in g.byIP[ip] while pending
}

// admit takes a slot for c, making room among the pending connections if
// it must; it returns nil when c was refused (and closed).
func (g *gate) admit(c net.Conn) *gconn {
	gc := &gconn{Conn: c, g: g}
	gc.ip, gc.hasIP = addrOf(c.RemoteAddr())
	// Room in the pending share first: per address, then in all.
	// A victim must have had minAge to send its request: a burst of new
	// connections from a real client is admitted over the share instead
	// (the hard bounds below still hold).
	now := time.Now()
	gc.at = now
	g.mu.Lock()
	var victim *gconn
	reason := ""
	if l := g.byIP[gc.ip]; gc.hasIP && l != nil && l.Len() >= g.pendingPerIP {
		victim, reason = l.Front().Value.(*gconn), "pending_per_ip"
	} else if g.pending.Len() >= g.maxPending {
		victim, reason = g.heaviest(), "pending"
	}
	if victim != nil && now.Sub(victim.at) < g.minAge() {
		victim = nil
	}
	g.mu.Unlock()
	if victim != nil {
		g.evict(victim, reason)
	}
	for try := 0; ; try++ {
		before := g.lim.Stats().RefusedPerHost
		release, err := g.lim.Admit(c.RemoteAddr())
		if err == nil {
			gc.release = release
			break
		}
		// Accept runs on one goroutine, the only caller of Admit: the
		// per-address count moved only if that bound refused.
		perIP := g.lim.Stats().RefusedPerHost != before
		reason := "conns"
		g.mu.Lock()
		victim = nil
		if perIP {
			reason = "conns_per_ip"
			if l := g.byIP[gc.ip]; l != nil && l.Len() > 0 {
				victim = l.Front().Value.(*gconn)
			}
		} else {
			victim = g.heaviest()
		}
		g.mu.Unlock()
		if victim == nil || try > 0 {
			g.m.refused.Inc(reason)
			msg := "every connection slot is held by connections that authenticated (-max-conns): retry later"
			if perIP {
				msg = "every connection slot of this address is held by connections that authenticated (-max-conns-per-ip): retry later"
			}
			refuseConn(c, g.instance, msg)
			if g.m.onRefusal != nil {
				g.m.onRefusal(c.RemoteAddr(), reason)
			}
			return nil
		}
		g.evict(victim, reason)
	}
	// Until the server sets its own deadline.
	c.SetReadDeadline(time.Now().Add(g.headerTimeout))
	g.mu.Lock()
	gc.elem = g.pending.PushBack(gc)
	if gc.hasIP {
		l := g.byIP[gc.ip]
		if l == nil {
			l = list.New()
			g.byIP[gc.ip] = l
		}
		gc.ipElem = l.PushBack(gc)
	}
	g.mu.Unlock()
	g.m.accepted.Inc()
	g.m.open.Add(1, "pending")
	return gc
}

// heaviest returns the oldest pending connection of the address holding
// the most pending connections (the oldest of all when none has an
// address), nil when none is pending: a flood loses its own connections
// first, and a client with one pending connection keeps it. Callers hold
// g.mu.
func (g *gate) heaviest() *gconn {
	var most *list.List
	for _, l := range g.byIP {
		if most == nil || l.Len() > most.Len() || (l.Len() == most.Len() &&
			l.Front().Value.(*gconn).at.Before(most.Front().Value.(*gconn).at)) {
			most = l
		}
	}
	if most != nil && most.Len() > 0 {
		return most.Front().Value.(*gconn)
	}
	if g.pending.Len() > 0 {
		return g.pending.Front().Value.(*gconn)
	}
	return nil
}

// minAge is how long a pending connection is spared from eviction for the
// pending share: a twentieth of HeaderTimeout.
func (g *gate) minAge() time.Duration { return g.headerTimeout / 20 }

// evict closes a pending connection to make room. One that authenticated
// since it was picked is left alone: the newcomer then overshoots the
// pending share by one until a pending connection goes.
func (g *gate) evict(victim *gconn, reason string) {
	victim.mu.Lock()
	authed := victim.authed
	victim.mu.Unlock()
	if !authed {
		g.m.evicted.Inc(reason)
		victim.Close()
	}
}

// unlist takes c off the pending lists. Callers hold g.mu.
func (g *gate) unlist(c *gconn) bool {
	if c.elem == nil {
		return false
	}
	g.pending.Remove(c.elem)
	c.elem = nil
	if c.ipElem != nil {
		l := g.byIP[c.ip]
		l.Remove(c.ipElem)
		c.ipElem = nil
		if l.Len() == 0 {
			delete(g.byIP, c.ip)
		}
	}
	return true
}

// authenticated moves c out of the pending share once a request on it
// passed a route's access check; its reads get the server's deadlines back.
func (g *gate) authenticated(nc net.Conn) {
	c, ok := nc.(*gconn)
	if !ok {
		return
	}
	c.mu.Lock()
	if c.authed || c.closed {
		c.mu.Unlock()
		return
	}
	c.authed = true
	want := c.want
	c.mu.Unlock()
	g.mu.Lock()
	g.unlist(c)
	g.authed++
	g.mu.Unlock()
	g.m.authed.Inc()
	g.m.open.Add(-1, "pending")
	g.m.open.Add(1, "authenticated")
	c.Conn.SetReadDeadline(want)
}

// SetReadDeadline keeps the server's deadline, cut to HeaderTimeout from
// now while the connection is pending.
func (c *gconn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.want = t
	authed := c.authed
	c.mu.Unlock()
	if !authed {
		if limit := time.Now().Add(c.g.headerTimeout); t.IsZero() || t.After(limit) {
			t = limit
		}
	}
	return c.Conn.SetReadDeadline(t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *gconn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *gconn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			c.mu.Lock()
			state := "pending"
			if c.authed {
				state = "authenticated"
			}
			c.mu.Unlock()
			c.g.m.timeouts.Inc(state)
		}
	}
	return n, err
}

// Close closes the connection and frees its slot (once).
func (c *gconn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	authed := c.authed
	c.mu.Unlock()
	err := c.Conn.Close()
	g := c.g
	g.mu.Lock()
	g.unlist(c)
	if authed {
		g.authed--
	}
	g.mu.Unlock()
	if authed {
		g.m.open.Add(-1, "authenticated")
	} else {
		g.m.open.Add(-1, "pending")
	}
	c.release()
	return err
}

// refuseConn answers 503 with a JSON body on a connection that gets no
// slot and closes it. The write has a short deadline: the accept loop
// must not wait on a peer that does not read.
func refuseConn(c net.Conn, instance, msg string) {
	body := errorJSON(instance, msg, errs.ResourceExhausted, nil)
	c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	c.Write([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\n" +
		"Content-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + string(body)))
	c.Close()
}

// addrOf returns the IP address of a remote address (IPv4-mapped IPv6 as
// IPv4), false when it has none.
func addrOf(a net.Addr) (netip.Addr, bool) {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, ok := netip.AddrFromSlice(ta.IP)
		return ip.Unmap(), ok
	}
	if a == nil {
		return netip.Addr{}, false
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, false
	}
	return ap.Addr().Unmap(), true
}
