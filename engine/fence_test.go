package engine_test

import (
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/internal/errs"
)

// TestZeroAllocSubmitWait: a reused batch moves 128 requests through the local
// transport without allocating (slots are the batch's, completion is an
// index, statistics are flushed per batch).
func TestZeroAllocSubmitWait(t *testing.T) {
	a, _, s, la, rb := pair(t)
	const n, bs = 128, 4096
	reqs := make([]engine.Request, n)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: la + uint64(i*bs), Segment: s, Remote: rb + uint64(i*bs), Length: bs, Transport: "local"}
	}
	b, err := a.AllocateBatch(n)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	cycle := func() {
		if err := b.Submit(reqs...); err != nil {
			t.Fatal(err)
		}
		if st, err := b.Wait(time.Second); err != nil || st.State != engine.Completed || st.Completed != n {
			t.Fatal(st, err)
		}
		if err := b.Reset(); err != nil {
			t.Fatal(err)
		}
	}
	cycle() // warm: the reaper's queue grows once
	if allocs := testing.AllocsPerRun(200, cycle); allocs != 0 {
		t.Fatalf("%v allocations per Submit+Wait of %d requests, want 0", allocs, n)
	}
	if got := a.Stats().TasksCompleted; got < 201*n {
		t.Fatalf("stats counted %d tasks, want at least %d", got, 201*n)
	}
}

