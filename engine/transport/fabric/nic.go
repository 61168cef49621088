package fabric

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/transport/internal/rails"
	"github.com/tecache/te/internal/errs"
	fab "github.com/tecache/te/internal/sys/fabric"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// nic is one opened domain: its address vector, completion queue and the
// endpoint peers address their RMA to. Every data-path call of the NIC
// (fi_write, fi_read, fi_cq_read, closing a peer endpoint to flush it) is
// made by its poller goroutine, run; other goroutines hand it work through
// the queue.
type nic struct {
	t        *Transport
	idx      int
	name     string // provider/domain
	prov     string
	d        *fab.Domain
	av       *fab.AV
	cq       *fab.CQ
	ep       *fab.Endpoint
	addr     []byte // ep's address
	mrMode   uint64
	keySize  int
	keyMask  uint64
	depth    int
	progress int
	hostOnly bool // shm: reaches this host only
	hmem     bool // opened with FI_HMEM: GPU memory may be registered
	shared   bool // FI_MR_ENDPOINT: regions bind to ep, so every operation goes through it
	sread    bool // the passive goroutine progresses cq with fi_cq_sread
	pdone    chan struct{}

	avMu   sync.Mutex
	avAddr map[string]uint64 // fi_addr of each address inserted

	mu      sync.Mutex
	queue   []*op
	cancels []cancelReq
	kick    chan struct{}
	quit    chan struct{}
	done    chan struct{}
	peers   atomic.Int32         // peers that connected to this NIC (they need its progress)
	open    map[*peerEP]struct{} // peer endpoints not closed yet
	openGen int                  // changes of open

	polled    []*peerEP // the poller's copy of open
	polledGen int

	// Poller-owned state.
	ctxMem  []byte // C memory holding each slot's op context (fi_context2)
	slots   []*op
	free    []int32 // FIFO, so a slot is reused as late as possible
	backlog []*op
	out     int // operations posted and not yet completed

	// Draining (shm): closing an endpoint there is no flush, since the
	// peer works through the commands already in its queue whatever
	// becomes of the sender, and in libfabric 1.17 it dereferences a null
	// region when the first of them (the connection request) names an
	// endpoint closed meanwhile. So a used endpoint is closed only once a
	// probe READ posted behind its operations has completed: the peer has
	// taken every command before it. probe is this NIC's own small region
	// that peers' probes read.
	drain     bool
	probeMem  []byte
	probeMR   *fab.MR
	drainCtx  []byte           // C memory, one op context per drain slot
	drains    []*drainState    // by slot (poller-owned)
	drainFree []int32          // free drain slots
	draining  map[*peerEP]bool // endpoints waiting on their probe

	stall     time.Duration  // the stall watchdog's bound (0: off)
	stallNext time.Time      // when it looks next
	verdicts  []stallVerdict // from checkKeys, under mu

	posts, bytes atomic.Uint64
}

// drainState is an endpoint being drained before its close.
type drainState struct {
	pe       *peerEP
	fail     error
	deadline time.Time
	posted   bool
}

// Drain bounds: how long a peer may take to reach a probe before the
// endpoint is closed anyway (a peer that slow is taken for gone), how
// long Close waits for all of a NIC's, and how many drain at once.
const (
	drainTimeout      = 2 * time.Second
	closeDrainTimeout = time.Second
	drainSlots        = 64
	probeSize         = 64
)

type cancelReq struct {
	pe       *peerEP
	deadline time.Time
}

