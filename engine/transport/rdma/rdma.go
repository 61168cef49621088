package rdma

import (
	"context"
	"errors"
	"github.com/tecache/te/engine/transport/internal/rails"
	"math/rand/v2"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/ibv"
	"github.com/tecache/te/internal/sys/topo"
	"github.com/tecache/te/internal/wire"
)

// Name is the transport's name.
const Name = "rdma"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// Probe reports whether the rdma transport can run here: it loads
// libibverbs and lists the devices the allow-list (TE_RDMA_DEVICES or
// MC_TE_FILTERS) admits. The error is NotSupported and says why not.
func Probe() ([]string, error) {
	o, err := ParseOptions(func(string) (string, bool) { return "", false }, os.Getenv)
	if err != nil {
		return nil, err
	}
	return probe(o)
}

// Available is Probe without the device list.
func Available() error {
	_, err := Probe()
	return err
}

func probe(o Options) ([]string, error) {
	lib, err := loadLib(o)
	if err != nil {
		return nil, err
	}
	list, err := lib.Devices()
	if err != nil {
		return nil, err
	}
	defer list.Free()
	return usableNames(lib, list, o)
}

func loadLib(o Options) (*ibv.Lib, error) {
	if o.Library != "" {
		return ibv.Open(o.Library)
	}
	return ibv.Load()
}

func usableNames(lib *ibv.Lib, list *ibv.DeviceList, o Options) ([]string, error) {
	var found []string
	for i := 0; i < list.Len(); i++ {
		found = append(found, list.Name(i))
	}
	if len(found) == 0 {
		return nil, errs.New(errs.NotSupported, "rdma", "no RDMA device (%s loaded, ibv_get_device_list found none)", lib.Path).
			WithHint("load the NIC's driver and ibverbs-providers, or add Soft-RoCE: rdma link add rxe0 type rxe netdev eth0")
	}
	return FilterDevices(found, o.Devices)
}

// Transport is the rdma transport.
type Transport struct {
	h      transport.Host
	opt    Options
	nics   []*nic
	local  []nicInfo
	keys   *keyTable
	loc    *locality
	health rails.Health
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // connecting endpoints
	rr     atomic.Uint64  // breaks ties between rails

	// dmabuf exports GPU memory of a runtime for registration (dmabufOf).
	dmabuf func(kind string, addr, length uint64, dev int) (int, uint64, error)

	closing atomic.Bool
	mu      sync.Mutex
	closed  bool
	eps     map[epKey]*endpoint
	all     map[*endpoint]struct{} // every endpoint whose queue pairs are not destroyed
	passive map[epKey]*passiveEP
	rails   map[epKey]*rail        // by peer instance and NIC pair
	peerH   map[string]*rails.Peer // by peer instance
	retired railTotals             // counters of rails of restarted peers
	// gone holds the peer instances that restarted (their successor's
	// descriptor was seen), goneOrder the same oldest first (maxGone).
	gone      map[string]struct{}
	goneOrder []string

	peers    sync.Map                 // segment name -> *peerInfo of its last descriptor
	lastPeer atomic.Pointer[peerInfo] // the one peerOf returned last

	st struct {
		gpuDmabuf, gpuPeermem, gpuRefused atomic.Uint64
		cooldowns, unreachable            atomic.Uint64
		stalls                            atomic.Uint64 // endpoints the watchdog failed
		qps                               atomic.Int64  // queue pairs created and not destroyed
	}
	// The stall watchdog (see watchdog): whether it sleeps, its wake-up,
	// and closed when it ended.
	wdIdle atomic.Bool
	wdKick chan struct{}
	wdDone chan struct{}
	// reaperDone is closed when the idle reaper ended (reapIdle).
	reaperDone chan struct{}
}

// passiveEP is the accepting side of an endpoint: queue pairs a peer
// connected to for its one-sided reads and writes. Nothing is posted on them.
type passiveEP struct {
	nic     *nic
	segment string
	qps     []queuePair
}

// MaxPassive bounds the endpoints peers may open to one engine.
const MaxPassive = 4096

