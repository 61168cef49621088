package engine_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tecache/te/engine"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// TestTaskStatusRacesResetAndFree reads task statuses from several
// goroutines while the batches they read are reset, resubmitted, freed and
// replaced (their slots going back to the pool and out to the next batch).
// TaskStatus is documented safe for concurrent use (the C ABI's
// te_task_status calls it from any thread): it must never panic, and a freed
// batch has no tasks, never another batch's.
func TestTaskStatusRacesResetAndFree(t *testing.T) {
	a, _, s, la, rb := pair(t)
	const per = 8
	reqs := make([]engine.Request, per)
	for i := range reqs {
		reqs[i] = engine.Request{Op: engine.Write, Local: la + uint64(i*64), Segment: s, Remote: rb + uint64(i*64), Length: 64, Transport: "local"}
	}
	var cur atomic.Pointer[engine.Batch]
	var panics, freedSeen, bad atomic.Int64
	var firstBad atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 3; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				b := cur.Load()
				if b == nil {
					continue
				}
				func() {
					defer func() {
						if r := recover(); r != nil {
							if panics.Add(1) == 1 {
								firstBad.Store(fmt.Sprint("panic: ", r))
							}
						}
					}()
					ts, err := b.TaskStatus(k % per)
					switch {
					case err != nil:
						if ts.State != engine.Invalid || errs.CodeOf(err) != errs.InvalidArgument {
							bad.Add(1)
							firstBad.Store(fmt.Sprintf("error %v with state %v", err, ts.State))
						}
						freedSeen.Add(1)
					case ts.State == engine.Invalid, ts.State == engine.Waiting:
						bad.Add(1)
						firstBad.Store(fmt.Sprintf("state %v without an error", ts.State))
					case ts.Transport != "local":
						bad.Add(1)
						firstBad.Store(fmt.Sprintf("task of transport %q", ts.Transport))
					}
				}()
			}
		}()
	}
	deadline := time.Now().Add(time.Second)
	cycles := 0
	for time.Now().Before(deadline) {
		b, err := a.AllocateBatch(per)
		if err != nil {
			t.Fatal(err)
		}
		cur.Store(b)
		for r := 0; r < 3; r++ {
			if err := b.Submit(reqs...); err != nil {
				t.Fatal(err)
			}
			if st, err := b.Wait(5 * time.Second); err != nil || st.State != engine.Completed {
				t.Fatalf("%+v %v", st, err)
			}
			if r < 2 {
				if err := b.Reset(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := b.Free(); err != nil {
			t.Fatal(err)
		}
		cycles++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d batches, %d statuses of freed or reset batches", cycles, freedSeen.Load())
	if n := panics.Load() + bad.Load(); n > 0 {
		t.Fatalf("%d panics and %d wrong statuses; first: %v", panics.Load(), bad.Load(), firstBad.Load())
	}
}

// lastTicket returns the ticket of the last request the hold transport was
// given.
func (h *hold) lastTicket() transport.Ticket {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.last[len(h.last)-1]
}

// TestStrayCompletionIsDropped: a completion carries the generation of the
// submission it ends. A duplicate of a finished task's completion, and a
// late one arriving after the slot was reset and reused, change nothing
// (the reused slot's task stays PENDING while its transport holds it, and
// keeps its own outcome) and are counted.
func TestStrayCompletionIsDropped(t *testing.T) {
	a, _, s, la, rb := pair(t)
	h := holdOf(a)
	b, err := a.AllocateBatch(1)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Free()
	req := engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"}
	if err := b.Submit(req); err != nil {
		t.Fatal(err)
	}
	<-h.arrived
	old := h.lastTicket()
	h.release(nil)
	if st, err := b.Wait(5 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	old.Complete(errs.New(errs.Internal, "hold", "the same completion again"))
	if ts, _ := b.TaskStatus(0); ts.State != engine.Completed || ts.Err != nil {
		t.Fatalf("a duplicate completion changed a finished task: %+v", ts)
	}
	if err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := b.Submit(req); err != nil {
		t.Fatal(err)
	}
	<-h.arrived
	old.Complete(nil) // the first submission's, late: slot 0 is another task now
	if ts, _ := b.TaskStatus(0); ts.State != engine.Pending {
		t.Fatalf("a late completion of the slot's previous task ended the new one: %+v", ts)
	}
	if _, err := b.Wait(50 * time.Millisecond); errs.CodeOf(err) != errs.Timeout {
		t.Fatalf("wait: %v, want the task still in flight", err)
	}
	if n := a.Stats().StrayCompletions; n != 2 {
		t.Fatalf("%d stray completions counted, want 2", n)
	}
	h.release(errs.New(errs.PeerUnreachable, "hold", "its own outcome"))
	st, err := b.Wait(5 * time.Second)
	if err != nil || st.State != engine.Failed || errs.CodeOf(st.Err) != errs.PeerUnreachable {
		t.Fatalf("%+v %v", st, err)
	}
}

// TestSubmitOnTheNetworkBlocksNobody: a submit waiting on the network (here
// a transport's first contact with the peer, as shm's attach call) holds no
// lock that Cancel, TaskStatus, Free, Reset or UnregisterMemory take: they
// answer at once (Free and Reset with BatchBusy) instead of waiting for the
// call's timeout.
func TestSubmitOnTheNetworkBlocksNobody(t *testing.T) {
	a, _, s, la, rb := pair(t)
	h := holdOf(a)
	other := alloc(t, 4096)
	if err := a.RegisterMemory(mem.Addr(other), 4096, "cpu", false); err != nil {
		t.Fatal(err)
	}
	b, err := a.AllocateBatch(2)
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	h.mu.Lock()
	h.reachGate = gate
	h.mu.Unlock()
	submitted := make(chan error, 1)
	go func() {
		submitted <- b.Submit(engine.Request{Op: engine.Write, Local: la, Segment: s, Remote: rb, Length: 64, Transport: "hold"})
	}()
	// Wait until the submit is inside Reachable: the batch then refuses
	// Free and Reset as busy.
	for deadline := time.Now().Add(10 * time.Second); errs.CodeOf(b.Reset()) != errs.BatchBusy; {
		if time.Now().After(deadline) {
			t.Fatal("the submit never reached the transport's first contact")
		}
		time.Sleep(time.Millisecond)
	}
	done := make(chan string, 8)
	go func() {
		if err := b.Cancel(); err != nil {
			t.Error(err)
		}
		done <- "cancel"
		if _, err := b.TaskStatus(0); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("task status during the submit: %v", err)
		}
		done <- "task status"
		if err := b.Free(); errs.CodeOf(err) != errs.BatchBusy {
			t.Errorf("free during the submit: %v, want BatchBusy", err)
		}
		done <- "free"
		if err := a.UnregisterMemory(mem.Addr(other)); err != nil {
			t.Error(err)
		}
		done <- "unregister"
	}()
	for i := 0; i < 4; i++ {
		select {
		case what := <-done:
			t.Logf("%s answered during the submit", what)
		case <-time.After(10 * time.Second):
			close(gate)
			t.Fatal("a call waited for the submit's network call")
		}
	}
	close(gate)
	if err := <-submitted; err != nil {
		t.Fatal(err)
	}
	<-h.arrived
	h.release(nil)
	if st, err := b.Wait(5 * time.Second); err != nil || st.State != engine.Completed {
		t.Fatalf("%+v %v", st, err)
	}
	if err := b.Free(); err != nil {
		t.Fatal(err)
	}
}
