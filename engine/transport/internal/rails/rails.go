// Package rails is the NIC-agnostic part of multi-rail striping: a Rail is
// one path to a peer (a local NIC and one of the peer's), which remembers how
// fast it moved bytes, what it holds now, and whether it is cooling down
// after a failure; Split spreads a request's slices over usable rails so
// they finish together; Pick chooses one rail for a slice sent again.
//
// Every multi-rail transport keeps its rails here: tcp and fabric, whose
// completions come in bursts, measure them over long windows (Bursty) and
// cool a rail down at its first failure; rdma, whose NICs complete work
// requests one by one, measures over short windows (Steady) and cools a
// rail only after a number of failures within a window, a suspect rail
// taking one slice at a time in between (Health). A fix to the rate
// estimate, the split or the cooldowns lands in all of them.
package rails

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// epoch makes Now monotonic and never 0 (0 means "none" below).
var epoch = time.Now().Add(-time.Second)

// Now is a monotonic clock in nanoseconds, never 0.
func Now() int64 { return int64(time.Since(epoch)) }

// Window is how a rail measures its throughput: a sample covers at least
// Min of busy time and MinBytes, or Long; it moves the estimate by Alpha
// when Alpha is set, else by its share of Tau. Busy time and bytes carry
// over idle spells, so small transfers add up to a window too.
type Window struct {
	Min, Long time.Duration
	MinBytes  uint64
	Alpha     float64
	Tau       time.Duration
}

// Bursty is the window of transports whose completions come in bursts
// (tcp settles the WRITE slices of one writev together once it returned,
// often several MiB; libfabric's tcp provider alike), and the default: a
// sample is only as good as its window is long next to a burst, since
// short windows read several times the real rate on the burst and next to
// nothing between, and a rail would get most (or next to none) of the next
// requests for one unlucky sample. Until a rail is measured it counts as
// fast as the others, and the backlog alone balances the rails; the rate
// is the slow signal (a NIC's capacity), the backlog the quick one.
var Bursty = Window{Min: 500 * time.Millisecond, Long: 2 * time.Second, MinBytes: 16 << 20, Tau: 2 * time.Second}

// Steady is the window of transports whose NICs complete work requests
// one by one (rdma): a few milliseconds of busy time make a good sample,
// and a quarter of each moves the estimate.
var Steady = Window{Min: 2 * time.Millisecond, Long: 20 * time.Millisecond, MinBytes: 256 << 10, Alpha: 0.25}

// Cooldown bounds: a rail that failed rests Cool, doubling with each
// failure in a row up to CoolMax; after it, it is probed with one slice.
type Cooldown struct {
	Cool, CoolMax time.Duration
}

// Health is when failures cool a rail down: Limit failures within Window
// (Limit 1 or less: every failure). Fewer make the rail a suspect, probed
// with one slice at a time until it moves bytes again, so a dead rail
// costs a request one slice's detour, not a share. For a Peer, MinSpan is
// how long the failures must go on: a burst at one moment (one event seen
// by several endpoints, a loaded machine) is not yet a peer that cannot be
// reached.
type Health struct {
	Limit   int
	Window  time.Duration
	MinSpan time.Duration
	Cooldown
}

// Rail is one path to a peer. Its zero value is a healthy, unmeasured rail.
type Rail struct {
	// backlog is the bytes routed to the rail and not yet completed or
	// taken back; with rate it estimates when the rail is free.
	backlog atomic.Int64
	// rate is the moving average of measured throughput, bytes per
	// second (float64 bits); 0 until measured.
	rate atomic.Uint64
	// coolUntil is when a cooling rail may be probed again (Now units);
	// 0 when healthy.
	coolUntil atomic.Int64
	// probing: a rail whose cooldown ended and has not moved bytes since
	// gets one slice at a time.
	probing atomic.Bool

	win *Window // nil: Bursty

	mu       sync.Mutex
	winStart int64 // when the rail last became busy; 0: idle
	winBusy  int64 // busy time of the window before winStart
	winBytes uint64
	coolFor  time.Duration
	errs     []int64 // times of recent failures (Health.Limit > 1)
	revived  bool    // probing after a cooldown: success resets the cooldowns

	bytes, errors, retries, cooldowns atomic.Uint64
}

// Measure sets how the rail measures its throughput (Bursty by default);
// call it before the rail is used.
func (r *Rail) Measure(w *Window) { r.win = w }

// SetLoad sets what the split sees of the rail, for tests of a transport's
// routing.
func (r *Rail) SetLoad(l Load) {
	r.setRate(l.Rate)
	r.backlog.Store(l.Backlog)
	r.probing.Store(l.Probing)
}

// Counters are a rail's totals since it was made.
type Counters struct {
	Bytes     uint64 // payload bytes the peer acknowledged
	Errors    uint64 // failures that cooled the rail down (a connection lost or stalled, a dial refused)
	Retries   uint64 // slices sent again on another rail after a failure here
	Cooldowns uint64
}

// Counters returns the rail's totals.
func (r *Rail) Counters() Counters {
	return Counters{r.bytes.Load(), r.errors.Load(), r.retries.Load(), r.cooldowns.Load()}
}