// TestTimeoutWaitsForTransport: a task whose transport cannot let go of it
// stays PENDING past its timeout (its memory may still be touched) and the
// batch cannot be freed; it ends TIMEOUT once the transport completes it.
func TestTimeoutWaitsForTransport(t *testing.T) {
	a, _, s, la, rb := pair(t, func(c *engine.Config) { c.TransferTimeout = 50 * time.Millisecond })
	h := holdOf(a)
	h.mu.Lock()
	h.stuck = true
	h.mu.Unlock()
	b, _ := a.AllocateBatch(1)
	if err := b.Submit(engine.Request{Op: engine.Read, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"}); err != nil {
		t.Fatal(err)
	}
	<-h.arrived
	if _, err := b.Wait(300 * time.Millisecond); errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("wait: %v, want the wait itself to time out", err)
	}
	if ts, _ := b.TaskStatus(0); ts.State != engine.Pending {
		t.Fatalf("task %v while its transport still holds it", ts.State)
	}
	code(t, "free while the transport holds a task", b.Free(), errs.BatchBusy)
	h.release(errs.New(errs.Canceled, "hold", "finally let go"))
	st, err := b.Wait(time.Second)
	if err != nil || st.State != engine.Timeout {
		t.Fatalf("%+v %v", st, err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}

// TestBatchCancelAndReset: Cancel ends pending tasks CANCELED once the
// transport confirms; Reset then reuses the batch.
func TestBatchCancelAndReset(t *testing.T) {
	a, _, s, la, rb := pair(t)
	h := holdOf(a)
	b, _ := a.AllocateBatch(4)
	defer b.Free()
	req := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"}
	if err := b.Submit(req, req, req); err != nil {
		t.Fatal(err)
	}
	code(t, "reset while pending", b.Reset(), errs.BatchBusy)
	if err := b.Cancel(); err != nil {
		t.Fatal(err)
	}
	st, err := b.Wait(time.Second)
	if err != nil || st.State != engine.Canceled || st.Failed != 3 || errs.CodeOf(st.Err) != errs.Canceled {
		t.Fatalf("%+v %v", st, err)
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if st := b.Status(); st.State != engine.Waiting || st.Tasks != 0 {
		t.Fatalf("after reset %+v", st)
	}
	req.Transport = "local"
	if err := b.Submit(req, req, req, req); err != nil {
		t.Fatal(err)
	}
	if st, err := b.Wait(time.Second); err != nil || st.State != engine.Completed || st.Completed != 4 {
		t.Fatalf("%+v %v", st, err)
	}
	if h.release(nil) != 0 {
		t.Fatal("the hold transport still held canceled requests")
	}
}

// TestNotifyBeforeCompleted: a batch's notify is delivered before the batch
// reports COMPLETED, so an engine closed right after Wait lost nothing.
func TestNotifyBeforeCompleted(t *testing.T) {
	a, b, s, la, rb := pair(t)
	for i := 0; i < 20; i++ {
		batch, _ := a.AllocateBatch(1)
		req := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 4096, Transport: "local"}
		if err := batch.SubmitWithNotify(b.Name(), "prefill", "kv ready", req); err != nil {
			t.Fatal(err)
		}
		st, err := batch.Wait(5 * time.Second)
		if err != nil || st.State != engine.Completed {
			t.Fatalf("%+v %v", st, err)
		}
		batch.Free()
		// No polling: it is there already.
		if got := b.Notifies(); len(got) != 1 || got[0].Msg != "kv ready" {
			t.Fatalf("round %d: notifications at the receiver when the batch completed: %v", i, got)
		}
	}
	a.Close()
}

// TestNotifyFailureFailsBatch: when the batch's notify cannot be delivered
// the batch does not report COMPLETED: the receiver was not told.
func TestNotifyFailureFailsBatch(t *testing.T) {
	a, b, s, la, rb := pair(t, func(c *engine.Config) { c.MaxNotifies = 1 })
	if err := a.SendNotify(b.Name(), "x", "fills the queue"); err != nil {
		t.Fatal(err)
	}
	batch, _ := a.AllocateBatch(1)
	defer batch.Free()
	req := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 4096, Transport: "local"}
	if err := batch.SubmitWithNotify(b.Name(), "prefill", "kv ready", req); err != nil {
		t.Fatal(err)
	}
	st, err := batch.Wait(5 * time.Second)
	if err != nil || st.State != engine.Failed || st.Completed != 1 || st.Err == nil {
		t.Fatalf("%+v %v", st, err)
	}
	if ts, _ := batch.TaskStatus(0); ts.State != engine.Completed {
		t.Fatalf("task %v: its bytes did arrive", ts.State)
	}
}

// TestUnregisterCancelsOwnTasksAfterGrace: unregistering local memory that
// this engine's tasks still use lets them run for the grace period, then
// cancels them; it returns once the transport let go.
func TestUnregisterCancelsOwnTasksAfterGrace(t *testing.T) {
	a, _, s, la, rb := pair(t, func(c *engine.Config) { c.UnregisterGrace = 50 * time.Millisecond })
	h := holdOf(a)
	b, _ := a.AllocateBatch(2)
	defer b.Free()
	req := engine.Request{Op: engine.Read, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"}
	if err := b.Submit(req, req); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := a.UnregisterMemory(la); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d < 50*time.Millisecond {
		t.Fatalf("unregister returned after %v, before the grace", d)
	}
	st, err := b.Wait(0)
	if err != nil || st.State != engine.Canceled || st.Failed != 2 {
		t.Fatalf("%+v %v", st, err)
	}
	if h.release(nil) != 0 {
		t.Fatal("held requests survived the unregister")
	}
}

// TestUnregisterStuckTransportRetries: when a transport cannot let go of the
// range, UnregisterMemory fails and the range stays registered (refusing new
// accesses, unpublished); once the transport lets go, a retry succeeds.
func TestUnregisterStuckTransportRetries(t *testing.T) {
	a, _, s, la, rb := pair(t, func(c *engine.Config) {
		c.UnregisterGrace = 20 * time.Millisecond
		c.RPCTimeout = 200 * time.Millisecond
	})
	h := holdOf(a)
	h.mu.Lock()
	h.stuck = true
	h.mu.Unlock()
	b, _ := a.AllocateBatch(2)
	req := engine.Request{Op: engine.Read, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"}
	if err := b.Submit(req); err != nil {
		t.Fatal(err)
	}
	err := a.UnregisterMemory(la)
	code(t, "unregister while a transport holds the range", err, errs.Timeout)
	code(t, "new access to a closing range", b.Submit(req), errs.AddressNotRegistered)
	code(t, "register over a closing range", a.RegisterMemory(la, 1<<20, "cpu", true), errs.AddressOverlapped)
	h.release(nil)
	if err := a.UnregisterMemory(la); err != nil {
		t.Fatalf("retry: %v", err)
	}
	code(t, "unregister twice", a.UnregisterMemory(la), errs.AddressNotRegistered)
	if err := a.RegisterMemory(la, 1<<20, "cpu", true); err != nil {
		t.Fatal(err)
	}
	b.Free()
}

// TestCloseRacesCompletions closes an engine while goroutines submit and
// complete through it: every batch ends, nothing races (run with -race).
func TestCloseRacesCompletions(t *testing.T) {
	for round := 0; round < 20; round++ {
		a, b, s, la, rb := pair(t)
		done := make(chan struct{})
		for g := 0; g < 4; g++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for {
					batch, err := a.AllocateBatch(8)
					if err != nil {
						return
					}
					var reqs []engine.Request
					for i := 0; i < 8; i++ {
						reqs = append(reqs, engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 512, Transport: "local"})
					}
					if err := batch.SubmitWithNotify(b.Name(), "n", "m", reqs...); err != nil {
						return
					}
					if st, _ := batch.Wait(5 * time.Second); st.State == engine.Pending {
						t.Error("batch pending after wait")
						return
					}
					batch.Free()
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		a.Close()
		for g := 0; g < 4; g++ {
			<-done
		}
		b.Notifies()
	}
}
