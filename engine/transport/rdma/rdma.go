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

	peers sync.Map // segment name -> *peerInfo of its last descriptor
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
	return t.peerOf(d).err
}

// request is one transfer cut into slices (its Priv).
type request struct {
	r        *transport.Request
	pi       *peerInfo
	lkeys    []uint32
	rkeys    []uint32
	slices   []slice // in the submit's slab
	start    int
	left     atomic.Int64
	err      atomic.Pointer[error]
	canceled atomic.Bool
}

// sliceDone ends one slice; the request completes with its last one, with
// the first error any slice had.
func (q *request) sliceDone(err error) {
	if err != nil {
		e := err // only a failure pays for the pointer
		q.err.CompareAndSwap(nil, &e)
	}
	if q.left.Add(-1) == 0 {
		var e error
		if p := q.err.Load(); p != nil {
			e = *p
		}
		q.r.Complete(e)
	}
}

// slice is one work request's worth of a request. It sits in at most one
// place at a time: a list being dispatched, an endpoint's pending list, or
// a queue pair's ring of posted work requests; next links it in the first
// two.
type slice struct {
	req     *request
	next    *slice
	idx     int32
	attempt int32
	read    bool
	n       uint32
	lkey    uint32
	rkey    uint32
	local   uint64
	remote  uint64
}

// list is a FIFO of slices linked through next.
type list struct {
	head, tail *slice
	n          int
}

func (l *list) push(s *slice) {
	s.next = nil
	if l.tail == nil {
		l.head = s
	} else {
		l.tail.next = s
	}
	l.tail = s
	l.n++
}

func (l *list) pop() *slice {
	s := l.head
	if s == nil {
		return nil
	}
	l.head = s.next
	if l.head == nil {
		l.tail = nil
	}
	s.next = nil
	l.n--
	return s
}

// appendList moves every slice of m to the end of l.
func (l *list) appendList(m *list) {
	if m.head == nil {
		return
	}
	if l.tail == nil {
		l.head = m.head
	} else {
		l.tail.next = m.head
	}
	l.tail = m.tail
	l.n += m.n
	*m = list{}
}

// epGroup collects the slices of one submit bound for one endpoint.
type epGroup struct {
	ep *endpoint
	l  list
}

// Submit cuts each request into slices, groups them by endpoint and posts
// each group as one chain of work requests: one doorbell per endpoint per
// submit (more only when a queue pair or the completion queue is full). It
// allocates two slabs per submit (requests and slices), nothing per slice.
func (t *Transport) Submit(reqs []transport.Request) {
	size := t.opt.Slice
	total := 0
	for i := range reqs {
		total += sliceCount(reqs[i].Length, size)
	}
	qs := make([]request, len(reqs))
	ss := make([]slice, total)
	var small [8]epGroup
	groups := small[:0]
	var pi *peerInfo
	used := 0
	for i := range reqs {
		r := &reqs[i]
		if pi == nil || pi.desc != r.Peer {
			pi = t.peerOf(r.Peer)
		}
		q := &qs[i]
		if err := t.prepare(r, q, pi); err != nil {
			r.Complete(err)
			continue
		}
		n := sliceCount(r.Length, size)
		q.slices = ss[used : used+n : used+n]
		used += n
		q.left.Store(int64(n))
		r.Priv = q
		read := r.Op == transport.Read
		for k := range q.slices {
			s := &q.slices[k]
			off, sn := sliceAt(r.Length, size, k)
			s.req, s.idx, s.read = q, int32(k), read
			s.local, s.remote, s.n = r.Local+off, r.Remote+off, uint32(sn)
			ep, err := t.route(s)
			if err != nil {
				q.sliceDone(err)
				continue
			}
			g := -1
			for x := range groups {
				if groups[x].ep == ep {
					g = x
					break
				}
			}
			if g < 0 {
				groups = append(groups, epGroup{ep: ep})
				g = len(groups) - 1
			}
			groups[g].l.push(s)
		}
	}
	for i := range groups {
		groups[i].ep.post(&groups[i].l)
	}
}

func (t *Transport) prepare(r *transport.Request, q *request, pi *peerInfo) error {
	if t.closing.Load() {
		return errs.New(errs.Closed, "rdma", "transport closed")
	}
	if r.Length == 0 {
		return errs.New(errs.InvalidArgument, "rdma", "zero length")
	}
	if pi.err != nil {
		return pi.err
	}
	if r.Buffer == nil || len(r.Buffer.Rkey) != len(pi.nics) {
		n := 0
		if r.Buffer != nil {
			n = len(r.Buffer.Rkey)
		}
		return errs.New(errs.StaleDescriptor, "rdma", "buffer at %#x of %q has %d rkeys for %d devices",
			r.Remote, r.Peer.Name, n, len(pi.nics))
	}
	if r.Region == nil {
		return errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) is not registered", r.Local, r.Length)
	}
	if len(r.Region.Desc.Lkey) != len(t.nics) {
		return errs.New(errs.AddressNotRegistered, "rdma", "local [%#x,+%d) has no memory region on every NIC", r.Local, r.Length)
	}
	q.r, q.pi, q.lkeys, q.rkeys = r, pi, r.Region.Desc.Lkey, r.Buffer.Rkey
	q.start = int(t.rr.Add(1) % uint64(len(pi.pairs)))
	return nil
}

