// Package local is the transport between engines of one process: the owner's
// registry checks the access, then a memcpy moves the bytes.
package local

import (
	"sync"
	"sync/atomic"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Name is the transport's name.
const Name = "local"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// engines maps an engine instance to its registry, for every engine of this
// process that installed the local transport.
var (
	mu      sync.RWMutex
	engines = map[string]*segment.Registry{}
)

// InlineBytes is the most one Submit copies on the caller's goroutine: below
// it a hand-off costs more than the copy, above it Submit would wait for the
// transfer, which it must not.
const InlineBytes = 1 << 20

// Transport is the local (same-process) transport.
type Transport struct {
	instance string
	self     segment.Caller // this engine, as the owners it accesses know it

	qmu     sync.Mutex
	queue   []*queued
	closed  bool
	running int // workers alive
	wg      sync.WaitGroup
}

// queued is a request waiting for the worker: the transport's own state,
// which Cancel and the worker claim before either touches the request (the
// winner alone reads it, and completes it through the ticket kept here).
type queued struct {
	r     *transport.Request
	tk    transport.Ticket
	taken atomic.Bool
}

func (q *queued) claim() bool { return q.taken.CompareAndSwap(false, true) }

// New returns an unstarted transport.
func New() *Transport { return &Transport{} }

// Name returns "local".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach and the memory it moves.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameProcess: true, HostMemory: true, Windows: true, Rank: 0}
}

// Start records the engine's registry so other engines of this process can
// reach it.
func (t *Transport) Start(h transport.Host) error {
	t.instance = h.Instance()
	// In one process the owner knows for certain which engine calls: a
	// window bound to another engine is refused with or without a secret.
	t.self = segment.Caller{Name: h.SegmentName(), Instance: h.Instance(), Known: true}
	mu.Lock()
	engines[t.instance] = h.Registry()
	mu.Unlock()
	return nil
}

// Describe adds nothing: the instance id already identifies the engine.
func (t *Transport) Describe(*segment.Desc) {}

// Register needs no per-transport state.
func (t *Transport) Register(*segment.Region) error { return nil }

// Unregister needs no per-transport state.
func (t *Transport) Unregister(*segment.Region) error { return nil }

// Reachable reports whether the peer is an engine of this process.
func (t *Transport) Reachable(d *segment.Desc) error {
	mu.RLock()
	_, ok := engines[d.Instance]
	mu.RUnlock()
	if !ok {
		return errs.New(errs.TransportUnavailable, "local", "segment %q is not in this process", d.Name)
	}
	return nil
}

// Submit copies a small submit at once (a memcpy is faster than handing it
// off) and queues a larger one for a worker, so it never waits for a long
// copy.
func (t *Transport) Submit(reqs []transport.Request) {
	var total uint64
	for i := range reqs {
		total += reqs[i].Length
	}
	if total <= InlineBytes {
		c := cache{by: t.self}
		for i := range reqs {
			reqs[i].Complete(c.do(&reqs[i]))
		}
		return
	}
	qs := make([]queued, len(reqs)) // one allocation for the call
	for i := range reqs {
		qs[i].r, qs[i].tk = &reqs[i], reqs[i].Ticket()
		reqs[i].Priv = &qs[i]
	}
	t.qmu.Lock()
	if t.closed {
		t.qmu.Unlock()
		for i := range qs {
			qs[i].tk.Complete(errs.New(errs.Closed, "local", "transport closed"))
		}
		return
	}
	for i := range qs {
		t.queue = append(t.queue, &qs[i])
	}
	if t.running == 0 {
		t.running = 1
		t.wg.Add(1)
		go t.worker()
	}
	t.qmu.Unlock()
}

// worker copies queued requests one at a time and exits when the queue is
// empty (the next large submit starts another).
func (t *Transport) worker() {
	defer t.wg.Done()
	c := cache{by: t.self}
	for {
		t.qmu.Lock()
		if len(t.queue) == 0 {
			t.running = 0
			t.qmu.Unlock()
			return
		}
		q := t.queue[0]
		t.queue[0] = nil
		t.queue = t.queue[1:]
		t.qmu.Unlock()
		if q.claim() { // else Cancel ended it
			q.tk.Complete(c.do(q.r))
		}
	}
}

// Cancel completes the requests still queued with Canceled (claiming them,
// so the worker skips them): O(len(reqs)), under no lock. One being copied
// ends when its memcpy does.
func (t *Transport) Cancel(reqs []*transport.Request) {
	for _, r := range reqs {
		if q, ok := r.Priv.(*queued); ok && q != nil && q.claim() {
			q.tk.Complete(errs.New(errs.Canceled, "local", "canceled before it was copied"))
		}
	}
}

// Quiesce has nothing to cut: other engines of this process touch r only in a
// memcpy, which ends on its own.
func (t *Transport) Quiesce(*segment.Region) error { return nil }

// cache remembers the last owner's registry, so a submit to one engine looks
// it up once instead of taking the global lock per request.
type cache struct {
	by   segment.Caller // the engine accessing
	inst string
	reg  *segment.Registry
	last *segment.Region // the owner's region the previous request hit
}

func (c *cache) do(r *transport.Request) error {
	if c.reg == nil || c.inst != r.Peer.Instance {
		mu.RLock()
		c.reg = engines[r.Peer.Instance]
		mu.RUnlock()
		c.inst, c.last = r.Peer.Instance, nil
	}
	if c.reg == nil {
		return errs.New(errs.PeerUnreachable, "local", "segment %q has closed", r.Peer.Name)
	}
	// The owner's registry decides, with the key of the registration the
	// descriptor was built from: a stale descriptor is refused.
	region, err := c.reg.AcquireIn(c.last, r.Remote, r.Length, r.Key, true, c.by)
	if err != nil {
		return err
	}
	c.last = region
	if segment.StorageOf(region) != nil {
		// A file's addresses are reserved, never mapped: the file
		// transport moves its bytes.
		region.Release()
		return errs.New(errs.NotSupported, "local", "[%#x,+%d) is a registered file, not memory", r.Remote, r.Length)
	}
	if r.Op == transport.Write {
		mem.Copy(r.Remote, r.Local, r.Length)
	} else {
		mem.Copy(r.Local, r.Remote, r.Length)
	}
	region.Release()
	return nil
}

// Close makes this engine unreachable to others, fails what is queued and
// waits for a copy in progress.
func (t *Transport) Close() error {
	mu.Lock()
	delete(engines, t.instance)
	mu.Unlock()
	t.qmu.Lock()
	t.closed = true
	q := t.queue
	t.queue = nil
	t.qmu.Unlock()
	for _, x := range q {
		if x.claim() {
			x.tk.Complete(errs.New(errs.Closed, "local", "transport closed"))
		}
	}
	t.wg.Wait()
	return nil
}
