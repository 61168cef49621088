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
	held    []*transport.Request
	arrived chan struct{}
	stuck   bool // Cancel completes nothing: a transport that cannot let go yet
}

var (
	holdMu    sync.Mutex
	holdPeers = map[string]*hold{}
)

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
		h.held = append(h.held, &reqs[i])
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
	var out []*transport.Request
	keep := h.held[:0]
	for _, r := range h.held {
		found := false
		for _, x := range reqs {
			found = found || x == r
		}
		if found {
			out = append(out, r)
		} else {
			keep = append(keep, r)
		}
	}
	h.held = keep
	h.mu.Unlock()
	for _, r := range out {
		r.Complete(errs.New(errs.Canceled, "hold", "canceled"))
	}
}

func (h *hold) Quiesce(*segment.Region) error { return nil }

// release completes every held request with err.
func (h *hold) release(err error) int {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	for _, r := range held {
		r.Complete(err)
	}
	return len(held)
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