func openNIC(t *Transport, idx int, of *fab.Offer) (_ *nic, err error) {
	n := &nic{t: t, idx: idx, name: of.Name(), prov: of.Provider, mrMode: of.MRMode, keySize: of.MRKeySize,
		progress: of.DataProgress, avAddr: map[string]uint64{}, open: map[*peerEP]struct{}{}, kick: make(chan struct{}, 1),
		quit: make(chan struct{}), done: make(chan struct{})}
	n.hostOnly = of.HasProvider("shm")
	n.hmem = of.Caps&fab.FlagHMEM != 0
	n.shared = of.MRMode&fab.MREndpoint != 0
	n.keyMask = ^uint64(0)
	if of.MRKeySize < 8 {
		n.keyMask = 1<<(8*uint(of.MRKeySize)) - 1
	}
	n.depth = t.opt.Depth
	if of.TxSize > 0 {
		n.depth = min(n.depth, of.TxSize)
	}
	defer func() {
		if err != nil {
			n.release()
		}
	}()
	if n.d, err = of.OpenDomain(); err != nil {
		return nil, err
	}
	if n.av, err = n.d.OpenAV(maxPeers); err != nil {
		// shm bounds its address vector by its peer map (256 in 1.17).
		if n.av, err = n.d.OpenAV(256); err != nil {
			return nil, err
		}
	}
	// The queue holds every completion of the NIC's endpoints: room for
	// a full queue of each of many peers is not needed, the poller reads
	// as they come; the provider's own default size is enough.
	// The NIC's own endpoint only serves peers (te's operations go
	// through per-peer endpoints) unless regions bind to it: its queue
	// gets a wait object where the provider's blocking read works (not
	// shm's in 1.17, which never returns), so that progressing peers'
	// RMA costs a thread blocked in the kernel, not a polling loop.
	n.sread = !n.shared && !of.HasProvider("shm") && of.DataProgress == fab.ProgressManual
	if n.cq, err = n.d.OpenCQ(4*n.depth, n.sread); err != nil {
		if !n.sread {
			return nil, err
		}
		n.sread = false
		if n.cq, err = n.d.OpenCQ(4*n.depth, false); err != nil {
			return nil, err
		}
	}
	if n.ep, err = n.d.Endpoint(n.av, n.cq); err != nil {
		return nil, err
	}
	if n.addr, err = n.ep.Name(); err != nil {
		return nil, err
	}
	nslots := 4 * n.depth
	if n.ctxMem, err = mem.Alloc(nslots * ctxSize); err != nil {
		return nil, err
	}
	if n.hostOnly && !n.shared {
		if err = n.openProbe(); err != nil {
			return nil, err
		}
	}
	n.slots = make([]*op, nslots)
	n.free = make([]int32, nslots)
	for i := range n.free {
		n.free[i] = int32(i)
	}
	return n, nil
}

// openProbe registers the region peers' drain probes read and the
// contexts of this NIC's own probes.
func (n *nic) openProbe() error {
	var err error
	if n.probeMem, err = mem.Alloc(probeSize); err != nil {
		return err
	}
	if n.probeMR, err = n.register(mem.Addr(n.probeMem), probeSize, fab.HMEMSystem, 0); err != nil {
		return err
	}
	if n.drainCtx, err = mem.Alloc(drainSlots * ctxSize); err != nil {
		return err
	}
	n.drains = make([]*drainState, drainSlots)
	n.drainFree = make([]int32, drainSlots)
	for i := range n.drainFree {
		n.drainFree[i] = int32(i)
	}
	n.draining = map[*peerEP]bool{}
	n.drain = true
	return nil
}

// probeOf is what a peer passes to read this NIC's probe region (nil
// when the NIC has none).
func (n *nic) probeOf() *probe {
	if n.probeMR == nil {
		return nil
	}
	p := &probe{Key: n.probeMR.Key}
	if n.mrMode&fab.MRVirtAddr != 0 {
		p.Addr = mem.Addr(n.probeMem)
	}
	return p
}

func (n *nic) drainCtxAddr(s int32) uintptr {
	return uintptr(mem.Addr(n.drainCtx)) + uintptr(s)*ctxSize
}

// drainOf returns the drain slot of a completion's context, or -1.
func (n *nic) drainOf(ctx uintptr) int32 {
	if n.drainCtx == nil {
		return -1
	}
	base := uintptr(mem.Addr(n.drainCtx))
	if ctx < base || ctx >= base+uintptr(len(n.drainCtx)) || (ctx-base)%ctxSize != 0 {
		return -1
	}
	return int32((ctx - base) / ctxSize)
}

