package shm

import (
	"context"
	"crypto/rand"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// Name is the transport's name.
const Name = "shm"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// Options are the transport's parameters, read from the engine's Params
// ("shm.lease", "shm.revoke_timeout", "shm.call_timeout", "shm.workers",
// "shm.job_bytes") in Start.
type Options struct {
	// Lease is how long a peer may access this engine's memory after the
	// owner last confirmed its session. It bounds how long Unregister waits
	// for a peer that does not acknowledge a revocation.
	Lease time.Duration
	// RevokeTimeout is how long the owner waits for a peer's acknowledgement
	// before it cuts the peer off.
	RevokeTimeout time.Duration
	// CallTimeout bounds the peer's control calls (attach, validate).
	CallTimeout time.Duration
	// Workers is the number of goroutines that make the copies.
	Workers int
	// JobBytes bounds the bytes one worker moves before it looks at the
	// queue again; requests larger than that are cut and spread over workers.
	JobBytes uint64
}

// DefaultOptions returns the defaults: a 5 s lease, 2 s to acknowledge a
// revocation, one worker per core up to 4, jobs of 8 MiB.
func DefaultOptions() Options {
	return Options{
		Lease:         5 * time.Second,
		RevokeTimeout: 2 * time.Second,
		CallTimeout:   5 * time.Second,
		Workers:       max(1, min(runtime.GOMAXPROCS(0), 4)),
		JobBytes:      8 << 20,
	}
}

// leaseSlack is added to a lease before the owner counts it as lapsed: a
// copy the peer started just before its lease ended is still finishing.
const leaseSlack = 250 * time.Millisecond

func parseOptions(h transport.Host) (Options, error) {
	o := DefaultOptions()
	dur := func(key string, dst *time.Duration) error {
		if v, ok := h.Param(key); ok {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > time.Hour {
				return errs.New(errs.InvalidArgument, "shm", "%s=%q is not a duration in (0, 1h]", key, v)
			}
			*dst = d
		}
		return nil
	}
	for k, p := range map[string]*time.Duration{"shm.lease": &o.Lease, "shm.revoke_timeout": &o.RevokeTimeout, "shm.call_timeout": &o.CallTimeout} {
		if err := dur(k, p); err != nil {
			return o, err
		}
	}
	if v, ok := h.Param("shm.workers"); ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 256 {
			return o, errs.New(errs.InvalidArgument, "shm", "shm.workers=%q is not in 1..256", v)
		}
		o.Workers = n
	}
	if v, ok := h.Param("shm.job_bytes"); ok {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n < 4096 || n > 1<<30 {
			return o, errs.New(errs.InvalidArgument, "shm", "shm.job_bytes=%q is not in 4096..1GiB", v)
		}
		o.JobBytes = n
	}
	return o, nil
}

// counters are the transport's statistics.
type counters struct {
	attached, attachFailed, probeRefused     atomic.Uint64
	validations, renewals, staleRefused      atomic.Uint64
	revokesSent, revokesAcked, peersCutOff   atomic.Uint64
	revokesReceived, syscalls, shortSyscalls atomic.Uint64
	bytesWritten, bytesRead, sessionsOpen    atomic.Int64
}

// Transport is the same-host transport. Create it with New (or let the engine
// install it); it is safe for concurrent use.
type Transport struct {
	opt   Options
	h     transport.Host
	self  segment.HostID
	rpc   atomic.Pointer[string] // this engine's control address
	reach atomic.Pointer[reachable]
	st    counters

	ctx    context.Context // ends with Close: aborts the workers' calls
	cancel context.CancelFunc

	// Initiator side: the owners this engine accesses, by engine instance.
	omu    sync.Mutex
	owners map[string]*owner

	// Owner side: the peers that may access this engine's memory.
	pmu   sync.Mutex
	peers map[uint64]*peer // by session
	probe []byte           // one page holding token, for peers to read
	token [tokenLen]byte

	mu     sync.RWMutex // closed against copies in Submit's caller
	closed bool
	shut   atomic.Bool // closed, for attach and copies, which must not wait on mu

	// The jobs queued for the workers: unbounded, so Submit never waits.
	qmu     sync.Mutex
	qcond   *sync.Cond // signalled when jobs arrive or Close starts
	queue   []*job
	qclosed bool

	started bool
	wg      sync.WaitGroup
	vms     sync.Pool // Movers for jobs run in Submit's caller

	spec Spec // name, caps, control kind and medium
}