// New returns an unstarted transport.
func New() *Transport {
	return &Transport{keys: newKeyTable(), eps: map[epKey]*endpoint{}, all: map[*endpoint]struct{}{}, passive: map[epKey]*passiveEP{},
		rails: map[epKey]*rail{}, peerH: map[string]*rails.Peer{}, gone: map[string]struct{}{}, dmabuf: dmabufOf}
}

// Name returns "rdma".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach and the memory it moves. GPU memory needs GPUDirect (nvidia-peermem) on the NIC.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameHost: true, CrossHost: true, HostMemory: true, GPUMemory: true, Rank: 30}
}

// Start loads libibverbs, opens every allowed NIC that has an active port
// and starts their completion pollers. Without the library or a usable
// device it returns a NotSupported error that says why.
func (t *Transport) Start(h transport.Host) error {
	o, err := optionsOf(h)
	if err != nil {
		return err
	}
	t.h, t.opt = h, o
	if o.MRCache {
		t.keys.cache = &mrCache{}
	}
	lib, err := loadLib(o)
	if err != nil {
		return err
	}
	list, err := lib.Devices()
	if err != nil {
		return err
	}
	defer list.Free()
	names, err := usableNames(lib, list, o)
	if err != nil {
		return err
	}
	allowed := map[string]bool{}
	for _, n := range names {
		allowed[n] = true
	}
	var why []string
	var nics []*nic
	for i := 0; i < list.Len(); i++ {
		if !allowed[list.Name(i)] {
			continue
		}
		n, err := openNIC(list, i, len(nics), o)
		if err != nil {
			why = append(why, err.Error())
			h.Logf("te: rdma: skipping %s: %v", list.Name(i), err)
			continue
		}
		nics = append(nics, n)
	}
	if len(nics) == 0 {
		return errs.New(errs.NotSupported, "rdma", "no usable RDMA device: %s", strings.Join(why, "; "))
	}
	t.start(nics)
	return nil
}

// start runs the transport over opened NICs (real ones from Start, fakes
// in tests).
func (t *Transport) start(nics []*nic) {
	t.nics = nics
	names := make([]string, len(nics))
	for i, n := range nics {
		t.local = append(t.local, n.info())
		names[i] = n.name
	}
	t.health = t.opt.health()
	if t.loc == nil {
		t.loc = newLocality(topo.Root(), names, func() map[string][]string { return topo.ProbeGPUsByKind() })
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, n := range t.nics {
		go n.hw.Run(t, n)
	}
	if t.opt.StallTimeout > 0 {
		t.wdKick, t.wdDone = make(chan struct{}, 1), make(chan struct{})
		go t.watchdog()
	}
	if t.opt.PeerIdle > 0 {
		t.reaperDone = make(chan struct{})
		go t.reaper()
	}
	t.h.Control().Handle(wire.KindRDMA, t.handleHandshake)
}

// Describe publishes the NICs as Mooncake does (devices: name, lid, gid, in
// the order of every buffer's lkey/rkey vectors) and their link layers.
func (t *Transport) Describe(d *segment.Desc) {
	for _, n := range t.nics {
		d.Devices = append(d.Devices, segment.Device{Name: n.name, LID: n.lid, GID: formatGID(n.gid)})
	}
	if d.Endpoints == nil {
		d.Endpoints = map[string]string{}
	}
	d.Endpoints[Name] = endpointString(t.local)
	// Mooncake's descriptor names the one transport its peers should use:
	// an engine with NICs says rdma (the engine says tcp instead when it
	// serves Mooncake initiators, which te serves over tcp only).
	d.Protocol = Name
}

func (t *Transport) registrars() []registrar {
	out := make([]registrar, len(t.nics))
	for i, n := range t.nics {
		out[i] = n
	}
	return out
}

// Register registers r on every NIC (in parallel, pre-faulted, from
// rdma.parallel_reg_min) and sets r.Desc.Lkey/Rkey, one key per NIC, and
// the NICs near it (ExtraNear). GPU memory the NICs refuse is registered
// without keys (logged, counted in gpu_refused): it moves by staging.
func (t *Transport) Register(r *segment.Region) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "rdma", "transport closed")
	}
	if gpu.IsDevice(r.Location.Kind) {
		kind := r.Location.Kind
		how, err := t.keys.registerDevice(r, t.registrars(), func(addr, length uint64, dev int) (int, uint64, error) {
			return t.dmabuf(kind, addr, length, dev)
		})
		switch {
		case err != nil:
			t.keys.refuse(r, err)
			t.st.gpuRefused.Add(1)
			t.h.Logf("te: rdma: GPU memory [%#x,+%d) at %s stays off the NICs, requests on it are staged over another transport: %v",
				r.Addr, r.Length, r.Location, err)
			return nil
		case how == viaDmabuf:
			t.st.gpuDmabuf.Add(1)
		case how == viaPeermem:
			t.st.gpuPeermem.Add(1)
		}
	} else if err := t.keys.register(r, t.registrars(), t.opt.ParallelRegMin); err != nil {
		return err
	}
	if near := t.loc.tiers(r.Location).near; near != "" && len(r.Desc.Rkey) > 0 {
		if r.Desc.Extra == nil {
			r.Desc.Extra = map[string]string{}
		}
		r.Desc.Extra[ExtraNear] = near
	}
	return nil
}

