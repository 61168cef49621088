package tcp_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/tcp"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Two loopback "NICs": 127.0.0.2 is as local as 127.0.0.1 on lo.
const twoNICs = "127.0.0.1,127.0.0.2"

// railPair starts a target and an initiator engine, each with the two
// loopback NICs, the target's tcp transport captured, and the target's
// buffer of n bytes opened by the initiator.
type railPair struct {
	init, tgt  *engine.Engine
	tr         *tcp.Transport // the target's
	local, rem []byte
	seg        *engine.Segment
}

func newRailPair(t *testing.T, n int, params map[string]string) *railPair {
	t.Helper()
	rp := &railPair{local: alloc(t, 2*n), rem: alloc(t, n)}
	var mu sync.Mutex
	var started []*tcp.Transport
	restore := tcp.OnStart(func(x *tcp.Transport) { mu.Lock(); started = append(started, x); mu.Unlock() })
	p := map[string]string{"tcp.devices": twoNICs}
	for k, v := range params {
		p[k] = v
	}
	rp.tgt = newEngine(t, "", p)
	rp.init = newEngine(t, "", p)
	restore()
	rp.tr = started[0]
	if err := rp.tgt.RegisterMemory(mem.Addr(rp.rem), uint64(n), "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	if err := rp.init.RegisterMemory(mem.Addr(rp.local), uint64(2*n), "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	eps := strings.Split(rp.tgt.Descriptor().Endpoints[tcp.EndpointsKey], ",")
	if len(eps) != 2 || !strings.HasPrefix(eps[0], "127.0.0.1:") || !strings.HasPrefix(eps[1], "127.0.0.2:") {
		t.Fatalf("target publishes %q, want an endpoint on 127.0.0.1 then one on 127.0.0.2", eps)
	}
	if d := rp.tgt.Descriptor(); d.Endpoints["tcp"] != eps[0] {
		t.Fatalf("primary endpoint %q is not the first of %q", d.Endpoints["tcp"], eps)
	}
	seg, err := rp.init.OpenSegment(rp.tgt.Descriptor().Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rp.init.CloseSegment(seg) })
	rp.seg = seg
	return rp
}

// run writes local[0:n) to the target in blocks, then reads it back into
// local[n:2n), and checks both copies; every task must complete. cut, if
// set, runs while the write batch is in flight and says whether it cut.
func (rp *railPair) run(t *testing.T, n, block int, cut func() bool) bool {
	t.Helper()
	for i := 0; i < n; i++ {
		rp.local[i] = byte(i*7 + i>>12)
	}
	clear(rp.local[n:])
	did := false
	for _, op := range []engine.Opcode{engine.Write, engine.Read} {
		b, err := rp.init.AllocateBatch(n / block)
		if err != nil {
			t.Fatal(err)
		}
		var reqs []engine.Request
		for off := 0; off < n; off += block {
			l := mem.Addr(rp.local) + uint64(off)
			if op == engine.Read {
				l += uint64(n)
			}
			reqs = append(reqs, engine.Request{Op: op, Local: l, Segment: rp.seg, Remote: mem.Addr(rp.rem) + uint64(off), Length: uint64(block)})
		}
		if err := b.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		if cut != nil && op == engine.Write {
			did = cut()
		}
		st, err := b.Wait(20 * time.Second)
		if err != nil || st.State != engine.Completed || st.Completed != n/block || st.Transferred != uint64(n) {
			t.Fatalf("%v batch: %+v, %v", op, st, err)
		}
		b.Free()
	}
	if !bytes.Equal(rp.rem[:n], rp.local[:n]) {
		t.Fatal("target memory differs from what was written")
	}
	if !bytes.Equal(rp.local[n:2*n], rp.local[:n]) {
		t.Fatal("data read back differs from what was written")
	}
	return did
}

// TestRailsStripeOverTwoNICs: a peer that publishes an endpoint per NIC gets
// large requests' slices over both rails (each bound to its own local
// address), and the bytes each rail reports add up to what moved.
func TestRailsStripeOverTwoNICs(t *testing.T) {
	const n, block = 16 << 20, 1 << 20
	rp := newRailPair(t, n, map[string]string{"tcp.slice": "64KiB", "tcp.conns": "2"})
	// Warmup opens every rail's connections, so the transfer dials none.
	if err := rp.init.Warmup(context.Background(), rp.tgt.Descriptor().Name); err != nil {
		t.Fatal(err)
	}
	if d := rp.init.TransportStats()["tcp"]["peer_conns_dialed"]; d != 4 {
		t.Fatalf("warmup dialed %d connections, want 2 rails x 2", d)
	}
	rp.run(t, n, block, nil)
	st := rp.init.TransportStats()["tcp"]
	if st["peer_conns_dialed"] != 4 {
		t.Fatalf("the transfer dialed %d more connections after warmup", st["peer_conns_dialed"]-4)
	}
	a, b := st["rail.127.0.0.1-127.0.0.1.bytes"], st["rail.127.0.0.2-127.0.0.2.bytes"]
	t.Logf("rail 127.0.0.1: %d bytes, rail 127.0.0.2: %d bytes", a, b)
	if a == 0 || b == 0 {
		t.Fatalf("one rail idle: %v", st)
	}
	if a+b != 2*n || st["rail_bytes"] != 2*n {
		t.Fatalf("rails moved %d+%d (rail_bytes %d), want %d", a, b, st["rail_bytes"], 2*n)
	}
	// Each rail's share is at least a quarter: the split weighs by rate.
	if min(a, b) < n/2 {
		t.Fatalf("lopsided striping: %d and %d", a, b)
	}
	if st["rail_errors"] != 0 || st["rail_retries"] != 0 {
		t.Fatalf("errors on healthy rails: %v", st)
	}
}

