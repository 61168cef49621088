package engine_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// warmPair returns an initiator and a target over tcp with conns striped
// connections each, 1 MiB registered on both, and the target opened.
func warmPair(t testing.TB, conns string, mods ...func(*engine.Config)) (a, b *engine.Engine, s *engine.Segment, src, dst uint64) {
	t.Helper()
	mod := func(c *engine.Config) {
		c.Transports = []string{"tcp"}
		c.Params = map[string]string{"tcp.conns": conns}
	}
	return pair(t, append([]func(*engine.Config){mod}, mods...)...)
}

func dialed(e *engine.Engine) uint64 { return e.TransportStats()["tcp"]["peer_conns_dialed"] }

// write4k writes 4 KiB with batch b and returns how long it took.
func write4k(t testing.TB, b *engine.Batch, s *engine.Segment, src, dst uint64) time.Duration {
	t.Helper()
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := b.Submit(engine.Request{Op: engine.Write, Local: src, Segment: s, Remote: dst, Length: 4096}); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(10 * time.Second)
	took := time.Since(start)
	if err != nil || st.State != engine.Completed {
		t.Fatalf("write: %v %v", st.State, err)
	}
	return took
}

// Warmup dials every striped connection and completes its handshake, so
// that the transfers after it dial nothing.
func TestWarmupOpensConnections(t *testing.T) {
	a, b, s, src, dst := warmPair(t, "4")
	if n := dialed(a); n != 0 {
		t.Fatalf("dialed %d before warmup", n)
	}
	if err := a.Warmup(context.Background(), b.Name()); err != nil {
		t.Fatal(err)
	}
	if n := dialed(a); n != 4 {
		t.Fatalf("warmup dialed %d connections, want the 4 of tcp.conns", n)
	}
	// The target accepted (and authenticated) all four before Warmup
	// returned: the client side's handshake needs the server's answer.
	if n := b.TransportStats()["tcp"]["conns_open"]; n != 4 {
		t.Fatalf("target has %d connections open, want 4", n)
	}
	// Again: nothing new.
	if err := a.Warmup(context.Background(), b.Name()); err != nil {
		t.Fatal(err)
	}
	batch, err := a.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Free()
	// Enough transfers to land on every stripe.
	for range 8 {
		write4k(t, batch, s, src, dst)
	}
	if n := dialed(a); n != 4 {
		t.Fatalf("transfers after warmup dialed %d more connections", n-4)
	}
	// Warming its own segment is a no-op.
	if err := a.Warmup(context.Background(), a.Name()); err != nil {
		t.Fatal(err)
	}
}