// ctxSize is the room of one op context: struct fi_context2, for
// providers that ask for FI_CONTEXT or FI_CONTEXT2.
const ctxSize = 64

func (n *nic) ctxAddr(slot int32) uintptr {
	return uintptr(mem.Addr(n.ctxMem)) + uintptr(slot)*ctxSize
}

func (n *nic) slotOf(ctx uintptr) int32 {
	base := uintptr(mem.Addr(n.ctxMem))
	if ctx < base || ctx >= base+uintptr(len(n.ctxMem)) || (ctx-base)%ctxSize != 0 {
		return -1
	}
	return int32((ctx - base) / ctxSize)
}

// register registers [addr, addr+length) for local use and remote access;
// iface and dev place device memory (fab.HMEMSystem for host memory).
func (n *nic) register(addr, length uint64, iface, dev int32) (*fab.MR, error) {
	r := fab.Reg{Addr: addr, Len: length, Access: rmaAccess, Iface: iface, Device: dev}
	if n.shared {
		r.EP = n.ep
	}
	var err error
	for try := 0; try < 4; try++ {
		if n.mrMode&fab.MRProvKey == 0 {
			r.Key = rand.Uint64() & n.keyMask
		}
		var m *fab.MR
		if m, err = n.d.Register(r); err == nil {
			return m, nil
		}
		if n.mrMode&fab.MRProvKey != 0 {
			break
		}
		// A random key that collided with one in use: draw again.
	}
	return nil, err
}

// insert returns the fi_addr of a peer NIC's address.
func (n *nic) insert(addr []byte) (uint64, error) {
	n.avMu.Lock()
	defer n.avMu.Unlock()
	if fa, ok := n.avAddr[string(addr)]; ok {
		return fa, nil
	}
	if len(n.avAddr) >= maxPeers {
		return 0, errs.New(errs.ResourceExhausted, "fabric", "%s: %d peer addresses inserted already", n.name, maxPeers)
	}
	fa, err := n.av.Insert(addr)
	if err != nil {
		return 0, err
	}
	n.avAddr[string(addr)] = fa
	return fa, nil
}

// enqueue hands operations to the poller.
func (n *nic) enqueue(ops ...*op) {
	n.mu.Lock()
	n.queue = append(n.queue, ops...)
	n.mu.Unlock()
	n.wake()
}

func (n *nic) wake() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// run is the poller: it posts queued operations as the provider has room,
// reads completions (which is also what progresses a provider with manual
// progress, for this engine's operations and for peers' RMA into it), and
// flushes endpoints whose canceled operations outlived their grace.
func (n *nic) run() {
	defer close(n.done)
	ctx := make([]uintptr, 64)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	spins := 0
	for {
		select {
		case <-n.quit:
			return
		default:
		}
		posted := n.post()
		reaped := n.reap(ctx)
		n.sweep()
		if posted || reaped > 0 {
			spins = 0
			continue
		}
		// Nothing moved. While operations are out, keep reading (a busy
		// NIC completes within microseconds); otherwise, sleep, waking
		// for new work, and often enough to progress peers' RMA into
		// this engine when the provider needs it.
		spins++
		if n.out > 0 && spins < 256 {
			runtime.Gosched()
			continue
		}
		wait := 20 * time.Millisecond
		switch {
		case n.out > 0 || len(n.backlog) > 0 || len(n.draining) > 0:
			wait = 50 * time.Microsecond
		case n.progress == fab.ProgressManual && n.peers.Load() > 0 && !n.sread:
			wait = 200 * time.Microsecond
		}
		timer.Reset(wait)
		select {
		case <-n.quit:
			return
		case <-n.kick:
			spins = 0
		case <-timer.C:
		}
	}
}