// Rate is the measured throughput in bytes per second, 0 until measured.
func (r *Rail) Rate() float64 { return math.Float64frombits(r.rate.Load()) }

func (r *Rail) setRate(v float64) { r.rate.Store(math.Float64bits(v)) }

// Backlog is the bytes routed to the rail and not yet settled.
func (r *Rail) Backlog() int64 { return r.backlog.Load() }

// Probing reports whether the rail is being probed after a cooldown.
func (r *Rail) Probing() bool { return r.probing.Load() }

// Routed accounts for n bytes handed to the rail; a rail that was idle
// starts a measurement window now. (The backlog moves under mu wherever it
// decides whether the rail is busy, so two settlements at once never leave
// an idle rail's window running, nor a busy one's stopped.)
func (r *Rail) Routed(n uint64, now int64) {
	r.mu.Lock()
	if r.backlog.Add(int64(n)) == int64(n) && r.winStart == 0 {
		r.winStart = now
	}
	r.mu.Unlock()
}

// Left accounts for n bytes that ended on the rail without completing
// (failed, canceled, sent elsewhere); a rail left idle stops its window.
func (r *Rail) Left(n uint64, now int64) {
	r.mu.Lock()
	if r.backlog.Add(-int64(n)) <= 0 && r.winStart != 0 {
		r.winBusy += now - r.winStart
		r.winStart = 0
	}
	r.mu.Unlock()
}

// Retried counts a slice that failed here and went to another rail.
func (r *Rail) Retried() { r.retries.Add(1) }

// Completed accounts for n bytes the peer acknowledged on the rail: they
// count toward its throughput over the time it was busy, and end a probe.
func (r *Rail) Completed(n uint64, now int64) {
	r.bytes.Add(n)
	r.mu.Lock()
	busy := r.backlog.Add(-int64(n)) > 0
	if r.winStart == 0 {
		r.winStart = now
	}
	r.winBytes += n
	w := r.win
	if w == nil {
		w = &Bursty
	}
	d := r.winBusy + now - r.winStart
	if (d >= int64(w.Min) && r.winBytes >= w.MinBytes) || d >= int64(w.Long) {
		sample := float64(r.winBytes) * 1e9 / float64(max(d, 1))
		if old := r.Rate(); old > 0 {
			k := w.Alpha
			if k <= 0 {
				k = min(1, float64(d)/float64(w.Tau))
			}
			sample = old + k*(sample-old)
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
			// Back from a cooldown: the next one starts short.
			r.revived = false
			r.coolFor = 0
			r.errs = r.errs[:0]
		}
	}
	r.mu.Unlock()
}

// Failed records a failure on the rail (a connection lost or stalled, a
// dial that failed) and cools it down, unless it is cooling already (the
// other slices of the connection that failed). It reports whether this
// call started a cooldown.
func (r *Rail) Failed(c Cooldown, now int64) bool {
	_, cool := r.Fail(Health{Limit: 1, Cooldown: c}, now)
	return cool
}

// Fail records a failure event on the rail under policy h: while the rail
// cools down it is one of the failures that started the cooldown and
// counts for nothing; otherwise the rail's rate is halved (it gets less
// until it proves itself), and it cools down once h.Limit failures came
// within h.Window, or at once if it was being probed after a cooldown, for
// twice as long as the last time; below the limit it becomes a suspect. It
// reports how long a cooldown it started, if it did.
func (r *Rail) Fail(h Health, now int64) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if u := r.coolUntil.Load(); u != 0 && now < u {
		return 0, false
	}
	r.errors.Add(1)
	if v := r.Rate(); v > 0 {
		r.setRate(v / 2)
	}
	if h.Limit > 1 {
		keep := r.errs[:0]
		for _, t := range r.errs {
			if now-t < int64(h.Window) {
				keep = append(keep, t)
			}
		}
		r.errs = append(keep, now)
		if !r.revived && len(r.errs) < h.Limit {
			r.probing.Store(true)
			return 0, false
		}
	}
	if r.coolFor == 0 {
		r.coolFor = h.Cool
	} else {
		r.coolFor = min(2*r.coolFor, h.CoolMax)
	}
	r.coolUntil.Store(now + int64(r.coolFor))
	r.probing.Store(false)
	r.revived = false
	r.errs = r.errs[:0]
	r.cooldowns.Add(1)
	return r.coolFor, true
}

