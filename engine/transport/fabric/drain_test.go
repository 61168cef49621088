package fabric_test

import (
	"context"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport/fabric"
	"github.com/tecache/te/engine/transport/transporttest"
	"github.com/tecache/te/internal/sys/mem"
)

// TestSHMCloseWaitsForPeer: over shm, closing an endpoint does not stop
// the peer from working through the commands already in its queue (it
// copies into the sender's memory whatever became of the endpoint), and
// libfabric 1.17's peer crashes (a null region in fi_cq_read) when the
// first of them, the connection request, names an endpoint closed
// meanwhile. So a used endpoint is closed only after a probe behind its
// commands completed. The peer is stopped while commands wait for it:
//   - a posted READ is canceled: its endpoint is not closed, nor the task
//     ended, while the peer sleeps; resumed, the peer takes it and the
//     probe, and then the task ends;
//   - an engine whose first READ waits on the connection request closes:
//     the peer, resumed within the close's drain, lives on.
func TestSHMCloseWaitsForPeer(t *testing.T) {
	p := requireProvider(t, "shm")
	t.Setenv("TE_PARAM_fabric_provider", "shm")
	peer := transporttest.NewChildPeer(t, 1<<20)
	defer peer.Close()
	pause, ok := peer.(interface {
		Pause() error
		Resume() error
	})
	if !ok {
		t.Fatal("the child peer cannot be paused")
	}
	newEngine := func() (*engine.Engine, *engine.Segment, *engine.Batch, uint64) {
		e, err := engine.New(engine.Config{ListenAddr: "127.0.0.1:0", Hostname: "127.0.0.1", Params: p, ForceTransport: fabric.Name})
		if err != nil {
			t.Fatal(err)
		}
		buf := mem.MustAlloc(1 << 16)
		t.Cleanup(func() { mem.Free(buf) })
		if err := e.RegisterMemory(mem.Addr(buf), 1<<16, "cpu:0", false); err != nil {
			t.Fatal(err)
		}
		seg, err := e.OpenSegment(peer.Segment())
		if err != nil {
			t.Fatal(err)
		}
		b, err := e.AllocateBatch(1)
		if err != nil {
			t.Fatal(err)
		}
		return e, seg, b, mem.Addr(buf)
	}
	read := func(b *engine.Batch, seg *engine.Segment, local uint64) {
		t.Helper()
		if err := b.Reset(); err != nil {
			t.Fatal(err)
		}
		if err := b.Submit(engine.Request{Op: engine.Read, Local: local, Segment: seg, Remote: peer.Addr(), Length: 4096}); err != nil {
			t.Fatal(err)
		}
	}
	alive := func(when string) {
		t.Helper()
		if _, err := peer.CRC(0, 4096); err != nil {
			t.Fatalf("peer %s: %v", when, err)
		}
	}

	a, seg, b, local := newEngine()
	defer a.Close()
	stats := func() map[string]uint64 { return a.TransportStats()[fabric.Name] }
	read(b, seg, local)
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("first READ: %v %v %v", st.State, st.Err, err)
	}
	if err := pause.Pause(); err != nil {
		t.Fatal(err)
	}
	read(b, seg, local)
	time.Sleep(20 * time.Millisecond)
	if err := b.Cancel(); err != nil {
		t.Fatal(err)
	}
	// Well past the cancel grace (50 ms).
	time.Sleep(300 * time.Millisecond)
	if n := stats()["drains"]; n != 1 {
		t.Errorf("%d drains started, want 1 (%v)", n, stats())
	}
	if st := b.Status(); st.State != engine.Pending {
		t.Errorf("canceled READ ended (%v) while the peer, which may still serve it, sleeps", st.State)
	}
	if err := pause.Resume(); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(10 * time.Second)
	if err != nil {
		t.Fatalf("canceled READ did not end after the peer resumed: %v", err)
	}
	if st.State != engine.Canceled && st.State != engine.Completed {
		t.Errorf("canceled READ ended %v: %v", st.State, st.Err)
	}
	// The READ may have completed before the probe: the close follows.
	for end := time.Now().Add(5 * time.Second); stats()["teardowns"] == 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if s := stats(); s["drain_timeouts"] != 0 || s["teardowns"] != 1 {
		t.Errorf("drain timeouts %d, teardowns %d; want 0 and 1", s["drain_timeouts"], s["teardowns"])
	}
	alive("after a drained close")

	// A new engine: its endpoint is exchanged (Warmup) but has sent
	// nothing; the first READ sends the connection request, which waits.
	a2, seg2, b2, local2 := newEngine()
	if err := a2.Warmup(context.Background(), peer.Segment()); err != nil {
		t.Fatal(err)
	}
	if err := pause.Pause(); err != nil {
		t.Fatal(err)
	}
	read(b2, seg2, local2)
	time.Sleep(50 * time.Millisecond)
	closed := make(chan struct{})
	go func() {
		b2.Free()
		a2.Close()
		close(closed)
	}()
	time.Sleep(50 * time.Millisecond)
	if err := pause.Resume(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	alive("after an engine closed with its connection request queued")

	// And the first engine goes on.
	read(b, seg, local)
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("READ after the drained close: %v %v %v", st.State, st.Err, err)
	}

	// A peer that stays stopped past the drain bound (2 s) is taken for
	// gone: the canceled READ ends then, counted in drain_timeouts.
	if err := pause.Pause(); err != nil {
		t.Fatal(err)
	}
	read(b, seg, local)
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	if err := b.Cancel(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if st := b.Status(); st.State != engine.Pending {
		t.Errorf("canceled READ ended (%v) 1 s into the drain bound", st.State)
	}
	st, err = b.Wait(10 * time.Second)
	waited := time.Since(start)
	if err != nil || st.State != engine.Canceled {
		t.Fatalf("canceled READ past the drain bound: %v %v %v", st.State, st.Err, err)
	}
	if s := stats(); s["drain_timeouts"] != 1 || waited < 2*time.Second {
		t.Errorf("drain timeouts %d after %v, want 1 after the 2 s bound", s["drain_timeouts"], waited)
	}
	if err := pause.Resume(); err != nil {
		t.Fatal(err)
	}
	alive("after a drain timed out")

	// An engine closing while its peer stays stopped waits 1 s for the
	// drain, then closes anyway and counts it. (A READ first, so that the
	// endpoint is exchanged and connected before the peer stops.)
	read(b, seg, local)
	if st, err := b.Wait(10 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("READ after the timed-out drain: %v %v %v", st.State, st.Err, err)
	}
	if err := pause.Pause(); err != nil {
		t.Fatal(err)
	}
	read(b, seg, local)
	time.Sleep(20 * time.Millisecond)
	start = time.Now()
	b.Free()
	a.Close()
	waited = time.Since(start)
	if err := pause.Resume(); err != nil {
		t.Fatal(err)
	}
	if n := stats()["drain_timeouts"]; n != 2 || waited < time.Second || waited > 5*time.Second {
		t.Errorf("engine close with the peer stopped took %v, drain timeouts %d; want about 1 s and 2", waited, n)
	}
	alive("after an engine closed with its peer stopped")
}