// harvester is a NIC whose completions a waiter may poll for itself.
type harvester interface {
	harvest(t *Transport, n *nic) int
}

// Harvest polls, on the waiter's goroutine, the completion queues of the
// NICs with work outstanding until done is closed or rdma.harvest has
// passed (transport.Harvester): completions that come within it reach the
// waiter without a poller waking up and handing them over. A NIC whose
// poller is polling at that moment is left to it.
func (t *Transport) Harvest(done <-chan struct{}) {
	if t.opt.Harvest <= 0 || t.closing.Load() {
		return
	}
	end := nanotime() + int64(t.opt.Harvest)
	for i := 0; ; i++ {
		for _, n := range t.nics {
			if h, ok := n.hw.(harvester); ok && n.outstanding() > 0 {
				if k := h.harvest(t, n); k > 0 {
					n.reaped.Add(uint64(k))
				}
			}
		}
		select {
		case <-done:
			return
		default:
		}
		if i%16 == 15 {
			if nanotime() > end {
				return
			}
			// The NIC's and the peer's threads may need this core.
			runtime.Gosched()
		}
	}
}

// Unregister deregisters r's memory regions.
func (t *Transport) Unregister(r *segment.Region) error { return t.keys.unregister(r) }

// Reachable reports whether some local NIC can talk to some NIC of the
// peer, and whether rdma to it works: a peer whose endpoints failed
// ErrorLimit times within ErrorWindow with no transfer completing in
// between (it cannot be reached, or keeps failing) is unreachable for a
// cooldown, and the engine takes another transport for it.
func (t *Transport) Reachable(d *segment.Desc) error {
	if d.RPC == "" {
		return errs.New(errs.TransportUnavailable, "rdma", "segment %q has no control-plane address for the handshake", d.Name)
	}
	pi := t.peerOf(d)
	if pi.err != nil {
		return pi.err
	}
	if pi.health.CoolUntil() == 0 {
		return nil // the engine asks per request: no clock read when healthy
	}
	if err := pi.health.Unreachable(nanotime(), "rdma"); err != nil {
		return errs.Wrap(errs.PeerUnreachable, "rdma", err, "segment %q", d.Name)
	}
	return nil
}

// Warmup connects the queue pairs of every rail to the peer (every local NIC
// with every peer NIC of its link layer) and returns once each rail's
// handshake ended: nil when all are ready, else the first rail's error
// (transport.Warmer). Rails already connected are kept as they are.
func (t *Transport) Warmup(ctx context.Context, d *segment.Desc) error {
	if err := t.Reachable(d); err != nil {
		return err
	}
	pi := t.peerOf(d)
	eps := make([]*endpoint, len(pi.rails))
	for x := range pi.rails {
		ep := pi.eps[x].Load()
		if ep == nil || ep.failed() {
			var err error
			if ep, err = t.endpoint(pi, int32(x)); err != nil {
				return err
			}
			pi.eps[x].Store(ep)
		}
		eps[x] = ep
	}
	for _, ep := range eps {
		select {
		case <-ep.up:
		case <-ctx.Done():
			code := errs.Canceled
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				code = errs.Timeout
			}
			return errs.Wrap(code, "rdma", ctx.Err(), "connect to %s over %s-%s", d.Name, ep.rail.lname, ep.rail.rname)
		}
		if ep.failed() {
			return ep.error()
		}
	}
	return nil
}