// post posts the backlog and the queue while the NIC has room.
func (n *nic) post() bool {
	n.mu.Lock()
	if len(n.queue) > 0 {
		n.backlog = append(n.backlog, n.queue...)
		n.queue = n.queue[:0]
	}
	n.mu.Unlock()
	did := false
	i := 0
	for ; i < len(n.backlog); i++ {
		o := n.backlog[i]
		if o.q.canceled.Load() {
			n.t.settle(o, errCanceled)
			did = true
			continue
		}
		if o.pe.dead.Load() {
			if e := o.pe.fail.Load(); e != nil {
				n.t.settle(o, *e)
			} else {
				n.t.retry(o, errTornDown)
			}
			did = true
			continue
		}
		if n.out >= n.depth || len(n.free) == 0 {
			break
		}
		slot := n.free[0]
		ep := o.pe.endpoint()
		// Tried, even if refused for now: shm's first try sends the
		// peer the connection request, and refuses (-FI_EAGAIN) until
		// the peer took it.
		o.pe.used = true
		var err error
		if o.write {
			err = ep.Write(o.local, o.n, o.desc, o.pe.dest, o.remote, o.key, n.ctxAddr(slot))
		} else {
			err = ep.Read(o.local, o.n, o.desc, o.pe.dest, o.remote, o.key, n.ctxAddr(slot))
		}
		if errors.Is(err, fab.ErrAgain) {
			// The provider's queue is full: progress it (reap) and try
			// again on the next round, never spinning here.
			n.t.st.eagain.Add(1)
			break
		}
		did = true
		if err != nil {
			n.t.st.errors.Add(1)
			n.t.settle(o, err)
			continue
		}
		n.free = n.free[1:]
		n.slots[slot] = o
		o.slot = slot
		n.out++
		o.pe.out++
		o.pe.outBytes += o.n
		n.posts.Add(1)
		n.t.st.posts.Add(1)
	}
	n.backlog = n.backlog[:copy(n.backlog, n.backlog[i:])]
	return did
}

// reap reads completions of the NIC's queue and of every peer endpoint's
// and ends their operations.
func (n *nic) reap(ctx []uintptr) int {
	total := 0
	if !n.sread {
		total = n.reapCQ(n.cq, ctx)
	}
	n.mu.Lock()
	if n.openGen != n.polledGen {
		n.polled = n.polled[:0]
		for pe := range n.open {
			n.polled = append(n.polled, pe)
		}
		n.polledGen = n.openGen
	}
	n.mu.Unlock()
	for _, pe := range n.polled {
		if pe.cq != nil && !pe.closed {
			total += n.reapCQ(pe.cq, ctx)
		}
	}
	return total
}

func (n *nic) reapCQ(cq *fab.CQ, ctx []uintptr) int {
	total := 0
	var broken []*peerEP
	var drained []int32
	for round := 0; round < 16; round++ {
		k, err := cq.Read(ctx)
		for _, c := range ctx[:k] {
			if d := n.drainOf(c); d >= 0 {
				drained = append(drained, d)
				continue
			}
			if o := n.take(c); o != nil {
				n.bytes.Add(o.n)
				n.t.st.bytes.Add(o.n)
				now := rails.Now()
				o.rail.Completed(o.n, now)
				if h := o.pe.health; h != nil {
					h.OK(now)
				}
				n.t.opDone(o, nil)
			}
		}
		total += k
		if errors.Is(err, fab.ErrAvail) {
			e, ok := cq.ReadErr()
			if d := n.drainOf(e.Context); ok && d >= 0 {
				// Refused or not, the peer took the probe, and with
				// it every command before it.
				total++
				drained = append(drained, d)
				continue
			}
			if ok {
				total++
				n.t.st.errors.Add(1)
				if o := n.take(e.Context); o != nil {
					// Its completion is read: the provider is done with
					// its memory (the fence), so it may go again on
					// another NIC pair when this one failed and another
					// is there; a refused key fails on every pair.
					err := remoteError(o, e.Err)
					if errs.CodeOf(err) != errs.StaleDescriptor && n.t.railFailed(o.pe) {
						n.t.retry(o, err)
					} else {
						n.t.settle(o, err)
					}
					broken = append(broken, o.pe)
				}
			}
			continue
		}
		if err != nil || k < len(ctx) {
			break
		}
	}
	// An error completion leaves the provider's connection to the peer
	// in doubt (tcp closes it): the endpoint goes, its other operations go
	// again on a new one.
	for _, pe := range broken {
		n.teardown(pe)
	}
	// Closed after the reading: the queue read may be a drained
	// endpoint's own.
	for _, d := range drained {
		n.drained(d)
	}
	return total
}

