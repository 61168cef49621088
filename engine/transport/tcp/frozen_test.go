package tcp_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/mem"
)

// frozenPair starts a peer process and an engine reaching it over tcp, with
// one round trip done (connections exist), and returns a function that
// submits op of n bytes, freezes the peer (SIGSTOP) and waits for the batch.
func frozenPair(t *testing.T, cfg engine.Config) func(op engine.Opcode, n uint64) (engine.TaskStatus, time.Duration) {
	t.Helper()
	const size = 32 << 20
	p := transporttest.NewChildPeer(t, size)
	t.Cleanup(p.Close)
	buf, err := mem.Alloc(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Free(buf) })
	cfg.ListenAddr, cfg.Hostname, cfg.ForceTransport = "127.0.0.1:0", "127.0.0.1", "tcp"
	e, err := engine.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.RegisterMemory(mem.Addr(buf), size, "cpu:0", false); err != nil {
		t.Fatal(err)
	}
	seg, err := e.OpenSegment(p.Segment())
	if err != nil {
		t.Fatal(err)
	}
	run := func(op engine.Opcode, n uint64, freeze bool) (engine.TaskStatus, time.Duration) {
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		if freeze {
			if err := p.(transporttest.Pauser).Pause(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { p.(transporttest.Pauser).Resume() })
		}
		t0 := time.Now()
		if err := b.Submit(engine.Request{Op: op, Local: mem.Addr(buf), Segment: seg, Remote: p.Addr(), Length: n}); err != nil {
			t.Fatal(err)
		}
		// Far past the bound under test, yet short of the 30 s a frozen
		// peer used to hold a transfer.
		if st, err := b.Wait(20 * time.Second); err != nil {
			t.Fatalf("a transfer to a frozen peer still pending after 20s: %v %+v", err, st)
		}
		took := time.Since(t0)
		ts, err := b.TaskStatus(0)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
		return ts, took
	}
	if ts, _ := run(engine.Read, 4096, false); ts.State != engine.Completed {
		t.Fatalf("round trip before the freeze: %+v", ts)
	}
	return func(op engine.Opcode, n uint64) (engine.TaskStatus, time.Duration) { return run(op, n, true) }
}

// slack is what a loaded test machine may add to a timeout (scheduling,
// -race); the figures under test are seconds apart from what they replace.
const slack = 3 * time.Second

// TestFrozenPeerFollowsProgressTimeout: a peer that stops answering (here
// SIGSTOPped, its sockets open) fails a transfer in flight once
// TE_PROGRESS_TIMEOUT passes without a byte, with the error
// docs/troubleshooting.md quotes; not after tcp's former 30 s, nor after the
// engine's transfer timeout (30 s by default).
func TestFrozenPeerFollowsProgressTimeout(t *testing.T) {
	t.Setenv(engine.EnvProgressTimeout, "2s") // the child peer inherits it too
	for _, c := range []struct {
		op engine.Opcode
		n  uint64
	}{{engine.Read, 1 << 20}, {engine.Write, 24 << 20}} {
		// A peer per case: after a failure the engine looks the frozen
		// peer up again, which its RPC timeout bounds.
		ts, took := frozenPair(t, engine.Config{})(c.op, c.n)
		t.Logf("op %v of %d bytes: %v after %v: %v", c.op, c.n, ts.State, took, ts.Err)
		if ts.State != engine.Failed || !errors.Is(ts.Err, engine.ErrPeerUnreachable) {
			t.Fatalf("op %v: %+v, want FAILED with peer unreachable", c.op, ts)
		}
		if took < 2*time.Second-100*time.Millisecond || took > 2*time.Second+slack {
			t.Errorf("op %v failed after %v, want TE_PROGRESS_TIMEOUT (2s) plus at most %v", c.op, took, slack)
		}
		if c.op == engine.Read && !strings.Contains(ts.Err.Error(), "no answer from") {
			t.Errorf("read: %v, want the documented \"no answer from ... with requests in flight\"", ts.Err)
		}
	}
}

// TestFrozenPeerFollowsTransferTimeout: a transfer timeout shorter than the
// progress timeout ends a transfer to a frozen peer when it says, TIMEOUT,
// also for a WRITE whose payload is stuck in the socket.
func TestFrozenPeerFollowsTransferTimeout(t *testing.T) {
	cfg := engine.Config{TransferTimeout: time.Second, Limits: engine.Limits{ProgressTimeout: 15 * time.Second}}
	for _, c := range []struct {
		op engine.Opcode
		n  uint64
	}{{engine.Read, 1 << 20}, {engine.Write, 24 << 20}} {
		ts, took := frozenPair(t, cfg)(c.op, c.n)
		t.Logf("op %v of %d bytes: %v after %v: %v", c.op, c.n, ts.State, took, ts.Err)
		if ts.State != engine.Timeout {
			t.Fatalf("op %v: %+v, want TIMEOUT", c.op, ts)
		}
		if took > time.Second+slack {
			t.Errorf("op %v timed out after %v, want TE_TRANSFER_TIMEOUT (1s) plus at most %v", c.op, took, slack)
		}
	}
}