// Usable says whether the rail may take slices now; a cooldown that ended
// turns into a probe.
func (r *Rail) Usable(now int64) bool {
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

// Cooling reports whether the rail is in a cooldown now.
func (r *Rail) Cooling(now int64) bool {
	u := r.coolUntil.Load()
	return u != 0 && now < u
}

// Load is what the split knows of one rail: its measured rate in bytes per
// second (0: not measured yet), the bytes it holds, and whether it is a
// probe. Transports with rails of their own (rdma) fill it from them.
type Load struct {
	Rate    float64
	Backlog int64
	Probing bool
}

// Load returns the rail's state for Fill and PickLoad.
func (r *Rail) Load() Load {
	return Load{Rate: r.Rate(), Backlog: r.backlog.Load(), Probing: r.probing.Load()}
}

// maxStack is how many rails the split handles without allocating.
const maxStack = 32

// rates fills v with each rail's rate: one not yet measured counts as the
// mean of those that are (all alike when none is).
func rates(ls []Load, v []float64) {
	sum, known := 0.0, 0
	for i, l := range ls {
		v[i] = l.Rate
		if v[i] > 0 {
			sum += v[i]
			known++
		}
	}
	mean := 1.0
	if known > 0 {
		mean = sum / float64(known)
	}
	for i := range ls {
		if v[i] <= 0 {
			v[i] = mean
		}
	}
}

func floats(buf *[maxStack]float64, n int) []float64 {
	if n <= maxStack {
		return buf[:n]
	}
	return make([]float64, n)
}

// Pick returns the index in rs of the rail that would finish n more bytes
// first (PickLoad).
func Pick(rs []*Rail, n uint64, rot uint64) int {
	var buf [maxStack]Load
	ls := buf[:0]
	if len(rs) > maxStack {
		ls = make([]Load, 0, len(rs))
	}
	for _, r := range rs {
		ls = append(ls, r.Load())
	}
	return PickLoad(ls, n, rot)
}

// PickLoad returns the index of the rail that would finish n more bytes
// first, given what it holds and how fast it moves; a probe that holds a
// slice already is passed over; ties go round from rot.
func PickLoad(ls []Load, n uint64, rot uint64) int {
	if len(ls) == 1 {
		return 0
	}
	var vbuf [maxStack]float64
	v := floats(&vbuf, len(ls))
	rates(ls, v)
	best, bestT := 0, -1.0
	for k := range ls {
		i := (int(rot%uint64(len(ls))) + k) % len(ls)
		l := ls[i]
		if l.Probing && l.Backlog > 0 {
			continue
		}
		t := (float64(max(l.Backlog, 0)) + float64(n)) / v[i]
		if bestT < 0 || t < bestT {
			best, bestT = i, t
		}
	}
	return best
}

// Split spreads n slices over rs (Fill).
func Split(rs []*Rail, n int, size, length uint64, counts []int) {
	var buf [maxStack]Load
	ls := buf[:0]
	if len(rs) > maxStack {
		ls = make([]Load, 0, len(rs))
	}
	for _, r := range rs {
		ls = append(ls, r.Load())
	}
	Fill(ls, n, size, length, counts)
}

// Fill spreads n slices of size bytes (length in all) over rails in state
// ls so that they all finish at about the same time: each rail gets bytes
// in proportion to its rate, less what it already holds (water-filling), so
// a slow or busy rail gets less and an idle one more; a probe gets one
// slice at most, and only once its last one is done. It writes into counts
// (len(ls)) how many slices each rail takes.
func Fill(ls []Load, n int, size, length uint64, counts []int) {
	m := len(ls)
	var vbuf, bbuf [maxStack]float64
	var obuf [maxStack]int
	v, b := floats(&vbuf, m), floats(&bbuf, m)
	ord := obuf[:0]
	if m > maxStack {
		ord = make([]int, 0, m)
	}
	rates(ls, v)
	for i, l := range ls {
		b[i] = float64(max(l.Backlog, 0))
		if l.Probing {
			v[i] = min(v[i], 1) // next to nothing: one slice below
		}
		ord = append(ord, i)
	}
	// Order by when each rail is free: backlog / rate.
	for i := 1; i < m; i++ {
		for j := i; j > 0 && b[ord[j]]/v[ord[j]] < b[ord[j-1]]/v[ord[j-1]]; j-- {
			ord[j], ord[j-1] = ord[j-1], ord[j]
		}
	}
	// The finish time T the first k rails reach with all bytes: the
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
	total := 0
	for i := 0; i < m; i++ {
		counts[i] = min(int(max(0, T*v[i]-b[i])/float64(size)), n)
		total += counts[i]
	}
	for i := 0; total > n; i = (i + 1) % m { // rounding cannot do this; be safe
		if counts[i] > 0 {
			counts[i]--
			total--
		}
	}
	// The slices left over from rounding down go one at a time where they
	// finish first: a slow rail is not handed a slice it would end last.
	for total < n {
		best, bestT := 0, -1.0
		for i := 0; i < m; i++ {
			t := (b[i] + float64(counts[i]+1)*float64(size)) / v[i]
			if bestT < 0 || t < bestT {
				best, bestT = i, t
			}
		}
		counts[best]++
		total++
	}
	// A probe whose last slice is done takes one slice (else none); the
	// difference goes to or comes from the rail with the most.
	for i, l := range ls {
		if !l.Probing {
			continue
		}
		want := 0
		if l.Backlog <= 0 {
			want = 1
		}
		most := -1
		for j := range ls {
			if j != i && !ls[j].Probing && (most < 0 || counts[j] > counts[most]) {
				most = j
			}
		}
		if most < 0 || counts[most]+counts[i]-want < 0 {
			continue
		}
		counts[most] += counts[i] - want
		counts[i] = want
	}
}