// take ends the posted operation of a completion's context (nil when it is
// none of the NIC's: a flushed endpoint's, already ended).
func (n *nic) take(ctx uintptr) *op {
	s := n.slotOf(ctx)
	if s < 0 || n.slots[s] == nil {
		return nil
	}
	o := n.slots[s]
	n.slots[s] = nil
	n.free = append(n.free, s)
	n.out--
	o.pe.out--
	o.pe.outBytes -= o.n
	o.pe.done++
	return o
}

// remoteError names an error completion. A refused key (the peer
// unregistered the buffer, or registered it again with new keys) is a
// stale descriptor: providers report it as an access error (sockets) or a
// canceled operation (tcp, whose target answers a bad key so).
func remoteError(o *op, err error) error {
	switch errs.CodeOf(err) {
	case errs.AccessDenied, errs.Canceled, errs.InvalidArgument:
		return errs.Wrap(errs.StaleDescriptor, "fabric", err, "%s refused the access (its registration changed)", o.pe.peerName)
	}
	return errs.Wrap(errs.PeerUnreachable, "fabric", err, "%s to %s", o.kind(), o.pe.peerName)
}

// sweep flushes the endpoints of canceled operations that are still
// posted after their grace: closing an endpoint is the flush after which
// the provider touches none of its operations' memory.
func (n *nic) sweep() {
	n.stalls()
	n.sweepDrains(time.Now())
	n.mu.Lock()
	if len(n.cancels) == 0 {
		n.mu.Unlock()
		return
	}
	cs := n.cancels
	n.cancels = nil
	n.mu.Unlock()
	now := time.Now()
	var keep []cancelReq
	for _, c := range cs {
		if c.pe.closed || !n.hasCanceled(c.pe) {
			continue
		}
		if now.Before(c.deadline) {
			keep = append(keep, c)
			continue
		}
		n.teardown(c.pe)
	}
	if len(keep) > 0 {
		n.mu.Lock()
		n.cancels = append(n.cancels, keep...)
		n.mu.Unlock()
	}
}

func (n *nic) hasCanceled(pe *peerEP) bool {
	if pe.out == 0 {
		return false
	}
	for _, o := range n.slots {
		if o != nil && o.pe == pe && o.q.canceled.Load() {
			return true
		}
	}
	return false
}

// teardown closes a peer endpoint and ends every operation posted on it:
// the canceled ones as canceled, the others to go again on a new endpoint.
// Completions already queued are read first, so that none of them can be
// taken for a later operation in the same slot.
func (n *nic) teardown(pe *peerEP) { n.close(pe, nil) }

// close closes a peer endpoint (the flush) and ends the operations posted
// on it: canceled ones as canceled, the others with fail, or, when fail is
// nil, sent again on a new endpoint.
func (n *nic) close(pe *peerEP, fail error) {
	if pe.shared() {
		// Under FI_MR_ENDPOINT every peer shares the NIC's endpoint:
		// closing it is not a flush of one peer. The operations end at
		// their completions.
		return
	}
	if pe.closed || n.draining[pe] {
		return
	}
	if fail != nil {
		pe.fail.Store(&fail)
	}
	pe.kill()
	if n.startDrain(pe, fail) {
		return
	}
	n.closeNow(pe, fail)
}

