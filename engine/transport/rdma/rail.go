package rdma

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
)

// A rail is one path to one peer engine: a local NIC and one of the peer's
// NICs. Its endpoint (queue pairs) may fail and be replaced; the rail
// outlives it and remembers how fast it moved bytes and how often it
// failed, which decide how much of a request it gets.
type rail struct {
	key   epKey
	local int    // local NIC index
	lname string // local NIC name
	rname string // peer NIC name

	// backlog is the bytes routed to the rail and not yet completed or
	// taken back; with rate it estimates when the rail is free.
	backlog atomic.Int64
	// rate is the moving average of measured throughput, bytes per
	// second (float64 bits); 0 until measured.
	rate atomic.Uint64
	// coolUntil is when a cooling rail may be probed again (unix nanos);
	// 0 when healthy.
	coolUntil atomic.Int64
	// probing is set while a rail whose cooldown ended has not yet proved
	// itself: it gets one slice of a request at most.
	probing atomic.Bool

	mu       sync.Mutex
	winStart int64 // when the rail last became busy (nanos); 0: idle
	winBusy  int64 // busy time of the window before winStart
	winBytes uint64
	errs     []int64 // times of recent error events
	coolFor  time.Duration
	revived  bool // probing after a cooldown (a failure cools it again)

	bytes, errors, retries, cooldowns atomic.Uint64
}

// Measurement window and smoothing of the throughput estimate: a sample
// covers at least minWindow of busy time and minBytes, or longWindow.
const (
	minWindow  = 2 * time.Millisecond
	minBytes   = 256 << 10
	longWindow = 20 * time.Millisecond
	ewma       = 0.25
)

func (r *rail) rateOf() float64 { return math.Float64frombits(r.rate.Load()) }

func (r *rail) setRate(v float64) { r.rate.Store(math.Float64bits(v)) }

// routed accounts for n bytes handed to the rail; a rail that was idle
// starts a measurement window now.
func (r *rail) routed(n uint64, now int64) {
	if r.backlog.Add(int64(n)) == int64(n) {
		r.mu.Lock()
		if r.winStart == 0 {
			r.winStart = now
		}
		r.mu.Unlock()
	}
}

// left accounts for n bytes that ended on the rail without completing
// (failed, flushed, taken back, canceled).
func (r *rail) left(n uint64) { r.backlog.Add(-int64(n)) }

// completed accounts for n bytes the rail moved: they count toward its
// throughput over the time it was busy.
func (r *rail) completed(n uint64, now int64) {
	r.bytes.Add(n)
	busy := r.backlog.Add(-int64(n)) > 0
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.winStart == 0 {
		r.winStart = now
	}
	r.winBytes += n
	d := r.winBusy + now - r.winStart
	if (d >= int64(minWindow) && r.winBytes >= minBytes) || d >= int64(longWindow) {
		sample := float64(r.winBytes) * 1e9 / float64(max(d, 1))
		if old := r.rateOf(); old > 0 {
			sample = old + ewma*(sample-old)
		}
		r.setRate(sample)
		r.winBytes, r.winBusy, d = 0, 0, 0
		r.winStart = now
	}
	if !busy {
		// Idle time does not count: the window keeps its busy time and
		// bytes, and resumes when bytes are routed again.
		r.winBusy, r.winStart = d, 0
	}
	if r.probing.Load() {
		// The probe went through: healthy again.
		r.probing.Store(false)
		if r.revived {
			// Back from a cooldown: the next one starts from the shortest.
			r.revived = false
			r.coolFor = 0
			r.errs = r.errs[:0]
		}
	}
}

// health is the cooldown policy: limit error events within window make a
// rail cool down for cool (doubling with each cooldown in a row, up to
// coolMax); after it, the rail is probed with one slice.
type health struct {
	limit   int
	window  time.Duration
	cool    time.Duration
	coolMax time.Duration
}

// failed records an error event on the rail (one per endpoint failure,
// not per slice) and says whether it started a cooldown, and how long.
func (r *rail) failed(h health, now int64) (time.Duration, bool) {
	r.errors.Add(1)
	if v := r.rateOf(); v > 0 {
		r.setRate(v / 2) // a failing rail gets less until it proves itself
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cooling(now) {
		return 0, false // endpoints failing from before the cooldown
	}
	keep := r.errs[:0]
	for _, t := range r.errs {
		if now-t < int64(h.window) {
			keep = append(keep, t)
		}
	}
	r.errs = append(keep, now)
	if !r.revived && len(r.errs) < h.limit {
		// Suspect until it moves bytes again: one slice of a request, so
		// a dead rail costs a request one slice's detour, not a share.
		r.probing.Store(true)
		return 0, false
	}
	// A failed probe cools again at once, for twice as long.
	if r.coolFor == 0 {
		r.coolFor = h.cool
	} else {
		r.coolFor = min(2*r.coolFor, h.coolMax)
	}
	r.coolUntil.Store(now + int64(r.coolFor))
	r.probing.Store(false)
	r.revived = false
	r.errs = r.errs[:0]
	r.cooldowns.Add(1)
	return r.coolFor, true
}

// usable says whether the rail may take slices now; a cooldown that ended
// turns into a probe.
func (r *rail) usable(now int64) bool {
	u := r.coolUntil.Load()
	if u == 0 {
		return true
	}
	if now < u {
		return false
	}
	if r.coolUntil.CompareAndSwap(u, 0) {
		r.mu.Lock()
		r.revived = true
		r.mu.Unlock()
		r.probing.Store(true)
	}
	return true
}

// cooling reports whether the rail is in a cooldown now.
func (r *rail) cooling(now int64) bool {
	u := r.coolUntil.Load()
	return u != 0 && now < u
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
func (p *peerHealth) failed(h health, now int64, err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if u := p.coolUntil.Load(); u != 0 && now < u {
		return false // endpoints failing from before the cooldown
	}
	ok := p.lastOK.Load()
	keep := p.errs[:0]
	for _, t := range p.errs {
		if now-t < int64(h.window) && t > ok {
			keep = append(keep, t)
		}
	}
	p.errs = append(keep, now)
	if len(p.errs) < h.limit {
		return false
	}
	if p.coolFor == 0 || ok > p.cooledAt {
		// The first cooldown, or the first since bytes moved again.
		p.coolFor = h.cool
	} else {
		p.coolFor = min(2*p.coolFor, h.coolMax)
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
	v[0] += r.bytes.Load()
	v[1] += r.errors.Load()
	v[2] += r.retries.Load()
	v[3] += r.cooldowns.Load()
}
