package rdma

import (
	"context"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/wire"
	"github.com/tecache/te/internal/sys/ibv"
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
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // connecting endpoints
	rr     atomic.Uint64  // spreads requests' first slice over NIC pairs

	closing atomic.Bool
	mu      sync.Mutex
	closed  bool
	eps     map[epKey]*endpoint
	all     map[*endpoint]struct{} // every endpoint whose queue pairs are not destroyed
	passive map[epKey]*passiveEP
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
	return &Transport{keys: newKeyTable(), eps: map[epKey]*endpoint{}, all: map[*endpoint]struct{}{}, passive: map[epKey]*passiveEP{}}
}

// Name returns "rdma".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach and the memory it moves. GPU memory needs GPUDirect (nvidia-peermem) on the NIC.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameHost: true, CrossHost: true, HostMemory: true, GPUMemory: true}
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
	for _, n := range nics {
		t.local = append(t.local, n.info())
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, n := range t.nics {
		go n.hw.Run(t, n)
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
}

func (t *Transport) registrars() []registrar {
	out := make([]registrar, len(t.nics))
	for i, n := range t.nics {
		out[i] = n
	}
	return out
}

// Register registers r on every NIC (in parallel, pre-faulted, from
// rdma.parallel_reg_min) and sets r.Desc.Lkey/Rkey, one key per NIC.
func (t *Transport) Register(r *segment.Region) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "rdma", "transport closed")
	}
	return t.keys.register(r, t.registrars(), t.opt.ParallelRegMin)
}

// Unregister deregisters r's memory regions.
func (t *Transport) Unregister(r *segment.Region) error { return t.keys.unregister(r) }

// Reachable reports whether some local NIC can talk to some NIC of the peer.
func (t *Transport) Reachable(d *segment.Desc) error {
	if d.RPC == "" {
		return errs.New(errs.TransportUnavailable, "rdma", "segment %q has no control-plane address for the handshake", d.Name)
	}
	peers, err := peerNICs(d)
	if err != nil {
		return err
	}
	if len(pairNICs(t.local, peers)) == 0 {
		return errs.New(errs.TransportUnavailable, "rdma", "no NIC here shares a link layer with %q (%s vs %s)",
			d.Name, endpointString(t.local), endpointString(peers))
	}
	return nil
}

// request is one transfer cut into slices.
type request struct {
	r     *transport.Request
	lkeys []uint32
	rkeys []uint32
	peers []nicInfo
	pairs [][2]int
	start int
	left  atomic.Int64
	mu    sync.Mutex
	err   error
}

func (q *request) sliceDone(err error) {
	if err != nil {
		q.mu.Lock()
		if q.err == nil {
			q.err = err
		}
		q.mu.Unlock()
	}
	if q.left.Add(-1) == 0 {
		q.r.Complete(q.err)
	}
}

// slice is one work request's worth of a request.
type slice struct {
	req     *request
	idx     int
	read    bool
	local   uint64
	remote  uint64
	n       uint32
	lkey    uint32
	rkey    uint32
	attempt int
	ep      *endpoint
	qp      int
}

// Submit cuts each request into slices and posts them over the NIC pairs.
func (t *Transport) Submit(reqs []transport.Request) {
	for i := range reqs {
		r := &reqs[i]
		q, err := t.prepare(r)
		if err != nil {
			r.Complete(err)
			continue
		}
		spans := planSlices(r.Length, t.opt.Slice)
		q.left.Store(int64(len(spans)))
		for i, sp := range spans {
			t.dispatch(&slice{req: q, idx: i, read: r.Op == transport.Read,
				local: r.Local + sp.off, remote: r.Remote + sp.off, n: uint32(sp.n), qp: -1})
		}
	}
}

func (t *Transport) prepare(r *transport.Request) (*request, error) {
	if t.closing.Load() {
		return nil, errs.New(errs.Closed, "rdma", "transport closed")
	}
	if r.Length == 0 {
		return nil, errs.New(errs.InvalidArgument, "rdma", "zero length")
	}
	peers, err := peerNICs(r.Peer)
	if err != nil {
		return nil, err
	}
	pairs := pairNICs(t.local, peers)
	if len(pairs) == 0 {
		return nil, errs.New(errs.TransportUnavailable, "rdma", "no NIC pair reaches %q", r.Peer.Name)
	}
	if len(r.Buffer.Rkey) != len(peers) {
		return nil, errs.New(errs.StaleDescriptor, "rdma", "buffer at %#x of %q has %d rkeys for %d devices",
			r.Buffer.Addr, r.Peer.Name, len(r.Buffer.Rkey), len(peers))
	}
	region, ok := t.h.Registry().Lookup(r.Local, r.Length)
	if !ok {
		return nil, errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) is not registered", r.Local, r.Length)
	}
	if len(region.Desc.Lkey) != len(t.nics) {
		return nil, errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) has no memory region on every NIC", r.Local, r.Length)
	}
	return &request{r: r, lkeys: region.Desc.Lkey, rkeys: r.Buffer.Rkey, peers: peers, pairs: pairs,
		start: int(t.rr.Add(1) % uint64(len(pairs)))}, nil
}

// dispatch sends a slice to the endpoint of its NIC pair for this attempt.
func (t *Transport) dispatch(s *slice) {
	q := s.req
	p := q.pairs[pickPair(len(q.pairs), q.start, s.idx, s.attempt)]
	s.lkey, s.rkey = q.lkeys[p[0]], q.rkeys[p[1]]
	ep, err := t.endpoint(q, p[0], p[1])
	if err != nil {
		q.sliceDone(err)
		return
	}
	ep.post(s)
}

