package engine_test

import (
	_ "github.com/tecache/te/engine/std" // the engines these tests build install every standard transport

	"os"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
)

func TestMain(m *testing.M) {
	transport.RegisterFactory("hold", func() (transport.Transport, error) { return newHold(), nil })
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) {
		if ctrlpeer.dir != "" {
			os.RemoveAll(ctrlpeer.dir)
		}
	}))
}

// hold is a test transport that keeps every request until the test releases
// it, so batch bookkeeping can be observed while tasks are in flight. It
// reaches only engines of this process that also installed it.
type hold struct {
	mu      sync.Mutex
	held    []held
	last    []transport.Ticket // every ticket ever submitted, for tests that replay one
	arrived chan struct{}
	stuck   bool // Cancel completes nothing: a transport that cannot let go yet
	// reachGate, when set, makes Reachable wait until it is closed.
	reachGate chan struct{}
}

var (
	holdMu    sync.Mutex
	holdPeers = map[string]*hold{}
)

// held is a request the hold transport keeps, with the ticket that ends it.
type held struct {
	r  *transport.Request
	tk transport.Ticket
}

func newHold() *hold { return &hold{arrived: make(chan struct{}, 1<<16)} }

func (h *hold) Name() string { return "hold" }
func (h *hold) Caps() transport.Caps {
	return transport.Caps{SameProcess: true, HostMemory: true, Rank: 100}
}
func (h *hold) Start(host transport.Host) error {
	holdMu.Lock()
	holdPeers[host.Instance()] = h
	holdMu.Unlock()
	return nil
}
func (h *hold) Describe(*segment.Desc)           {}
func (h *hold) Register(*segment.Region) error   { return nil }
func (h *hold) Unregister(*segment.Region) error { return nil }
func (h *hold) Reachable(d *segment.Desc) error {
	h.mu.Lock()
	gate := h.reachGate
	h.mu.Unlock()
	if gate != nil {
		<-gate // a first contact that waits on the network (shm's attach call)
	}
	holdMu.Lock()
	defer holdMu.Unlock()
	if holdPeers[d.Instance] == nil {
		return errs.New(errs.TransportUnavailable, "hold", "not here")
	}
	return nil
}
func (h *hold) Submit(reqs []transport.Request) {
	h.mu.Lock()
	for i := range reqs {
		h.held = append(h.held, held{&reqs[i], reqs[i].Ticket()})
		h.last = append(h.last, reqs[i].Ticket())
	}
	h.mu.Unlock()
	for range reqs {
		h.arrived <- struct{}{}
	}
}

// Cancel completes the held requests among reqs with Canceled.
func (h *hold) Cancel(reqs []*transport.Request) {
	h.mu.Lock()
	if h.stuck {
		h.mu.Unlock()
		return
	}
	var out []held
	keep := h.held[:0]
	for _, x := range h.held {
		found := false
		for _, r := range reqs {
			found = found || x.r == r
		}
		if found {
			out = append(out, x)
		} else {
			keep = append(keep, x)
		}
	}
	h.held = keep
	h.mu.Unlock()
	for _, x := range out {
		x.tk.Complete(errs.New(errs.Canceled, "hold", "canceled"))
	}
}

func (h *hold) Quiesce(*segment.Region) error { return nil }

// release completes every held request with err.
func (h *hold) release(err error) int {
	h.mu.Lock()
	hs := h.held
	h.held = nil
	h.mu.Unlock()
	for _, x := range hs {
		x.tk.Complete(err)
	}
	return len(hs)
}

func (h *hold) Close() error {
	holdMu.Lock()
	for k, v := range holdPeers {
		if v == h {
			delete(holdPeers, k)
		}
	}
	holdMu.Unlock()
	h.release(errs.New(errs.Closed, "hold", "closed"))
	return nil
}