// startDrain posts a probe behind a used endpoint's operations and defers
// its close to the probe's completion (nic.drain). Not for a peer taken
// for gone, nor when every drain slot is taken.
func (n *nic) startDrain(pe *peerEP, fail error) bool {
	if !n.drain || pe.probe == nil || !pe.used || len(n.drainFree) == 0 ||
		(fail != nil && errs.CodeOf(fail) == errs.PeerUnreachable) {
		return false
	}
	s := n.drainFree[0]
	n.drainFree = n.drainFree[1:]
	n.drains[s] = &drainState{pe: pe, fail: fail, deadline: time.Now().Add(drainTimeout)}
	n.draining[pe] = true
	n.t.st.drains.Add(1)
	n.postDrain(s)
	return true
}

// postDrain posts slot s's probe; on no room it is tried again by the
// next sweep.
func (n *nic) postDrain(s int32) {
	d := n.drains[s]
	p := d.pe.probe
	err := d.pe.ep.Read(mem.Addr(n.probeMem), 8, n.probeMR.Desc, d.pe.dest, p.Addr, p.Key, n.drainCtxAddr(s))
	switch {
	case err == nil:
		d.posted = true
	case errors.Is(err, fab.ErrAgain):
	default:
		// Not posted, so nothing to wait for: closing is all that is
		// left.
		n.t.st.drainTimeouts.Add(1)
		n.drained(s)
	}
}

// drained closes the endpoint of drain slot s.
func (n *nic) drained(s int32) {
	d := n.drains[s]
	if d == nil {
		return
	}
	n.drains[s] = nil
	n.drainFree = append(n.drainFree, s)
	delete(n.draining, d.pe)
	n.closeNow(d.pe, d.fail)
}

// sweepDrains posts probes that found no room, and closes the endpoints
// of peers that did not reach theirs in time.
func (n *nic) sweepDrains(now time.Time) {
	for s, d := range n.drains {
		switch {
		case d == nil:
		case now.After(d.deadline):
			n.t.st.drainTimeouts.Add(1)
			n.t.h.Logf("te: fabric: %s -> %s: the peer took no command of the endpoint in %v: closing it anyway",
				n.name, d.pe.peerName, drainTimeout)
			n.drained(int32(s))
		case !d.posted:
			n.postDrain(int32(s))
		}
	}
}

// closeNow closes the endpoint and ends what was posted on it.
func (n *nic) closeNow(pe *peerEP, fail error) {
	if pe.closed {
		return
	}
	n.t.st.teardowns.Add(1)
	n.mu.Lock()
	delete(n.open, pe)
	n.openGen++
	n.mu.Unlock()
	pe.close(n.t)
	for s, o := range n.slots {
		if o != nil && o.pe == pe {
			n.slots[s] = nil
			n.free = append(n.free, int32(s))
			n.out--
			pe.out--
			pe.outBytes -= o.n
			switch {
			case o.q.canceled.Load():
				n.t.settle(o, errCanceled)
			case fail != nil:
				n.t.settle(o, fail)
			default:
				n.t.retry(o, errTornDown)
			}
		}
	}
}