// railError records an endpoint failure against its rail and its peer.
// A cancellation, a closing transport or a refused key (the peer changed
// its memory, not its NICs) says nothing about the rail.
func (t *Transport) railError(ep *endpoint, err error) {
	switch errs.CodeOf(err) {
	case errs.Canceled, errs.Closed, errs.StaleDescriptor:
		return
	}
	if t.closing.Load() || ep.rail == nil {
		return
	}
	now := nanotime()
	if d, cool := ep.rail.Fail(t.health, now); cool {
		t.st.cooldowns.Add(1)
		t.h.Logf("te: rdma: rail %s -> %s@%s cools down for %v after %d errors within %v: %v",
			ep.nic.name, ep.peer.name, ep.peer.nic, d, t.health.Limit, t.health.Window, err)
	}
	// A stalled endpoint's peer is reachable: other rails to it just
	// moved bytes (see watch).
	if ep.peerH != nil && !ep.stalled && ep.peerH.Failed(t.health, now, err, "rdma") {
		t.st.unreachable.Add(1)
		if rn, ok := t.h.(transport.ReachNotifier); ok {
			rn.ReachChanged() // the engine's cached choice of rdma for it goes
		}
		t.h.Logf("te: rdma: peer %s is unreachable over rdma for %v (other transports take it): %v",
			ep.peer.name, time.Duration(ep.peerH.CoolUntil()-now), err)
	}
}

// endpoint returns the endpoint of rail x of the peer, starting a new one
// (connected in the background) when there is none or the last one failed.
func (t *Transport) endpoint(pi *peerInfo, x int32) (*endpoint, error) {
	d := pi.desc
	rl := pi.rails[x]
	key := rl.key
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errs.New(errs.Closed, "rdma", "transport closed")
	}
	if ep := t.eps[key]; ep != nil && !ep.failed() {
		return ep, nil
	}
	ep := &endpoint{t: t, key: key, nic: t.nics[rl.local], rail: rl, peerH: pi.health, connecting: true, up: make(chan struct{}),
		peer: peerRef{name: d.Name, instance: d.Instance, rpc: d.RPC, nic: rl.rname}}
	ep.used.Store(nanotime())
	t.eps[key] = ep
	t.all[ep] = struct{}{}
	t.wg.Add(1)
	go ep.connect()
	return ep, nil
}

// forget drops a failed endpoint from the map (if it is still the one
// there) so the next slice for its NIC pair connects anew.
func (t *Transport) forget(ep *endpoint) {
	t.mu.Lock()
	if t.eps[ep.key] == ep {
		delete(t.eps, ep.key)
	}
	t.mu.Unlock()
}

// createQPs creates count RC queue pairs on the NIC.
func (t *Transport) createQPs(n *nic, count int) ([]queuePair, error) {
	depth := t.opt.Depth
	if n.maxQPWR > 0 {
		depth = min(depth, n.maxQPWR)
	}
	var qps []queuePair
	for i := 0; i < count; i++ {
		qp, err := n.hw.CreateQP(depth)
		if err != nil {
			t.destroyQPs(qps)
			return nil, err
		}
		t.st.qps.Add(1)
		qps = append(qps, qp)
	}
	return qps, nil
}

