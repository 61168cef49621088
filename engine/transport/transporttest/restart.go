package transporttest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Restarts says how RunRestarts restarts the peer.
type Restarts struct {
	// N is how many times the peer restarts; Every how often (in restarts)
	// the survivor's resources are checked against the live set.
	N, Every int
	// Probes are more gauges of this process checked as the survivor's
	// (the fake verbs library's live objects, say), by name.
	Probes map[string]func() int
}

// Allowances over the live set: what a live peer may cost beyond the one the
// baseline saw (another striped connection dialled, a pool goroutine of the
// control plane that has not timed out yet), never a cost per restart.
const (
	allowGauge      = 2
	allowGoroutines = 24
	allowFDs        = 12
	restartSettle   = 10 * time.Second // for the peer's sockets to be seen closed
)

// usage is what this process holds: the survivor's gauges, goroutines,
// descriptors, and the probes.
type usage map[string]int

func (s Setup) usage(e *engine.Engine, r Restarts) usage {
	st := e.Stats()
	u := usage{
		"control.peers":           st.Control.Peers,
		"control.peer_conns_open": st.Control.PeerConnsOpen,
		"control.conns_open":      st.Control.ConnsOpen,
		"goroutines":              runtime.NumGoroutine(),
		"fds":                     openFDs(),
	}
	for n, l := range st.Live {
		u[n+".peers"] = l.Peers
		u[n+".conns_dialed"] = l.ConnsDialed
		u[n+".conns_accepted"] = l.ConnsAccepted
		u[n+".endpoints"] = l.Endpoints
		u[n+".queue_pairs"] = l.QueuePairs
	}
	for n, f := range r.Probes {
		u[n] = f()
	}
	return u
}

// over returns the entries of u above the live set base by more than their
// allowance.
func (u usage) over(base usage) []string {
	var out []string
	for k, v := range u {
		allow := allowGauge
		switch k {
		case "goroutines":
			allow = allowGoroutines
		case "fds":
			allow = allowFDs
		}
		if v > base[k]+allow {
			out = append(out, fmt.Sprintf("%s %d (live set %d, allowance %d)", k, v, base[k], allow))
		}
	}
	return out
}

