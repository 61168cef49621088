package rdma

import (
	"time"

	"github.com/tecache/te/engine/transport/internal/rails"
)

// epoch makes nanotime monotonic and never 0 (0 means "none" in rails).
var epoch = time.Now().Add(-time.Second)

// nanotime is a monotonic clock in nanoseconds.
func nanotime() int64 { return int64(time.Since(epoch)) }

// maxSplit bounds the rails one request is spread over.
const maxSplit = 32

// active returns the rails requests of plan p may use now, into buf:
// tier 0's usable ones; when every one of them cools down, as many of tier
// 1's; when all of those do too, tier 0 anyway (a cooldown that ended turns
// a rail into a probe; the peer as a whole is reported unreachable by then).
// A suspect rail (one that failed and has not moved bytes since) waits out
// its reconnection before it is given a probe slice, so no request waits
// on a handshake with a NIC that may be dead: t starts that reconnection
// here, in the background (t nil: planning alone, in tests).
func (pi *peerInfo) active(t *Transport, p *plan, now int64, buf []int32) []int32 {
	buf = buf[:0]
	ok := func(x int32) bool {
		r := pi.rails[x]
		if !r.Usable(now) {
			return false
		}
		if t == nil || !r.Probing() {
			return true
		}
		ep := pi.eps[x].Load()
		if ep == nil || ep.failed() {
			if e, err := t.endpoint(pi, x); err == nil {
				pi.eps[x].Store(e)
			}
			return false
		}
		return ep.state.Load() == epReady
	}
	for _, x := range p.tier0 {
		if ok(x) {
			buf = append(buf, x)
		}
	}
	if len(buf) > 0 {
		return buf
	}
	want := max(1, len(p.tier0))
	for _, x := range p.tier1 {
		if len(buf) < want && ok(x) {
			buf = append(buf, x)
		}
	}
	if len(buf) > 0 {
		return buf
	}
	return append(buf, p.tier0...)
}

// loads returns the split's view of the rails of act (at most maxSplit).
func (pi *peerInfo) loads(act []int32, buf *[maxSplit]rails.Load) []rails.Load {
	m := min(len(act), maxSplit)
	for i, x := range act[:m] {
		r := pi.rails[x]
		buf[i] = r.Load()
	}
	return buf[:m]
}

// pick returns the rail of act that would finish n more bytes first, given
// what it holds and how fast it moves; ties go round from rot
// (rails.PickLoad).
func (pi *peerInfo) pick(act []int32, n uint64, rot uint64) int32 {
	if len(act) == 1 {
		return act[0]
	}
	var buf [maxSplit]rails.Load
	return act[rails.PickLoad(pi.loads(act, &buf), n, rot)]
}

// share is a run of a request's slices for one rail.
type share struct {
	rail int32
	n    int32
}

// split spreads n slices of size bytes (length in all) over the rails of
// act so that they all finish at about the same time (rails.Fill: in
// proportion to measured throughput less backlog; a probe gets one slice
// at most). It writes the shares, in act's order, and returns how many.
func (pi *peerInfo) split(act []int32, n int32, size, length uint64, out *[maxSplit]share) int {
	var buf [maxSplit]rails.Load
	ls := pi.loads(act, &buf)
	var c [maxSplit]int
	rails.Fill(ls, int(n), size, length, c[:len(ls)])
	k := 0
	for i := range ls {
		if c[i] > 0 {
			out[k] = share{rail: act[i], n: int32(c[i])}
			k++
		}
	}
	return k
}

// retryRail picks the rail for another attempt of a slice that failed on
// rail failed: tier 0 first, then tier 1; in each, a rail that shares
// neither NIC with the failed one first (either end may be what broke),
// then one that shares one; among those, the one free first. Only when
// nothing else can be used does it return the failed rail again (its
// endpoint is reconnected).
func (pi *peerInfo) retryRail(p *plan, failed int32, n uint64, now int64, rot uint64) int32 {
	f := pi.rails[failed]
	var buf [maxSplit]int32
	// A suspect rail still reconnecting is a last resort.
	ready := func(x int32) bool {
		if !pi.rails[x].Probing() {
			return true
		}
		ep := pi.eps[x].Load()
		return ep != nil && ep.state.Load() == epReady
	}
	for _, strict := range []bool{true, false} {
		for _, tier := range [][]int32{p.tier0, p.tier1} {
			for _, disjoint := range []bool{true, false} {
				c := buf[:0]
				for _, x := range tier {
					r := pi.rails[x]
					if x == failed || !r.Usable(now) || len(c) == maxSplit || (strict && !ready(x)) {
						continue
					}
					if (r.local != f.local && r.rname != f.rname) == disjoint {
						c = append(c, x)
					}
				}
				if len(c) > 0 {
					return pi.pick(c, n, rot)
				}
			}
		}
	}
	return failed
}