// New returns a transport with default options; the engine calls Start.
func New() *Transport { return &Transport{opt: DefaultOptions(), spec: shmSpec()} }

// Name returns "shm".
func (t *Transport) Name() string { return t.spec.Name }

// Caps declares the transport's reach and the memory it moves.
func (t *Transport) Caps() transport.Caps {
	return t.spec.Caps
}

// Options returns the options in force (after Start, the engine's params).
func (t *Transport) Options() Options { return t.opt }

// Start reads this process's identity, maps the probe page, installs the
// control handler and starts the workers. It fails (and the engine goes on
// without shm) where /proc does not tell the boot id or pid namespace.
func (t *Transport) Start(h transport.Host) error {
	opt, err := parseOptions(h)
	if err != nil {
		return err
	}
	self, err := hostID()
	if err != nil {
		return err
	}
	probe, err := mem.Alloc(4096)
	if err != nil {
		return err
	}
	if _, err := rand.Read(t.token[:]); err != nil {
		mem.Free(probe)
		return errs.Wrap(errs.Internal, "shm", err, "probe token")
	}
	copy(probe, t.token[:])
	t.opt, t.h, t.self, t.probe = opt, h, self, probe
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.owners = map[string]*owner{}
	t.peers = map[uint64]*peer{}
	t.qcond = sync.NewCond(&t.qmu)
	t.started = true
	t.vms.New = func() any { return t.spec.Medium.NewMover() }
	h.Control().Handle(t.spec.Kind, t.handle)
	for i := 0; i < opt.Workers; i++ {
		t.wg.Add(1)
		go t.worker()
	}
	return nil
}

// Describe publishes where this engine runs: boot id, pid namespace, pid.
func (t *Transport) Describe(d *segment.Desc) {
	h := t.self
	d.Host = &h
	if d.RPC != "" {
		rpc := d.RPC
		t.rpc.Store(&rpc)
	}
}

// Register needs no state: a peer learns of a buffer when it first uses it
// (validate), under the buffer's capability key.
func (t *Transport) Register(*segment.Region) error { return nil }

// Unregister tells every peer that was granted r, or a window over r, to
// stop using it and waits until each has acknowledged (its accesses to r
// have ended) or, for a peer that does not answer within RevokeTimeout,
// until that peer is cut off and its lease has lapsed. A window's grant
// dies with the memory under it: a peer keeps no key that reaches r, even
// one nobody revoked. See the package documentation for what that bound
// does and does not cover.
func (t *Transport) Unregister(r *segment.Region) error {
	if !r.Remote {
		return nil
	}
	keys := []item{{Key: r.Desc.Key, Addr: r.Addr, Len: r.Length}}
	if r.Parent() == nil {
		for _, w := range t.h.Registry().WindowsOver(r) {
			keys = append(keys, item{Key: w.Desc.Key, Addr: w.Addr, Len: w.Length})
		}
	}
	t.pmu.Lock()
	var holders []*peer
	granted := map[*peer][]item{}
	for _, p := range t.peers {
		for _, it := range keys {
			if _, ok := p.grants[it.Key]; ok {
				delete(p.grants, it.Key)
				if granted[p] == nil {
					holders = append(holders, p)
				}
				granted[p] = append(granted[p], it)
			}
		}
	}
	t.pmu.Unlock()
	// One revocation per peer carries every key.
	t.revokeAll(holders, func(p *peer) []item { return granted[p] })
	return nil
}

// RevokeWindow tells every peer granted the window's key to stop using it
// and returns once each acknowledged, exited, or was cut off with its lease
// lapsed (transport.WindowRevoker).
func (t *Transport) RevokeWindow(r *segment.Region) error {
	return t.Unregister(r)
}

