package connlimit

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Policy is the set of connection bounds an engine gives each of its
// listeners and dialled pools (engine.Config.Limits, defaults filled in).
type Policy struct {
	// MaxConns bounds accepted connections per listener (0: no bound).
	MaxConns int
	// MaxConnsPerHost bounds them per remote IP address (0: no bound).
	MaxConnsPerHost int
	// IdleTimeout closes an accepted connection with nothing in flight
	// for this long (0: never).
	IdleTimeout time.Duration
	// HandshakeTimeout bounds authentication (and a data preface), and a
	// frame or request header once its first byte arrived.
	HandshakeTimeout time.Duration
	// ProgressTimeout bounds the time each 64 KiB of a payload may take.
	ProgressTimeout time.Duration
	// PeerIdleTimeout closes dialled connections to a peer that had no
	// request for this long (0: never).
	PeerIdleTimeout time.Duration
}

// Limiter counts a listener's open connections, in total and per remote IP
// address, and refuses those over its bounds. It is safe for concurrent use.
type Limiter struct {
	max, perHost int

	mu    sync.Mutex
	open  int
	hosts map[netip.Addr]int

	accepted, refusedTotal, refusedHost atomic.Uint64
	peak                                atomic.Int64
}

// New returns a Limiter allowing maxConns connections in all and maxPerHost
// from one IP address; a bound <= 0 is no bound.
func New(maxConns, maxPerHost int) *Limiter {
	return &Limiter{max: maxConns, perHost: maxPerHost, hosts: map[netip.Addr]int{}}
}

// Stats are a Limiter's counters.
type Stats struct {
	Open           int    `json:"open"`             // connections admitted and not yet released
	Peak           int    `json:"peak"`             // most open at once
	Accepted       uint64 `json:"accepted"`         // admitted since New
	RefusedTotal   uint64 `json:"refused_total"`    // refused: the listener was at MaxConns
	RefusedPerHost uint64 `json:"refused_per_host"` // refused: the address was at MaxConnsPerHost
}

// Admit takes a slot for a connection from remote. It returns a release
// function, to call once when the connection is closed (later calls do
// nothing), or an errs.ResourceExhausted error saying which bound was hit;
// the caller then closes the connection (after telling the peer, e.g. with
// peerauth.Refuse).
//
// Addresses are keyed by IP (an IPv4-mapped IPv6 address counts as the IPv4
// one), IPv6 addresses by their /64 prefix: one host is usually given a
// whole /64, so keying on the full address would leave it unlimited; an address that is not IP (a pipe, a Unix socket) counts against
// the total only.
func (l *Limiter) Admit(remote net.Addr) (release func(), err error) {
	ip, hasIP := ipOf(remote)
	ip = hostKey(ip)
	l.mu.Lock()
	if l.max > 0 && l.open >= l.max {
		l.mu.Unlock()
		l.refusedTotal.Add(1)
		return nil, errs.New(errs.ResourceExhausted, "accept", "%d connections open, the listener's limit", l.max)
	}
	if hasIP && l.perHost > 0 && l.hosts[ip] >= l.perHost {
		l.mu.Unlock()
		l.refusedHost.Add(1)
		return nil, errs.New(errs.ResourceExhausted, "accept", "%d connections open from %s, the limit per address", l.perHost, keyName(ip))
	}
	l.open++
	if hasIP {
		l.hosts[ip]++
	}
	if int64(l.open) > l.peak.Load() {
		l.peak.Store(int64(l.open))
	}
	l.mu.Unlock()
	l.accepted.Add(1)
	var once atomic.Bool
	return func() {
		if !once.CompareAndSwap(false, true) {
			return
		}
		l.mu.Lock()
		l.open--
		if hasIP {
			if l.hosts[ip]--; l.hosts[ip] <= 0 {
				delete(l.hosts, ip)
			}
		}
		l.mu.Unlock()
	}, nil
}

// Stats returns the counters.
func (l *Limiter) Stats() Stats {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	return Stats{
		Open: open, Peak: int(l.peak.Load()), Accepted: l.accepted.Load(),
		RefusedTotal: l.refusedTotal.Load(), RefusedPerHost: l.refusedHost.Load(),
	}
}

func ipOf(a net.Addr) (netip.Addr, bool) {
	var ip net.IP
	switch v := a.(type) {
	case *net.TCPAddr:
		ip = v.IP
	case *net.UDPAddr:
		ip = v.IP
	case *net.IPAddr:
		ip = v.IP
	default:
		if a == nil {
			return netip.Addr{}, false
		}
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}, false
		}
		return ap.Addr().Unmap(), true
	}
	ad, ok := netip.AddrFromSlice(ip)
	if !ok {
		return netip.Addr{}, false
	}
	return ad.Unmap(), true
}

// hostKey is the per-address budget key of ip: the address itself for
// IPv4, the /64 prefix's first address for IPv6.
func hostKey(ip netip.Addr) netip.Addr {
	if !ip.Is6() || ip.Is4In6() {
		return ip
	}
	return netip.PrefixFrom(ip, 64).Masked().Addr()
}

// keyName names a budget key in a message.
func keyName(k netip.Addr) string {
	if k.Is6() {
		return k.String() + "/64"
	}
	return k.String()
}