// endpoint returns the endpoint of a NIC pair with the request's peer,
// starting a new one (connected in the background) when there is none or
// the last one failed.
func (t *Transport) endpoint(q *request, local, remote int) (*endpoint, error) {
	key := epKey{instance: q.r.Peer.Instance, local: local, remote: q.peers[remote].name}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errs.New(errs.Closed, "rdma", "transport closed")
	}
	if ep := t.eps[key]; ep != nil && !ep.failed() {
		return ep, nil
	}
	ep := &endpoint{t: t, key: key, nic: t.nics[local], connecting: true,
		peer: peerRef{name: q.r.Peer.Name, instance: q.r.Peer.Instance, rpc: q.r.Peer.RPC, nic: q.peers[remote].name}}
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

// complete handles the completion of work request id on n (called by the
// NIC's poller).
func (t *Transport) complete(n *nic, id uint64, status, vendorErr uint32) {
	s := n.untrack(id)
	if s == nil {
		return // not ours, or already failed by Close
	}
	var err error
	if status != ibv.WCSuccess {
		err = wcError(s, status, vendorErr)
	}
	retry := s.ep.completed(s, err)
	if err == nil {
		s.req.sliceDone(nil)
	} else {
		t.retry(s, err)
	}
	t.retryAll(retry)
	for _, ep := range n.takeStarved() {
		ep.kick()
	}
}

// wcError turns a failed completion into a te error.
func wcError(s *slice, status, vendorErr uint32) error {
	code := errs.PeerUnreachable
	if status == ibv.WCRemAccessErr {
		// The peer's NIC refused the rkey or range: the region was
		// unregistered (and maybe registered again) since the descriptor.
		code = errs.StaleDescriptor
	}
	return errs.New(code, "rdma", "work request on %s -> %s@%s: %s (vendor error %#x)",
		s.ep.nic.name, s.ep.peer.name, s.ep.peer.nic, ibv.WCStatusString(status), vendorErr)
}

// retryable says whether a slice that failed with err may be tried again
// on another NIC pair: transport-level failures yes; a refused key, a
// stale peer or a closed transport no.
func retryable(err error) bool {
	switch errs.CodeOf(err) {
	case errs.PeerUnreachable, errs.Timeout, errs.Internal, errs.NoMemory, errs.Protocol:
		return true
	}
	return false
}

// retry sends a failed slice to the next NIC pair, or ends it.
func (t *Transport) retry(s *slice, err error) {
	s.ep, s.qp = nil, -1
	if t.closing.Load() {
		s.req.sliceDone(errs.Wrap(errs.Closed, "rdma", err, "transport closed"))
		return
	}
	if s.attempt >= t.opt.Retries || !retryable(err) {
		s.req.sliceDone(err)
		return
	}
	s.attempt++
	t.dispatch(s)
}

func (t *Transport) retryAll(ss []*slice) {
	for _, s := range ss {
		t.retry(s, s.epErr())
	}
}

// epErr is why a slice taken back from an endpoint did not run.
func (s *slice) epErr() error {
	if s.ep != nil {
		s.ep.mu.Lock()
		err := s.ep.err
		s.ep.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return errs.New(errs.PeerUnreachable, "rdma", "endpoint failed")
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
			destroyQPs(qps)
			return nil, err
		}
		qps = append(qps, qp)
	}
	return qps, nil
}

// handleHandshake is the accepting side: it connects new queue pairs of the
// named local NIC to the caller's and replies with them.
func (t *Transport) handleHandshake(_ context.Context, body []byte) ([]byte, error) {
	h, gid, err := decodeHandshake(body)
	if err != nil {
		return nil, err
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
	if t.closing.Load() {
		return nil, errs.New(errs.Closed, "rdma", "transport closed")
	}
	qps, err := t.createQPs(n, len(h.QPNum))
	if err != nil {
		return nil, err
	}
	psn := rand.Uint32() & (1<<24 - 1)
	for i, q := range qps {
		if err = q.Connect(n.rcParams(h, gid, i, psn)); err != nil {
			destroyQPs(qps)
			return nil, err
		}
	}
	key := epKey{instance: h.Instance, local: n.idx, remote: peerDev}
	var drop []*passiveEP
	t.mu.Lock()
	if t.closed || len(t.passive) >= MaxPassive {
		closed := t.closed
		t.mu.Unlock()
		destroyQPs(qps)
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
		destroyQPs(p.qps)
	}
	rep := handshake{LocalNICPath: t.h.SegmentName() + "@" + n.name, PeerNICPath: h.LocalNICPath,
		LID: n.lid, GID: formatGID(n.gid), MTU: n.mtu, PSN: psn, Instance: t.h.Instance()}
	for _, q := range qps {
		rep.QPNum = append(rep.QPNum, q.Num())
	}
	return rep.encode()
}

func destroyQPs(qps []queuePair) {
	for _, q := range qps {
		_ = q.Destroy()
	}
}

// closeDrain bounds how long Close waits for flushed completions.
const closeDrain = 2 * time.Second

// Close fails everything in flight, stops the pollers and releases every
// verbs object.
func (t *Transport) Close() error {
	if t.closing.Swap(true) {
		return nil
	}
	if t.cancel == nil {
		return nil // never started
	}
	t.cancel()
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
		for _, s := range n.takeAll() {
			s.req.sliceDone(closedErr)
		}
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
	for _, ep := range eps {
		ep.mu.Lock()
		if !ep.released {
			ep.released = true
			destroyQPs(ep.qps)
			ep.qps = nil
		}
		ep.mu.Unlock()
	}
	for _, p := range passive {
		destroyQPs(p.qps)
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