func TestWarmupErrors(t *testing.T) {
	a, b, _, _, _ := warmPair(t, "2")
	ctx := context.Background()
	code(t, "empty name", a.Warmup(ctx, ""), errs.InvalidArgument)
	code(t, "not host:port", a.Warmup(ctx, "no-port"), errs.InvalidArgument)
	start := time.Now()
	err := a.Warmup(ctx, "127.0.0.1:1")
	code(t, "nobody there", err, errs.SegmentNotFound)
	t.Logf("unknown segment: %v (after %v)", err, time.Since(start))
	// A context already ended: a clear error, no hang, nothing left behind.
	done, cancel := context.WithCancel(ctx)
	cancel()
	if err := a.Warmup(done, b.Name()); err == nil {
		// The connections may have come up at once on loopback;
		// only an error is checked for its code.
		t.Log("warmup finished before the canceled context was seen")
	} else {
		code(t, "canceled", err, errs.Canceled)
	}
	// The peer gone: refused with a code, within the RPC timeout.
	name := b.Name()
	b.Close()
	start = time.Now()
	err = a.Warmup(ctx, name)
	if err == nil {
		t.Fatal("warmup of a closed peer succeeded")
	}
	if c := errs.CodeOf(err); c != errs.SegmentNotFound && c != errs.PeerUnreachable {
		t.Fatalf("closed peer: %v (%v)", c, err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("closed peer took %v", d)
	}
	a.Close()
	code(t, "closed engine", a.Warmup(ctx, name), errs.Closed)
}

// BenchmarkWarmupFirstTransfer measures what Warmup buys: per iteration a
// fresh pair of engines over tcp (tcp.conns=4), Warmup or not, an idle
// spell (20 ms, or none), then one 4 KiB WRITE (first-us), the median of
// the 100 after it (median-us), their ratio, and one more write after 20
// ms idle (idle-us: what sleeping threads alone cost, apart from anything
// cold). reference=tcp is the physical reference for the same pattern: a
// raw loopback TCP round trip of 4 KiB and a 16-byte answer, on a
// connection that has carried one before, in the same run.
func BenchmarkWarmupFirstTransfer(b *testing.B) {
	const idle = 20 * time.Millisecond
	secret := func(c *engine.Config) { c.AuthSecret = "warmup-test-secret-0123456789abcdef" }
	none := func(*engine.Config) {}
	report := func(b *testing.B, first, med, again time.Duration, ratio float64) {
		n := float64(b.N)
		b.ReportMetric(float64(first.Microseconds())/n, "first-us")
		b.ReportMetric(float64(med.Microseconds())/n, "median-us")
		b.ReportMetric(ratio/n, "first/median")
		b.ReportMetric(float64(again.Microseconds())/n, "idle-us")
	}
	for _, pause := range []time.Duration{idle, 0} {
		b.Run(fmt.Sprintf("reference=tcp/idle=%v", pause), func(b *testing.B) {
			var first, med, again time.Duration
			var ratio float64
			for b.Loop() {
				rt := rawRoundTrip(b)
				rt() // the connection carried a round trip, as Warmup's
				time.Sleep(pause)
				f, next := rt(), make([]time.Duration, 100)
				for i := range next {
					next[i] = rt()
				}
				time.Sleep(idle)
				again += rt()
				slices.Sort(next)
				first += f
				med += next[len(next)/2]
				ratio += float64(f) / float64(next[len(next)/2])
			}
			report(b, first, med, again, ratio)
		})
	}
	for _, run := range []struct {
		warm, secret bool
		pause        time.Duration
	}{{false, false, idle}, {true, false, idle}, {false, true, idle}, {true, true, idle}, {true, false, 0}, {true, true, 0}} {
		mod := none
		if run.secret {
			mod = secret
		}
		b.Run(fmt.Sprintf("warmup=%v/secret=%v/idle=%v", run.warm, run.secret, run.pause), func(b *testing.B) {
			var first, med, again time.Duration
			var ratio float64
			for b.Loop() {
				a, peer, s, src, dst := warmPair(b, "4", mod)
				// Both ends' pages touched, as a KV cache in use is: the
				// figure is the transfer's, not a page fault's.
				clear(mem.Bytes(src, 4096))
				clear(mem.Bytes(dst, 4096))
				batch, err := a.AllocateBatch(1)
				if err != nil {
					b.Fatal(err)
				}
				if run.warm {
					if err := a.Warmup(context.Background(), peer.Name()); err != nil {
						b.Fatal(err)
					}
				}
				time.Sleep(run.pause)
				f := write4k(b, batch, s, src, dst)
				next := make([]time.Duration, 100)
				for i := range next {
					next[i] = write4k(b, batch, s, src, dst)
				}
				time.Sleep(idle)
				again += write4k(b, batch, s, src, dst)
				batch.Free()
				slices.Sort(next)
				first += f
				med += next[len(next)/2]
				ratio += float64(f) / float64(next[len(next)/2])
			}
			report(b, first, med, again, ratio)
		})
	}
}

// rawRoundTrip returns a function that sends 4 KiB over a loopback TCP
// connection to an echo of 16 bytes and returns how long the answer took.
func rawRoundTrip(b *testing.B) func() time.Duration {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf[:16]); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	buf := make([]byte, 4096)
	return func() time.Duration {
		start := time.Now()
		if _, err := c.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf[:16]); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
}