// handleHandshake is the accepting side: it connects new queue pairs of the
// named local NIC to the caller's and replies with them.
func (t *Transport) handleHandshake(ctx context.Context, body []byte) ([]byte, error) {
	h, gid, err := decodeHandshake(body)
	if err != nil {
		return nil, err
	}
	// The instance and segment the body names decide which endpoints the
	// new queue pairs replace: with a secret they must be those the
	// session proved, or an engine holding the secret could tear down
	// another peer's queue pairs.
	if by := transport.CallerOf(ctx); by.Known {
		if seg, _, _ := splitNICPath(h.LocalNICPath); h.Instance != by.Instance || seg != by.Name {
			return nil, errs.New(errs.Unauthenticated, "rdma",
				"handshake names segment %q instance %s, but its session proved segment %q instance %s", seg, h.Instance, by.Name, by.Instance)
		}
	}
	if h.PeerInstance != "" && h.PeerInstance != t.h.Instance() {
		return nil, errs.New(errs.StaleDescriptor, "rdma", "handshake for instance %s reached %s", h.PeerInstance, t.h.Instance())
	}
	peerSeg, peerDev, _ := splitNICPath(h.LocalNICPath)
	_, dev, _ := splitNICPath(h.PeerNICPath)
	var n *nic
	for _, c := range t.nics {
		if c.name == dev {
			n = c
		}
	}
	if n == nil {
		return nil, errs.New(errs.NotFound, "rdma", "no NIC %q here", dev)
	}
	// Counted in t.wg under t.mu, as Close sets closed before it waits:
	// Close then releases the NIC's verbs objects only after this handler
	// stopped using them (it used to destroy the protection domain and the
	// device's scratch under an ibv_create_qp in progress).
	t.mu.Lock()
	if t.closed || t.closing.Load() {
		t.mu.Unlock()
		return nil, errs.New(errs.Closed, "rdma", "transport closed")
	}
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	qps, err := t.createQPs(n, len(h.QPNum))
	if err != nil {
		return nil, err
	}
	psn := rand.Uint32() & (1<<24 - 1)
	for i, q := range qps {
		if err = q.Connect(n.rcParams(h, gid, i, psn)); err != nil {
			t.destroyQPs(qps)
			return nil, err
		}
	}
	key := epKey{instance: h.Instance, local: n.idx, remote: peerDev}
	var drop []*passiveEP
	t.mu.Lock()
	if t.closed || len(t.passive) >= MaxPassive {
		closed := t.closed
		t.mu.Unlock()
		t.destroyQPs(qps)
		if closed {
			return nil, errs.New(errs.Closed, "rdma", "transport closed")
		}
		return nil, errs.New(errs.NoMemory, "rdma", "%d endpoints accepted already", MaxPassive)
	}
	for k, p := range t.passive {
		// The same NIC pair again (the peer re-established it), or a
		// previous instance of the same peer segment: the old queue pairs
		// are dead.
		if k == key || (p.segment == peerSeg && k.instance != h.Instance) {
			drop = append(drop, p)
			delete(t.passive, k)
		}
	}
	t.passive[key] = &passiveEP{nic: n, segment: peerSeg, qps: qps}
	t.mu.Unlock()
	for _, p := range drop {
		t.destroyQPs(p.qps)
	}
	rep := handshake{LocalNICPath: t.h.SegmentName() + "@" + n.name, PeerNICPath: h.LocalNICPath,
		LID: n.lid, GID: formatGID(n.gid), MTU: n.mtu, PSN: psn, Instance: t.h.Instance()}
	for _, q := range qps {
		rep.QPNum = append(rep.QPNum, q.Num())
	}
	return rep.encode()
}

func (t *Transport) destroyQPs(qps []queuePair) {
	for _, q := range qps {
		_ = q.Destroy()
	}
	t.st.qps.Add(-int64(len(qps)))
}

// closeDrain bounds how long Close waits for flushed completions.
const closeDrain = 2 * time.Second

