package cudaipc

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

func expectNone(t *testing.T, c <-chan error, what string) {
	t.Helper()
	select {
	case err := <-c:
		t.Fatalf("%s completed (%v) too early", what, err)
	case <-time.After(50 * time.Millisecond):
	}
}

// A request whose copy is on a stream is not completed by Cancel: it ends,
// with its real outcome, once the stream has synchronised.
func TestCancelWaitsForSync(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	p.pdrv.block, p.pdrv.started = make(chan struct{}), make(chan struct{}, 1)
	done := make(chan error, 2)
	reqs := []transport.Request{{Op: transport.Write, Local: 0x5000, Remote: r.Addr, Length: 64, Peer: p.desc,
		Buffer: &r.Desc, Key: r.Desc.Key, Owner: transport.DoneFunc(func(err error) { done <- err })}}
	p.peer.Submit(reqs)
	<-p.pdrv.started
	p.peer.Cancel([]*transport.Request{&reqs[0]})
	expectNone(t, done, "a request whose copy is on a stream")
	close(p.pdrv.block)
	if err := <-done; err != nil {
		t.Fatalf("copy that ran: %v, want its real outcome (nil)", err)
	}
}

// A request not yet prepared when Cancel comes ends Canceled at once, and
// its copy is never enqueued.
func TestCancelBeforeEnqueue(t *testing.T) {
	p := newPair(t)
	r1 := p.register(t, 0x900000)
	r2 := p.register(t, 0x4000000)
	gate := make(chan struct{})
	p.ownerGate.Store(&gate) // the first request's open waits for the owner
	first, second := make(chan error, 1), make(chan error, 1)
	reqs := []transport.Request{
		{Op: transport.Write, Local: 0x5000, Remote: r1.Addr, Length: 64, Peer: p.desc, Buffer: &r1.Desc, Key: r1.Desc.Key,
			Owner: transport.DoneFunc(func(err error) { first <- err })},
		{Op: transport.Write, Local: 0x6000, Remote: r2.Addr, Length: 64, Peer: p.desc, Buffer: &r2.Desc, Key: r2.Desc.Key,
			Owner: transport.DoneFunc(func(err error) { second <- err })},
	}
	p.peer.Submit(reqs)
	p.peer.Cancel([]*transport.Request{&reqs[1]})
	select {
	case err := <-second:
		if !errors.Is(err, errs.ErrCanceled) {
			t.Fatalf("canceled request: %v, want Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a request canceled before its copy was enqueued did not end at once")
	}
	p.ownerGate.Store(nil)
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	p.peer.Close()
	for _, sp := range p.pdrv.spans {
		if sp.src == 0x6000 {
			t.Fatal("the canceled request's copy was enqueued")
		}
	}
}

// Submits racing Close (run with -race): every request ends, each exactly
// once, and no copy starts after Close returned.
func TestSubmitRacesClose(t *testing.T) {
	p := newPair(t)
	r := p.register(t, 0x900000)
	if err := p.write(r, 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ended, submitted := 0, 0
	cb := transport.DoneFunc(func(err error) {
		if err != nil && !errors.Is(err, errs.ErrClosed) && !errors.Is(err, errs.ErrStaleDescriptor) {
			t.Error(err)
		}
		mu.Lock()
		ended++
		mu.Unlock()
	})
	stop := make(chan struct{})
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				reqs := make([]transport.Request, 8)
				for i := range reqs {
					reqs[i] = transport.Request{Op: transport.Write, Local: 0x5000, Remote: r.Addr + uint64(i)*64, Length: 64,
						Peer: p.desc, Buffer: &r.Desc, Key: r.Desc.Key, Owner: cb}
				}
				mu.Lock()
				submitted += len(reqs)
				mu.Unlock()
				p.peer.Submit(reqs)
			}
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := p.peer.Close(); err != nil {
		t.Fatal(err)
	}
	p.pdrv.closed.Store(true)
	close(stop)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if ended != submitted {
		t.Fatalf("%d of %d requests ended", ended, submitted)
	}
}
