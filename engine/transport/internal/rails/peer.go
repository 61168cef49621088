package rails

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
)

// Peer is what a transport knows of one peer engine (instance) as a whole:
// when its rails last moved bytes, and its failures. Failures on its rails
// with nothing moving between them make it unreachable for a cooldown, so
// that the engine takes another transport for it (tcp) until then.
type Peer struct {
	lastOK    atomic.Int64
	coolUntil atomic.Int64
	why       atomic.Pointer[error]

	mu       sync.Mutex
	errs     []int64
	coolFor  time.Duration
	cooledAt int64 // when the last cooldown began
}

// LastOK is when bytes last moved to the peer (0: never).
func (p *Peer) LastOK() int64 { return p.lastOK.Load() }

// CoolUntil is when the peer's cooldown ends (0: none).
func (p *Peer) CoolUntil() int64 { return p.coolUntil.Load() }

// Failed records a failure on a rail to the peer (an endpoint that failed)
// and reports whether the peer is now unreachable: h.Limit failures within
// h.Window, at least h.MinSpan apart from first to last, with no bytes
// moved since the first. The cooldown starts at
// h.Cool and doubles while no bytes move between cooldowns. component
// names the transport in the error Unreachable returns; err is the last
// failure's cause (nil: none known).
func (p *Peer) Failed(h Health, now int64, err error, component string) bool {
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
	if len(p.errs) < max(h.Limit, 1) || now-p.errs[0] < int64(h.MinSpan) {
		return false
	}
	if p.coolFor == 0 || ok > p.cooledAt {
		// The first cooldown, or the first since bytes moved again.
		p.coolFor = h.Cool
	} else {
		p.coolFor = min(2*p.coolFor, h.CoolMax)
	}
	p.cooledAt = now
	var e error = errs.Wrap(errs.PeerUnreachable, component, err, "%d failures and no transfer in between; %s to this peer cools down for %v",
		len(p.errs), component, p.coolFor)
	p.why.Store(&e)
	p.coolUntil.Store(now + int64(p.coolFor))
	p.errs = p.errs[:0]
	return true
}

// OK records bytes moved to the peer.
func (p *Peer) OK(now int64) {
	if p.lastOK.Load() < now {
		p.lastOK.Store(now)
	}
}

// Unreachable returns why the peer is cooling down, or nil.
func (p *Peer) Unreachable(now int64, component string) error {
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
	return errs.New(errs.PeerUnreachable, component, "cooling down after errors")
}
