package rdma

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/transport/internal/rails"
	"github.com/tecache/te/internal/errs"
)

// A rail is one path to one peer engine: a local NIC and one of the peer's
// NICs. Its endpoint (queue pairs) may fail and be replaced; the rail
// outlives it and remembers how fast it moved bytes and how often it
// failed, which decide how much of a request it gets: that state and its
// policy are the shared rails.Rail's, measured over short windows
// (rails.Steady: a NIC completes work requests one by one) and cooled by
// the transport's Health (a number of endpoint failures within a window).
type rail struct {
	key   epKey
	local int    // local NIC index
	lname string // local NIC name
	rname string // peer NIC name
	rails.Rail
}

func newRail(key epKey, local int, lname, rname string) *rail {
	r := &rail{key: key, local: local, lname: lname, rname: rname}
	r.Measure(&rails.Steady)
	return r
}

// peerHealth is what the transport knows of one peer instance as a whole:
// when rails to it last moved bytes, and its failures. Errors on every
// rail with nothing moving between them make it unreachable for a
// cooldown, so the engine takes another transport for it.
type peerHealth struct {
	lastOK    atomic.Int64
	coolUntil atomic.Int64
	why       atomic.Pointer[error]

	mu       sync.Mutex
	errs     []int64
	coolFor  time.Duration
	cooledAt int64 // when the last cooldown began
}

// failed records an endpoint failure to the peer and says whether the
// peer is now unreachable.
func (p *peerHealth) failed(h rails.Health, now int64, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u := p.coolUntil.Load(); u != 0 && now < u {
		return false // endpoints failing from before the cooldown
	}
	ok := p.lastOK.Load()
	keep := p.errs[:0]
	for _, t := range p.errs {
		if now-t < int64(h.Window) && t > ok {
			keep = append(keep, t)
		}
	}
	p.errs = append(keep, now)
	if len(p.errs) < h.Limit {
		return false
	}
	if p.coolFor == 0 || ok > p.cooledAt {
		// The first cooldown, or the first since bytes moved again.
		p.coolFor = h.Cool
	} else {
		p.coolFor = min(2*p.coolFor, h.CoolMax)
	}
	p.cooledAt = now
	var e error = errs.Wrap(errs.PeerUnreachable, "rdma", err, "%d endpoint failures and no transfer in between; rdma to this peer cools down for %v",
		len(p.errs), p.coolFor)
	p.why.Store(&e)
	p.coolUntil.Store(now + int64(p.coolFor))
	p.errs = p.errs[:0]
	return true
}

// ok records bytes moved to the peer.
func (p *peerHealth) ok(now int64) {
	if p.lastOK.Load() < now {
		p.lastOK.Store(now)
	}
}

// unreachable returns why the peer is cooling down, or nil.
func (p *peerHealth) unreachable(now int64) error {
	u := p.coolUntil.Load()
	if u == 0 {
		return nil
	}
	if now >= u {
		p.coolUntil.CompareAndSwap(u, 0)
		return nil
	}
	if e := p.why.Load(); e != nil {
		return *e
	}
	return errs.New(errs.PeerUnreachable, "rdma", "cooling down after errors")
}

// railTotals sums the counters of rails by NIC names.
type railTotals map[string]*[4]uint64

func (rt *railTotals) add(r *rail) {
	if *rt == nil {
		*rt = railTotals{}
	}
	k := r.lname + ":" + r.rname
	v := (*rt)[k]
	if v == nil {
		v = new([4]uint64)
		(*rt)[k] = v
	}
	c := r.Counters()
	v[0] += c.Bytes
	v[1] += c.Errors
	v[2] += c.Retries
	v[3] += c.Cooldowns
}