// stalls watches for endpoints whose posted operations have seen no
// completion for the stall bound. On a provider that drops an access under
// a refused key (the owner re-registered) nothing else would end them, and
// the endpoint takes no more work behind them; but a loaded peer can also
// be merely slow. So the owner is asked whether it still holds the keys of
// those operations (checkKeys, off the poller): if not, the endpoint is
// closed (the flush) and they end StaleDescriptor, so the engine fetches
// the descriptor again; if it does, they wait on; if it does not answer,
// they end PeerUnreachable. It looks a few times per bound, not on every
// round.
func (n *nic) stalls() {
	const stallRate = 64 << 20 // bytes per second no provider is slower than, loaded
	if n.stall <= 0 {
		return
	}
	now := time.Now()
	n.mu.Lock()
	verdicts := n.verdicts
	n.verdicts = nil
	n.mu.Unlock()
	for _, v := range verdicts {
		pe := v.pe
		pe.checking = false
		if pe.closed || n.draining[pe] {
			continue
		}
		stale := errs.CodeOf(v.err) == errs.StaleDescriptor
		if !stale && n.t.otherPair(pe) {
			n.t.railFailed(pe)
			// The owner holds the keys (or does not answer on the
			// control plane) yet this NIC pair completed nothing: the
			// pair is cooled down, and its operations, once the close
			// flushed them, go over another one.
			n.t.st.stalls.Add(1)
			n.t.h.Logf("te: fabric: %s -> %s@%s: %d operations posted, none completed in %v: moving them to another NIC pair",
				n.name, pe.peerName, pe.rnic, pe.out, n.stall)
			n.close(pe, nil)
			continue
		}
		if v.err == nil {
			// The owner holds every key: slow, not refused.
			pe.seen, pe.quiet = pe.done, now
			continue
		}
		n.t.st.stalls.Add(1)
		n.t.h.Logf("te: fabric: %s -> %s: %d operations posted, none completed in %v: %v",
			n.name, pe.peerName, pe.out, n.stall, v.err)
		n.close(pe, v.err)
	}
	if now.Before(n.stallNext) {
		return
	}
	n.stallNext = now.Add(n.stall / 4)
	for _, pe := range n.polled {
		if pe.closed || n.draining[pe] || pe.out == 0 || pe.done != pe.seen || pe.quiet.IsZero() {
			pe.seen, pe.quiet = pe.done, now
			continue
		}
		// A large batch may rightly complete nothing for a while: its
		// bytes at a floor rate extend the bound.
		if pe.checking || now.Sub(pe.quiet) < n.stall+time.Duration(pe.outBytes/stallRate)*time.Second {
			continue
		}
		var keys []uint64
		for _, o := range n.slots {
			if o != nil && o.pe == pe && !slices.Contains(keys, o.key) {
				keys = append(keys, o.key)
			}
		}
		pe.checking = true
		n.t.st.stallChecks.Add(1)
		if !n.t.goTracked(func() { n.checkKeys(pe, keys) }) {
			pe.checking = false
		}
	}
}

// stallVerdict is what checkKeys learned about a stalled endpoint: err nil
// when the owner holds every key of its posted operations.
type stallVerdict struct {
	pe  *peerEP
	err error
}

// checkKeys asks the owner of pe's peer NIC whether it still holds keys and
// hands the verdict to the poller.
func (n *nic) checkKeys(pe *peerEP, keys []uint64) {
	t := n.t
	body, _ := json.Marshal(hello{Instance: t.h.Instance(), Segment: t.h.SegmentName(), To: pe.key.instance, NIC: pe.rnic, Check: keys})
	ctx, cancel := context.WithTimeout(t.ctx, t.opt.HandshakeTimeout)
	rep, err := t.h.Control().Call(ctx, pe.rpc, wire.KindFabric, body)
	cancel()
	var v stallVerdict
	v.pe = pe
	var h hello
	switch {
	case errs.CodeOf(err) == errs.StaleDescriptor:
		v.err = errs.Wrap(errs.StaleDescriptor, "fabric", err, "%s restarted under the operations posted to it", pe.peerName)
	case err != nil:
		v.err = errs.Wrap(errs.PeerUnreachable, "fabric", err,
			"no completion from %s within %v (fabric.stall_timeout), and it does not answer", pe.peerName, n.stall)
	case json.Unmarshal(rep, &h) != nil:
		v.err = errs.New(errs.Protocol, "fabric", "bad key check reply from %s", pe.peerName)
	case len(h.Stale) > 0:
		v.err = errs.New(errs.StaleDescriptor, "fabric",
			"%s no longer holds the key of operations posted to it (its registration changed): %s drops such an access without completing it",
			pe.peerName, n.prov)
	}
	n.mu.Lock()
	n.verdicts = append(n.verdicts, v)
	n.mu.Unlock()
	n.wake()
}