// route picks the NIC pair of a slice for its attempt, sets its keys and
// returns the pair's endpoint: lock-free when the endpoint is up.
func (t *Transport) route(s *slice) (*endpoint, error) {
	q := s.req
	p := pickPair(len(q.pi.pairs), q.start, int(s.idx), int(s.attempt))
	pair := q.pi.pairs[p]
	s.lkey, s.rkey = q.lkeys[pair[0]], q.rkeys[pair[1]]
	if ep := q.pi.eps[p].Load(); ep != nil && !ep.failed() {
		return ep, nil
	}
	ep, err := t.endpoint(q.pi, pair[0], pair[1])
	if err != nil {
		return nil, err
	}
	q.pi.eps[p].Store(ep)
	return ep, nil
}

// dispatch sends one slice to the endpoint of its NIC pair for this attempt.
func (t *Transport) dispatch(s *slice) {
	ep, err := t.route(s)
	if err != nil {
		s.req.sliceDone(err)
		return
	}
	var l list
	l.push(s)
	ep.post(&l)
}

// endpoint returns the endpoint of a NIC pair with the peer, starting a new
// one (connected in the background) when there is none or the last one
// failed.
func (t *Transport) endpoint(pi *peerInfo, local, remote int) (*endpoint, error) {
	d := pi.desc
	key := epKey{instance: d.Instance, local: local, remote: pi.nics[remote].name}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errs.New(errs.Closed, "rdma", "transport closed")
	}
	if ep := t.eps[key]; ep != nil && !ep.failed() {
		return ep, nil
	}
	ep := &endpoint{t: t, key: key, nic: t.nics[local], connecting: true,
		peer: peerRef{name: d.Name, instance: d.Instance, rpc: d.RPC, nic: pi.nics[remote].name}}
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
// NIC's poller). A completion stands for every earlier work request of its
// queue pair too: the send queue of an RC queue pair completes in order,
// and only every few work requests are signaled.
func (t *Transport) complete(n *nic, id uint64, status, vendorErr uint32) {
	qs := n.qpAt(uint32(id >> 32))
	if qs == nil {
		return // its queue pair is gone: Close accounted for it
	}
	ep := qs.ep
	var err error
	if status != ibv.WCSuccess {
		err = wcError(ep, status, vendorErr)
	}
	var out outcome
	ep.mu.Lock()
	ep.completedLocked(qs, uint32(id), status, err, &out)
	ep.mu.Unlock()
	t.finish(ep, &out)
	for _, e := range n.takeStarved() {
		e.kick()
	}
}

// wcError turns a failed completion into a te error.
func wcError(ep *endpoint, status, vendorErr uint32) error {
	code := errs.PeerUnreachable
	if status == ibv.WCRemAccessErr {
		// The peer's NIC refused the rkey or range: the region was
		// unregistered (and maybe registered again) since the descriptor.
		code = errs.StaleDescriptor
	}
	return errs.New(code, "rdma", "work request on %s -> %s@%s: %s (vendor error %#x)",
		ep.nic.name, ep.peer.name, ep.peer.nic, ibv.WCStatusString(status), vendorErr)
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

// retry sends a slice that did not run to the next NIC pair, or ends it.
// A slice of a canceled request ends Canceled; one flushed because its
// endpoint was torn down for someone else's cancellation goes again
// without spending an attempt.
func (t *Transport) retry(s *slice, err error) {
	switch {
	case t.closing.Load():
		s.req.sliceDone(errs.Wrap(errs.Closed, "rdma", err, "transport closed"))
	case s.req.canceled.Load():
		s.req.sliceDone(errCanceled)
	case err == errTornDown:
		t.dispatch(s)
	case int(s.attempt) >= t.opt.Retries || !retryable(err):
		s.req.sliceDone(err)
	default:
		s.attempt++
		t.dispatch(s)
	}
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
	var left list
	for _, ep := range eps {
		ep.mu.Lock()
		if !ep.released {
			ep.released = true
			ep.destroyLocked()
		}
		ep.drainLocked(&left)
		ep.mu.Unlock()
	}
	for s := left.pop(); s != nil; s = left.pop() {
		s.req.sliceDone(closedErr)
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
