package rails

import (
	"testing"
	"time"
)

// TestSplitByRate: slices go in proportion to measured rate, less what a
// rail already holds.
func TestSplitByRate(t *testing.T) {
	a, b := &Rail{}, &Rail{}
	a.setRate(3e9)
	b.setRate(1e9)
	c := make([]int, 2)
	Split([]*Rail{a, b}, 40, 1<<20, 40<<20, c)
	if c[0] != 30 || c[1] != 10 {
		t.Fatalf("rates 3:1 split %v, want [30 10]", c)
	}
	// b equal in rate but holding 20 MiB already: a takes the first 20.
	b.setRate(3e9)
	b.Routed(20<<20, Now())
	Split([]*Rail{a, b}, 40, 1<<20, 40<<20, c)
	if c[0] != 30 || c[1] != 10 {
		t.Fatalf("backlog 0 and 20 MiB split %v, want [30 10]", c)
	}
	// Unmeasured rails split evenly.
	Split([]*Rail{{}, {}}, 10, 1<<20, 10<<20, c)
	if c[0] != 5 || c[1] != 5 {
		t.Fatalf("unmeasured split %v", c)
	}
}

// TestCooldownAndProbe: a failed rail cools down, then takes one slice as a
// probe, and is healthy again once that slice completes.
func TestCooldownAndProbe(t *testing.T) {
	r, ok := &Rail{}, &Rail{}
	cd := Cooldown{Cool: 50 * time.Millisecond, CoolMax: time.Second}
	now := Now()
	if !r.Failed(cd, now) || r.Failed(cd, now) {
		t.Fatal("a failure must start one cooldown, the next during it none")
	}
	if r.Usable(now) || !r.Cooling(now) {
		t.Fatal("cooling rail usable")
	}
	later := now + int64(60*time.Millisecond)
	if !r.Usable(later) || !r.Probing() {
		t.Fatal("after the cooldown the rail must be a probe")
	}
	c := make([]int, 2)
	Split([]*Rail{r, ok}, 10, 1<<20, 10<<20, c)
	if c[0] != 1 || c[1] != 9 {
		t.Fatalf("probe split %v, want [1 9]", c)
	}
	r.Routed(1<<20, later)
	Split([]*Rail{r, ok}, 10, 1<<20, 10<<20, c)
	if c[0] != 0 {
		t.Fatalf("a probe with a slice out took %d more", c[0])
	}
	r.Completed(1<<20, later+1)
	if r.Probing() {
		t.Fatal("still probing after a completed slice")
	}
	if got := r.Counters(); got.Errors != 1 || got.Cooldowns != 1 || got.Bytes != 1<<20 {
		t.Fatalf("counters %+v", got)
	}
	// A failure again starts from the shortest cooldown; one during a
	// probe doubles it.
	r.Failed(cd, later+2)
	if r.Usable(later + 2 + int64(40*time.Millisecond)) {
		t.Fatal("usable before the cooldown ended")
	}
	next := later + 2 + int64(60*time.Millisecond)
	if !r.Usable(next) {
		t.Fatal("not usable after the cooldown")
	}
	r.Failed(cd, next)
	if r.Usable(next + int64(60*time.Millisecond)) {
		t.Fatal("a failed probe must cool down twice as long")
	}
}

// A peer is unreachable after Limit failures within Window with nothing
// moved since the first, and, with MinSpan, only once they went on that
// long: a burst at one moment is not enough.
func TestPeerMinSpan(t *testing.T) {
	h := Health{Limit: 3, Window: 10 * time.Second, MinSpan: time.Second, Cooldown: Cooldown{Cool: 30 * time.Second, CoolMax: time.Minute}}
	const ms = int64(time.Millisecond)
	var p Peer
	now := int64(time.Hour)
	for i := range 5 {
		if p.Failed(h, now+int64(i)*ms, nil, "x") {
			t.Fatalf("failure %d within 5 ms made the peer unreachable", i+1)
		}
	}
	if !p.Failed(h, now+1001*ms, nil, "x") {
		t.Fatal("failures over more than MinSpan with nothing moved: still reachable")
	}
	if err := p.Unreachable(now+1002*ms, "x"); err == nil {
		t.Fatal("no cooldown reported")
	}
	// Bytes moved since: the failures before them no longer count.
	var q Peer
	q.Failed(h, now, nil, "x")
	q.Failed(h, now+ms, nil, "x")
	q.OK(now + 2*ms)
	if q.Failed(h, now+1500*ms, nil, "x") || q.Failed(h, now+1600*ms, nil, "x") {
		t.Fatal("failures before bytes moved were counted")
	}
	if !q.Failed(h, now+2600*ms, nil, "x") {
		t.Fatal("three failures over a second since bytes moved: still reachable")
	}
}
