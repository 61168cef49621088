package engine

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestNotifySeenBounded: the table of notification ids holds at most its
// per-sender and total counts however many ids and senders come, evicts
// oldest first (a sender's flood evicts its own ids, not another's), and
// forgets ids past the window; the slab never grows past the total.
func TestNotifySeenBounded(t *testing.T) {
	const total, per = 1000, 100
	tb := newNotifySeen(time.Minute, total, per)
	now := time.Unix(1000, 0)
	tb.add("quiet", 7, now)
	// One sender, many ids: only its last per are kept.
	for i := range uint64(100_000) {
		tb.add("flood", i, now)
	}
	if ids, senders := tb.len(); ids != per+1 || senders != 2 {
		t.Fatalf("after one sender's flood: %d ids of %d senders, want %d of 2", ids, senders, per+1)
	}
	if !tb.has("quiet", 7, now) {
		t.Fatal("another sender's flood evicted a quiet sender's id")
	}
	if tb.has("flood", 100_000-per-1, now) || !tb.has("flood", 100_000-per, now) || !tb.has("flood", 99_999, now) {
		t.Fatal("a sender's ids are not kept newest first")
	}
	// Many senders: the total bound holds, the oldest go first.
	for s := range 10_000 {
		for i := range uint64(3) {
			tb.add(fmt.Sprint("sender ", s), i, now)
		}
	}
	ids, senders := tb.len()
	if ids != total || senders > total {
		t.Fatalf("after 10000 senders: %d ids of %d senders, want %d", ids, senders, total)
	}
	if tb.has("quiet", 7, now) || !tb.has("sender 9999", 2, now) {
		t.Fatal("the total bound did not evict oldest first")
	}
	if len(tb.slab) != total {
		t.Fatalf("slab of %d entries, bound %d", len(tb.slab), total)
	}
	// Past the window everything is forgotten, and the table is empty.
	later := now.Add(time.Minute + time.Second)
	if tb.has("sender 9999", 2, later) {
		t.Fatal("an id past the window is remembered")
	}
	if ids, senders := tb.len(); ids != 0 || senders != 0 {
		t.Fatalf("past the window: %d ids of %d senders", ids, senders)
	}
	// Slots are reused: the slab does not grow again.
	for i := range uint64(total) {
		tb.add("again", i, later)
	}
	if len(tb.slab) != total {
		t.Fatalf("slab grew to %d on reuse", len(tb.slab))
	}
}

// TestNotifySeenMemory: the worst case of the engine's bounds, every id
// from another sender (their names counted too: the table keeps them), and
// 2^18 ids more from ten thousand senders, hold at most about 16 MiB.
func TestNotifySeenMemory(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tb := newNotifySeen(seenWindow, seenTotal, seenPerSender)
	now := time.Now()
	for i := range uint64(seenTotal) {
		tb.add(fmt.Sprintf("instance %032x", i), i, now)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	ids, senders := tb.len()
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d ids of %d senders held in %.1f MiB", ids, senders, float64(held)/(1<<20))
	if ids != seenTotal || senders != seenTotal || held > 24<<20 {
		t.Fatalf("%d ids of %d senders in %d bytes", ids, senders, held)
	}
	for i := range uint64(1 << 17) {
		tb.add(fmt.Sprintf("instance %032x", i%10_000), i, now)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	ids, senders = tb.len()
	held = int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("then %d ids of %d senders held in %.1f MiB", ids, senders, float64(held)/(1<<20))
	if ids != seenTotal || held > 24<<20 {
		t.Fatalf("%d ids held in %d bytes", ids, held)
	}
	runtime.KeepAlive(tb)
}
