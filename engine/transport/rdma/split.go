package rdma

import "time"

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
		if !r.usable(now) {
			return false
		}
		if t == nil || !r.probing.Load() {
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

// rates fills v with the measured throughput of each rail of act: a rail
// not yet measured counts as the mean of those that are (all alike when
// none is).
func (pi *peerInfo) rates(act []int32, v []float64) {
	sum, known := 0.0, 0
	for i, x := range act {
		v[i] = pi.rails[x].rateOf()
		if v[i] > 0 {
			sum += v[i]
			known++
		}
	}
	mean := 1.0
	if known > 0 {
		mean = sum / float64(known)
	}
	for i := range act {
		if v[i] <= 0 {
			v[i] = mean
		}
	}
}

// pick returns the rail of act that would finish n more bytes first, given
// what it holds and how fast it moves; ties go round from rot.
func (pi *peerInfo) pick(act []int32, n uint64, rot uint64) int32 {
	if len(act) == 1 {
		return act[0]
	}
	var vs [maxSplit]float64
	m := min(len(act), maxSplit)
	pi.rates(act[:m], vs[:m])
	best, bestT := act[0], -1.0
	for k := 0; k < m; k++ {
		i := (int(rot%uint64(m)) + k) % m
		r := pi.rails[act[i]]
		t := (float64(max(r.backlog.Load(), 0)) + float64(n)) / vs[i]
		if r.probing.Load() && r.backlog.Load() > 0 {
			continue // a probe carries one slice at a time
		}
		if bestT < 0 || t < bestT {
			best, bestT = act[i], t
		}
	}
	return best
}

// share is a run of a request's slices for one rail.
type share struct {
	rail int32
	n    int32
}

// split spreads n slices of size bytes (length in all) over the rails of
// act so that they all finish at about the same time: each rail gets bytes
// in proportion to its measured throughput, less what it already holds
// (water-filling), so a slow or busy rail gets less and an idle one more. A
// probing rail gets one slice at most. It writes the shares, in act's
// order, and returns how many.
func (pi *peerInfo) split(act []int32, n int32, size, length uint64, out *[maxSplit]share) int {
	m := min(len(act), maxSplit)
	var v, b, x [maxSplit]float64
	var ord [maxSplit]int
	pi.rates(act[:m], v[:m])
	for i := 0; i < m; i++ {
		r := pi.rails[act[i]]
		b[i] = float64(max(r.backlog.Load(), 0))
		if r.probing.Load() {
			v[i] = min(v[i], 1) // next to nothing: one slice below
		}
		ord[i] = i
	}
	// Order by when each rail is free: backlog / rate.
	for i := 1; i < m; i++ {
		for j := i; j > 0 && b[ord[j]]/v[ord[j]] < b[ord[j-1]]/v[ord[j-1]]; j-- {
			ord[j], ord[j-1] = ord[j-1], ord[j]
		}
	}
	// The finish time T that the first k rails reach with all bytes: the
	// largest k whose last rail is free before T.
	L := float64(length)
	sumB, sumV, T := 0.0, 0.0, 0.0
	for k := 0; k < m; k++ {
		i := ord[k]
		sumB += b[i]
		sumV += v[i]
		t := (L + sumB) / sumV
		if k > 0 && t < b[i]/v[i] {
			break
		}
		T = t
	}
	for i := 0; i < m; i++ {
		x[i] = max(0, T*v[i]-b[i])
	}
	// Whole slices, the remainder to the largest fractions.
	var c [maxSplit]int32
	total := int32(0)
	for i := 0; i < m; i++ {
		c[i] = min(int32(x[i]/float64(size)), n)
		total += c[i]
	}
	for total > n { // cannot happen (the shares sum to length); be safe
		for i := 0; i < m && total > n; i++ {
			if c[i] > 0 {
				c[i]--
				total--
			}
		}
	}
	// The slices left over from rounding down go, one at a time, where
	// they finish first: a slow rail is not handed a slice it would
	// finish last.
	for total < n {
		best, bestT := -1, 0.0
		for i := 0; i < m; i++ {
			t := (b[i] + float64(c[i]+1)*float64(size)) / v[i]
			if best < 0 || t < bestT {
				best, bestT = i, t
			}
		}
		c[best]++
		total++
	}
	// A probe whose last slice is done takes one slice (else none); the
	// difference goes to or comes from the rail with the most.
	for i := 0; i < m; i++ {
		r := pi.rails[act[i]]
		if !r.probing.Load() {
			continue
		}
		want := int32(0)
		if r.backlog.Load() <= 0 {
			want = 1
		}
		most := -1
		for j := 0; j < m; j++ {
			if j != i && !pi.rails[act[j]].probing.Load() && (most < 0 || c[j] > c[most]) {
				most = j
			}
		}
		if most < 0 || c[most]+c[i]-want < 0 {
			continue
		}
		c[most] += c[i] - want
		c[i] = want
	}
	k := 0
	for i := 0; i < m; i++ {
		if c[i] > 0 {
			out[k] = share{rail: act[i], n: c[i]}
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
		if !pi.rails[x].probing.Load() {
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
					if x == failed || !r.usable(now) || len(c) == maxSplit || (strict && !ready(x)) {
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