// TestRailsNICKilledMidTransfer: the target's second NIC dies (its listener
// closes, its connections are cut) while a large write batch is in flight.
// The slices lost with it go over the other rail: every task completes, all
// data arrives, and the rail is counted failed and cooled down.
func TestRailsNICKilledMidTransfer(t *testing.T) {
	const n, block = 32 << 20, 256 << 10
	rp := newRailPair(t, n, map[string]string{"tcp.slice": "64KiB"})
	rp.run(t, 1<<20, block, nil) // both rails warm
	cut := func() bool {
		// Cut once the second rail carries bytes of this batch, while
		// the batch is still in flight.
		st0 := rp.init.TransportStats()["tcp"]["rail.127.0.0.2-127.0.0.2.bytes"]
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			st := rp.init.TransportStats()["tcp"]
			if st["rail.127.0.0.2-127.0.0.2.bytes"] > st0 {
				return rp.tr.CutDevice("127.0.0.2") > 0
			}
			time.Sleep(50 * time.Microsecond)
		}
		return false
	}
	if !rp.run(t, n, block, cut) {
		t.Fatal("no connection cut while the batch was in flight")
	}
	st := rp.init.TransportStats()["tcp"]
	t.Logf("after the cut: %v", st)
	if st["rail.127.0.0.2-127.0.0.2.errors"] == 0 || st["rail.127.0.0.2-127.0.0.2.cooldowns"] == 0 {
		t.Fatalf("the dead rail is not counted failed: %v", st)
	}
	if st["rail.127.0.0.2-127.0.0.2.retries"] == 0 {
		t.Fatalf("no slice was sent again: %v", st)
	}
	// With the rail down the next batches go over the live one alone.
	before := st["rail.127.0.0.1-127.0.0.1.bytes"]
	rp.run(t, 4<<20, block, nil)
	// (A probe of the dead rail, once its cooldown of a second ends, takes
	// one slice at most.)
	if got := rp.init.TransportStats()["tcp"]["rail.127.0.0.1-127.0.0.1.bytes"] - before; got < 8<<20-64<<10 {
		t.Fatalf("the live rail moved %d bytes of the next %d", got, 8<<20)
	}
}

// TestRailsAllNICsGone: the target goes away (every rail's connections cut,
// every listener closed) while a batch is in flight. Slices bounce to the
// other rail and find it gone too: every task ends, none COMPLETED for
// bytes that did not arrive, the failed ones with the usual
// PeerUnreachable, and within seconds.
func TestRailsAllNICsGone(t *testing.T) {
	const n, block = 32 << 20, 256 << 10
	rp := newRailPair(t, n, map[string]string{"tcp.slice": "64KiB"})
	rp.run(t, 1<<20, block, nil)
	b, err := rp.init.AllocateBatch(n / block)
	if err != nil {
		t.Fatal(err)
	}
	var reqs []engine.Request
	for off := 0; off < n; off += block {
		reqs = append(reqs, engine.Request{Op: engine.Write, Local: mem.Addr(rp.local) + uint64(off), Segment: rp.seg, Remote: mem.Addr(rp.rem) + uint64(off), Length: block})
	}
	if err := b.Submit(reqs...); err != nil {
		t.Fatal(err)
	}
	rp.tgt.Close()
	t0 := time.Now()
	st, err := b.Wait(10 * time.Second)
	if err != nil {
		t.Fatalf("batch still pending %v after the target closed: %+v", time.Since(t0), st)
	}
	t.Logf("batch ended %v after the target closed: %d completed, %d failed", time.Since(t0), st.Completed, st.Failed)
	if st.Failed == 0 {
		t.Fatalf("every task completed: the target closed after the batch (%+v)", st)
	}
	for i := 0; i < n/block; i++ {
		ts, _ := b.TaskStatus(i)
		if ts.State == engine.Failed && !errors.Is(ts.Err, errs.ErrPeerUnreachable) {
			t.Errorf("task %d: %v, want peer unreachable", i, ts.Err)
		}
		if ts.State == engine.Completed && !bytes.Equal(rp.rem[i*block:(i+1)*block], rp.local[i*block:(i+1)*block]) {
			t.Errorf("task %d COMPLETED but its bytes are not at the target", i)
		}
	}
	b.Free()
}