// Stats returns the transport's counters by name.
func (t *Transport) Stats() map[string]uint64 {
	t.pmu.Lock()
	peers := len(t.peers)
	t.pmu.Unlock()
	s := &t.st
	return map[string]uint64{
		"attached":         s.attached.Load(),
		"attach_failed":    s.attachFailed.Load(),
		"probe_refused":    s.probeRefused.Load(),
		"validations":      s.validations.Load(),
		"lease_renewals":   s.renewals.Load(),
		"stale_refused":    s.staleRefused.Load(),
		"revokes_sent":     s.revokesSent.Load(),
		"revokes_acked":    s.revokesAcked.Load(),
		"peers_cut_off":    s.peersCutOff.Load(),
		"revokes_received": s.revokesReceived.Load(),
		"syscalls":         s.syscalls.Load(),
		"short_syscalls":   s.shortSyscalls.Load(),
		"bytes_written":    uint64(s.bytesWritten.Load()),
		"bytes_read":       uint64(s.bytesRead.Load()),
		"sessions_open":    uint64(max(0, s.sessionsOpen.Load())),
		"peers_attached":   uint64(peers),
	}
}

// Reachable says whether the peer runs on this host, in this pid namespace,
// in another process, and lets this process read its memory: the first call
// for a peer attaches to it and reads its probe token with
// process_vm_readv. A refusal is remembered for that peer, logged once and
// counted, so the engine falls back to the next transport.
func (t *Transport) Reachable(d *segment.Desc) error {
	// A request with a transport hint asks again for every request: answer
	// the last descriptor seen without locks while its owner is usable.
	if c := t.reach.Load(); c != nil && c.d == d && !c.o.dead.Load() {
		return nil
	}
	if err := t.sameHost(d); err != nil {
		return err
	}
	o := t.ownerFor(d)
	if err := o.attach(t); err != nil {
		return err
	}
	t.reach.Store(&reachable{d, o})
	return nil
}

// reachable remembers the last descriptor Reachable accepted.
type reachable struct {
	d *segment.Desc
	o *owner
}

// sameHost says whether the medium reaches the peer d describes, and that d
// publishes what a session needs.
func (t *Transport) sameHost(d *segment.Desc) error {
	if d.RPC == "" || d.Instance == "" {
		return errs.New(errs.TransportUnavailable, t.spec.Name, "segment %q publishes no control address or instance", d.Name)
	}
	return t.spec.Medium.Reach(t.self, d)
}

// Close fails the queued requests, waits for the copies in progress, detaches
// from the owners this engine accessed and revokes every grant it gave.
func (t *Transport) Close() error {
	if !t.started {
		return nil // never started
	}
	// Abort control calls in progress first, and make the copies stop at
	// their next system call.
	if t.shut.Swap(true) {
		return nil
	}
	t.cancel()
	t.mu.Lock() // waits for a copy in Submit's caller
	t.closed = true
	t.mu.Unlock()
	t.qmu.Lock()
	t.qclosed = true
	queued := t.queue
	t.queue = nil
	t.qmu.Unlock()
	t.qcond.Broadcast()
	for _, j := range queued {
		j.failAll(errClosed)
	}
	// Each worker ends the job it holds (its remaining spans fail with
	// Closed at the next system call) and exits: after this no copy runs.
	t.wg.Wait()
	t.detachAll()

	// Owner side: nobody may go on writing into memory the caller frees
	// after Close.
	t.pmu.Lock()
	var holders []*peer
	granted := map[*peer][]item{}
	for _, p := range t.peers {
		holders = append(holders, p)
		for k := range p.grants {
			granted[p] = append(granted[p], item{Key: k})
		}
	}
	t.peers = nil
	t.pmu.Unlock()
	t.revokeAll(holders, func(p *peer) []item { return granted[p] })
	for _, p := range holders {
		p.closeFd()
	}
	mem.Free(t.probe)
	return nil
}

// handle serves wire.KindShm calls: the owner side (attach, validate,
// detach) and the initiator side (revoke).
func (t *Transport) handle(ctx context.Context, body []byte) ([]byte, error) {
	switch opOf(body) {
	case opAttach:
		return t.handleAttach(ctx, body)
	case opValidate:
		return t.handleValidate(ctx, body)
	case opDetach:
		return t.handleDetach(ctx, body)
	case opRevoke:
		return t.handleRevoke(ctx, body)
	}
	return nil, errs.New(errs.Protocol, "shm", "unknown shm message %d", opOf(body))
}

func (t *Transport) call(ctx context.Context, rpc string, body []byte) ([]byte, error) {
	return t.h.Control().Call(ctx, rpc, t.spec.Kind, body)
}

// pidfdExited reports whether the process behind a pidfd has exited.
func pidfdExited(fd int) bool {
	if fd < 0 {
		return false
	}
	p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, err := unix.Poll(p, 0)
	return err == nil && n > 0
}