// Close fails everything in flight, stops the pollers and releases every
// verbs object. A request still posted when the device stopped delivering
// completions is completed only after its queue pair is destroyed, when
// the NIC can no longer touch its memory.
func (t *Transport) Close() error {
	if t.closing.Swap(true) {
		return nil
	}
	if t.cancel == nil {
		return nil // never started
	}
	t.cancel()
	if t.wdDone != nil {
		<-t.wdDone // no watchdog look meets the teardown
	}
	if t.reaperDone != nil {
		<-t.reaperDone
	}
	t.mu.Lock()
	t.closed = true
	eps := make([]*endpoint, 0, len(t.eps))
	for _, ep := range t.eps {
		eps = append(eps, ep)
	}
	t.mu.Unlock()
	closedErr := errs.New(errs.Closed, "rdma", "transport closed")
	for _, ep := range eps {
		ep.fail(closedErr)
	}
	t.wg.Wait() // handshakes in progress end (their context is canceled)
	// Queue pairs in the error state flush every outstanding work request;
	// the pollers deliver those completions, which fail their requests.
	deadline := time.Now().Add(closeDrain)
	for _, n := range t.nics {
		for n.outstanding() > 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	for _, n := range t.nics {
		n.hw.Stop()
	}
	t.mu.Lock()
	eps = eps[:0]
	for ep := range t.all {
		eps = append(eps, ep)
	}
	t.eps, t.all = map[epKey]*endpoint{}, map[*endpoint]struct{}{}
	passive := t.passive
	t.passive = map[epKey]*passiveEP{}
	t.mu.Unlock()
	var left []wrEntry
	for _, ep := range eps {
		ep.mu.Lock()
		if !ep.released {
			ep.released = true
			ep.destroyLocked()
		}
		left = ep.drainLocked(left)
		ep.mu.Unlock()
	}
	for _, e := range left {
		e.req.sliceDone(closedErr)
	}
	for _, p := range passive {
		t.destroyQPs(p.qps)
	}
	t.keys.closeAll()
	for _, n := range t.nics {
		n.hw.Release()
	}
	return nil
}

// released drops an endpoint whose queue pairs are gone from the set Close
// cleans up.
func (t *Transport) released(ep *endpoint) {
	t.mu.Lock()
	delete(t.all, ep)
	t.mu.Unlock()
}

// Stats counts, since the transport started: per rail ("rail.L:R.*", local
// NIC L to peer NIC R, summed over peers) and per local NIC the bytes moved, error events
// (endpoint failures), slices retried elsewhere and cooldowns; per peer NIC
// the bytes; doorbells (ibv_post_send calls) per NIC; GPU regions
// registered through a dma-buf, by address (peer memory) and refused; and
// peers found unreachable; endpoints the stall watchdog failed (stalls);
// with rdma.mr_cache=on, the windows the range cache registered and the
// regions it served from one already registered.
func (t *Transport) Stats() map[string]uint64 {
	out := map[string]uint64{}
	tot := railTotals{}
	t.mu.Lock()
	for _, r := range t.rails {
		tot.add(r)
	}
	for k, v := range t.retired {
		w := tot[k]
		if w == nil {
			w = new([4]uint64)
			tot[k] = w
		}
		for i := range v {
			w[i] += v[i]
		}
	}
	t.mu.Unlock()
	names := [4]string{"bytes", "errors", "retries", "cooldowns"}
	for k, v := range tot {
		l, r, _ := strings.Cut(k, ":")
		for i, n := range names {
			out["rail."+k+"."+n] += v[i]
			out["nic."+l+"."+n] += v[i]
			out[n] += v[i]
		}
		out["peer_nic."+r+".bytes"] += v[0]
	}
	for _, n := range t.nics {
		p := n.posts.Load()
		out["nic."+n.name+".doorbells"] = p
		out["nic."+n.name+".parks"] = n.parks.Load()
		out["nic."+n.name+".harvested"] = n.reaped.Load()
		out["doorbells"] += p
	}
	out["gpu_dmabuf"] = t.st.gpuDmabuf.Load()
	out["gpu_peermem"] = t.st.gpuPeermem.Load()
	out["gpu_refused"] = t.st.gpuRefused.Load()
	if t.keys.cache != nil {
		out["mr_cache_windows"], out["mr_cache_hits"] = t.keys.cache.counts()
	}
	out["peers_unreachable"] = t.st.unreachable.Load()
	out["stalls"] = t.st.stalls.Load()
	return out
}

// Live reports its endpoints (initiating ones whose queue pairs are not
// destroyed, and accepted ones), the peer instances they reach and the
// queue pairs they hold (transport.LiveReporter).
func (t *Transport) Live() transport.Live {
	t.mu.Lock()
	inst := make(map[string]struct{}, len(t.all)+len(t.passive))
	for ep := range t.all {
		inst[ep.key.instance] = struct{}{}
	}
	for k := range t.passive {
		inst[k.instance] = struct{}{}
	}
	l := transport.Live{Peers: len(inst), Endpoints: len(t.all) + len(t.passive)}
	t.mu.Unlock()
	l.QueuePairs = int(t.st.qps.Load())
	return l
}

// Topology is Mooncake's topology matrix of this transport's NICs: for
// every memory location of the machine, the NICs near it and the others.
func (t *Transport) Topology() map[string][2][]string {
	if t.loc == nil {
		return map[string][2][]string{}
	}
	return t.loc.matrix()
}