// openFDs counts this process's open file descriptors.
func openFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// RunRestarts restarts a peer engine r.N times under one segment name (its
// RPC address) while an engine of this process, the survivor, keeps
// transferring to it: after each restart the survivor writes a block to the
// new incarnation and reads another back, byte for byte, over s.Transport.
// Every r.Every restarts the survivor's resources (its Stats.Live gauges,
// its control plane's connections, the process's goroutines and open file
// descriptors, r.Probes) must come back to the live set measured with the
// first incarnations, within a small fixed allowance: whatever a restarted
// peer cost and did not give back fails the test.
//
// The peer runs in this process, each incarnation a new engine: closing it
// drops its listeners, connections and queue pairs as a process exit would,
// and a restart costs milliseconds rather than a process start, so hundreds
// fit in a test. Goroutines and descriptors counted are the process's, so a
// peer engine's own leak across Close fails the test too.
func RunRestarts(t *testing.T, s Setup, r Restarts) {
	const block = 64 << 10
	if r.Every <= 0 {
		r.Every = 1
	}
	quiet := func(c *engine.Config) {
		if c.Logger == nil {
			c.Logger = slog.New(slog.DiscardHandler) // a line per restart otherwise
		}
	}
	cfg := s.config()
	quiet(&cfg)
	cfg.ForceTransport = s.Transport
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	local, err := mem.Alloc(2 * block)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(local)
	if err := e.RegisterMemory(mem.Addr(local), 2*block, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	// The peer's buffer outlives its incarnations: each registers it again.
	remote, err := mem.Alloc(2 * block)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(remote)

	var peer *engine.Engine
	defer func() {
		if peer != nil {
			peer.Close()
		}
	}()
	addr := "127.0.0.1:0"
	start := func() {
		t.Helper()
		pc := s.config()
		quiet(&pc)
		pc.ListenAddr = addr
		var err error
		// The port the last incarnation closed is free again at once
		// (SO_REUSEADDR); a few tries cover a slow release.
		for try := 0; try < 50; try++ {
			if peer, err = engine.New(pc); err == nil || !errors.Is(err, syscall.EADDRINUSE) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("peer incarnation on %s: %v", addr, err)
		}
		addr = peer.RPCAddr()
		if err := peer.RegisterMemory(mem.Addr(remote), 2*block, "cpu:0", true); err != nil {
			t.Fatal(err)
		}
	}
	start()
	idle := s.usage(e, r) // both engines up, not connected
	seg, err := e.OpenSegment(peer.Name())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { e.CloseSegment(seg) }()
	name := peer.Name()

	// run runs req in a batch of its own. The first request after a
	// restart may fail, as it may on a deployment: it went to the dead
	// incarnation (its data endpoint refused the connection, or the new
	// one refused the old descriptor's keys), and marked the descriptor
	// stale; the retry goes to the new incarnation and must complete.
	retried := 0
	run := func(i int, req engine.Request) {
		t.Helper()
		for try := 0; ; try++ {
			b, err := e.AllocateBatch(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Submit(req); err != nil {
				t.Fatalf("restart %d: submit: %v", i, err)
			}
			st, err := b.Wait(30 * time.Second)
			ts, _ := b.TaskStatus(0)
			if ferr := b.Free(); ferr != nil {
				t.Fatal(ferr)
			}
			if err == nil && st.State == engine.Completed {
				return
			}
			switch errs.CodeOf(ts.Err) {
			case errs.PeerUnreachable, errs.StaleDescriptor, errs.AddressNotRegistered:
				if try == 0 {
					retried++
					continue
				}
			}
			t.Fatalf("restart %d: %v to the new incarnation (try %d): %+v %v (task %+v)", i, req.Op, try+1, st, err, ts)
		}
	}
	// transfer writes the first half of local to the peer's first half and
	// reads the peer's second half into local's second half.
	transfer := func(i int) {
		t.Helper()
		fillRandom(local[:block], int64(2*i))
		fillRandom(remote[block:], int64(2*i+1))
		run(i, engine.Request{Op: engine.Write, Local: mem.Addr(local), Segment: seg, Remote: mem.Addr(remote), Length: block})
		if !bytes.Equal(remote[:block], local[:block]) {
			t.Fatalf("restart %d: the peer's bytes differ from those written", i)
		}
		run(i, engine.Request{Op: engine.Read, Local: mem.Addr(local) + block, Segment: seg, Remote: mem.Addr(remote) + block,
			Length: block})
		if !bytes.Equal(local[block:], remote[block:]) {
			t.Fatalf("restart %d: the bytes read differ from the peer's", i)
		}
	}
	// restart closes the peer and starts its next incarnation. The
	// survivor learns of it in one of two ways, in turn: by a request that
	// fails on the old incarnation (it keeps its handle), or by a fresh
	// look-up that never touches what it held for the old one (it closes
	// its handle and opens the segment again, as a caller that opens a
	// segment per request does, or as a store's watch makes it).
	restart := func(i int) {
		t.Helper()
		if err := peer.Close(); err != nil {
			t.Fatal(err)
		}
		peer = nil
		start()
		if peer.Name() != name {
			t.Fatalf("the peer came back as %q, not %q", peer.Name(), name)
		}
		if i%2 == 0 {
			if err := e.CloseSegment(seg); err != nil {
				t.Fatal(err)
			}
			if seg, err = e.OpenSegment(name); err != nil {
				t.Fatalf("restart %d: open: %v", i, err)
			}
		}
	}

	// The live set: the most each resource took over the first few
	// incarnations (one live peer, whichever striped connections and pool
	// goroutines those transfers happened to use).
	transfer(0)
	base := s.usage(e, r)
	const warm = 5
	for i := 1; i <= warm; i++ {
		restart(i)
		transfer(i)
		for k, v := range s.usage(e, r) {
			base[k] = max(base[k], v)
		}
	}
	t.Logf("live set with one peer: %v", base)
	cost := usage{}
	for k, v := range base {
		cost[k] = v - idle[k]
	}
	t.Logf("one connected peer costs (both engines are in this process: goroutines and descriptors count both ends): %v", cost)
	began := time.Now()
	var last usage
	for i := warm + 1; i <= warm+r.N; i++ {
		restart(i)
		transfer(i)
		if (i-warm)%r.Every != 0 && i != warm+r.N {
			continue
		}
		// The old incarnation's sockets close as the engine closes; the
		// survivor sees them go within moments.
		deadline := time.Now().Add(restartSettle)
		for {
			last = s.usage(e, r)
			bad := last.over(base)
			if len(bad) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after %d restarts the survivor holds more than with one live peer: %v\nnow: %v", i-warm, bad, last)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	t.Logf("%d restarts in %v (%d first requests to a new incarnation failed and were retried); after them: %v",
		r.N, time.Since(began).Round(time.Millisecond), retried, last)
}

// PeerCost measures what one live peer costs an engine of this process: the
// peer is a child process (NewChildPeer), so the goroutines and descriptors
// counted are this engine's alone. The engine writes a 64 KiB block to the
// peer and reads it back over s.Transport; the difference in its
// resources from before it opened the segment is returned (and logged).
// The descriptors it gained must be the connections its gauges report
// (data and control), and everything must return once the peer exits.
func PeerCost(t *testing.T, s Setup) map[string]int {
	const block = 64 << 10
	cfg := s.config()
	cfg.ForceTransport = s.Transport
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	local, err := mem.Alloc(block)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Free(local)
	if err := e.RegisterMemory(mem.Addr(local), block, "cpu:0", true); err != nil {
		t.Fatal(err)
	}
	r := Restarts{}
	before := s.usage(e, r) // no peer: what must be left once it exits
	p := NewChildPeer(t, block)
	defer p.Close()
	idle := s.usage(e, r) // the peer's process and pipes, not connected
	seg, err := e.OpenSegment(p.Segment())
	if err != nil {
		t.Fatal(err)
	}
	fillRandom(local, 7)
	for _, op := range []engine.Opcode{engine.Write, engine.Read} {
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Submit(engine.Request{Op: op, Local: mem.Addr(local), Segment: seg, Remote: p.Addr(), Length: block}); err != nil {
			t.Fatal(err)
		}
		st, err := b.Wait(30 * time.Second)
		b.Free()
		if err != nil || st.State != engine.Completed {
			t.Fatalf("%v: %+v %v", op, st, err)
		}
	}
	if c, err := p.CRC(0, block); err != nil || c != crc32.ChecksumIEEE(local) {
		t.Fatalf("the peer's bytes: CRC %08x %v, want %08x", c, err, crc32.ChecksumIEEE(local))
	}
	live := s.usage(e, r)
	cost := map[string]int{}
	for k, v := range live {
		cost[k] = v - idle[k]
	}
	t.Logf("one live peer costs this engine: %v", cost)
	conns := cost["control.peer_conns_open"] + cost[s.Transport+".conns_dialed"]
	if cost["fds"] != conns {
		t.Errorf("the engine holds %d more descriptors with the peer, and %d connections to it", cost["fds"], conns)
	}
	e.CloseSegment(seg)
	p.Close()
	deadline := time.Now().Add(restartSettle)
	for {
		now := s.usage(e, r)
		// Everything but goroutines (the control plane's call pool
		// shrinks on its own time) exactly as before the peer.
		back := now["goroutines"] <= before["goroutines"]+allowGoroutines
		for k, v := range now {
			back = back && (k == "goroutines" || v == before[k])
		}
		if back {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the peer exited, the engine still holds: %v (before the peer: %v)", now, before)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cost
}