// passive progresses peers' RMA into this engine: blocked in
// fi_cq_sread on the NIC's queue, which waits on the provider's sockets
// and progresses them as bytes arrive. Nothing te posts completes there.
func (n *nic) passive() {
	defer close(n.pdone)
	ctx := make([]uintptr, 64)
	for {
		select {
		case <-n.quit:
			return
		default:
		}
		if n.peers.Load() == 0 {
			// No peer yet: nothing to progress; look again soon.
			select {
			case <-n.quit:
				return
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		k, err := n.cq.SRead(ctx, 20)
		if errors.Is(err, fab.ErrAvail) {
			n.cq.ReadErr()
		}
		if err != nil && k == 0 && !errors.Is(err, fab.ErrAvail) {
			time.Sleep(time.Millisecond)
		}
	}
}

// stop ends the poller (and the passive progress).
func (n *nic) stop() {
	close(n.quit)
	<-n.done
	if n.pdone != nil {
		<-n.pdone
	}
}

// shutdown (the poller stopped) closes every peer endpoint and the NIC's
// own, which flushes their operations, then ends those with err.
func (n *nic) shutdown(err error) {
	ctx := make([]uintptr, 64)
	n.reap(ctx)
	if n.drain {
		// The poller is stopped: this goroutine drains, for a moment.
		n.mu.Lock()
		var used []*peerEP
		for pe := range n.open {
			if pe.used && !pe.closed {
				used = append(used, pe)
			}
		}
		n.mu.Unlock()
		for _, pe := range used {
			n.close(pe, err)
		}
		for end := time.Now().Add(closeDrainTimeout); len(n.draining) > 0 && time.Now().Before(end); {
			n.reap(ctx)
			n.sweepDrains(time.Now())
			time.Sleep(50 * time.Microsecond)
		}
		left := 0
		for s, d := range n.drains {
			if d != nil {
				left++
			}
			n.drained(int32(s))
		}
		if left > 0 {
			n.t.st.drainTimeouts.Add(uint64(left))
			n.t.h.Logf("te: fabric: %s: closing with %d endpoints whose peers took no command of theirs in %v: closed anyway",
				n.name, left, closeDrainTimeout)
		}
	}
	n.mu.Lock()
	eps := n.open
	n.open = nil
	n.mu.Unlock()
	for pe := range eps {
		pe.kill()
		pe.close(n.t)
	}
	if n.ep != nil {
		_ = n.ep.Close()
		n.ep = nil
	}
	for s, o := range n.slots {
		if o != nil {
			n.slots[s] = nil
			n.t.opDone(o, err)
		}
	}
	n.mu.Lock()
	rest := append(n.backlog, n.queue...)
	n.backlog, n.queue = nil, nil
	n.mu.Unlock()
	for _, o := range rest {
		n.t.opDone(o, err)
	}
}

// release closes what is left of the NIC.
func (n *nic) release() {
	if n.probeMR != nil {
		_ = n.probeMR.Close()
		n.probeMR = nil
	}
	for _, c := range []interface{ Close() error }{n.ep, n.cq, n.av, n.d} {
		if c != nil && !isNil(c) {
			if err := c.Close(); err != nil && n.t != nil && n.t.h != nil {
				n.t.h.Logf("te: fabric: %s: %v", n.name, err)
			}
		}
	}
	n.ep, n.cq, n.av, n.d = nil, nil, nil, nil
	if n.ctxMem != nil {
		_ = mem.Free(n.ctxMem)
		n.ctxMem = nil
	}
	for _, b := range []*[]byte{&n.probeMem, &n.drainCtx} {
		if *b != nil {
			_ = mem.Free(*b)
			*b = nil
		}
	}
}

func isNil(c interface{ Close() error }) bool {
	switch v := c.(type) {
	case *fab.Endpoint:
		return v == nil
	case *fab.CQ:
		return v == nil
	case *fab.AV:
		return v == nil
	case *fab.Domain:
		return v == nil
	}
	return false
}
