package cudaipc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/gpu"
	"github.com/tecache/te/internal/sys/nvml"
	// Links every runtime te has: Start opens each that loads.
	_ "github.com/tecache/te/internal/sys/gpu/runtimes"
	"github.com/tecache/te/internal/wire"
)

// Name is the transport's name.
const Name = "cudaipc"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// EnvDomain names the environment variable that sets this process's
// NVLink domain for multi-node NVLink; the param cudaipc.mnnvl_domain wins
// over it. Unset, the domain is read from NVML (internal/sys/nvml: the
// cluster UUID and clique id the fabric manager registered the CUDA
// devices with, "<clusterUuid hex>:<cliqueId>"); where there is none,
// fabric handles are neither exported nor imported.
const EnvDomain = "TE_MNNVL_DOMAIN"

// envBootID, for tests only, replaces the boot id this transport compares,
// so two processes of one machine act as engines on two hosts.
const envBootID = "TE_CUDAIPC_BOOT_ID"

// Options are the transport's parameters, read from the engine's Params
// ("cudaipc.close_timeout", "cudaipc.call_timeout") in Start.
type Options struct {
	// CloseTimeout bounds how long Unregister waits for a peer to confirm
	// that it closed its mapping of the buffer.
	CloseTimeout time.Duration
	// CallTimeout bounds the peer's open and release calls to an owner.
	CallTimeout time.Duration
	// Domain is the NVLink domain (EnvDomain, "cudaipc.mnnvl_domain"):
	// engines with equal domains map each other's fabric handles, on any
	// host. Empty: none.
	Domain string
}

// DefaultOptions returns 5 s for both.
func DefaultOptions() Options {
	return Options{CloseTimeout: 5 * time.Second, CallTimeout: 5 * time.Second}
}

// span is one copy of n bytes from src to dst (either may be host or device
// memory: unified addressing tells them apart).
type span struct{ dst, src, n uint64 }

// driver is the part of a GPU runtime the transport uses (gpuDriver over
// gpu.Driver); tests replace it to check the bookkeeping without a GPU.
type driver interface {
	kind() string
	devices() int
	uuid(dev int) string
	export(dev int, addr, length uint64) (export, error)
	open(dev int, h gpu.IPCHandle) (uint64, error)
	// (a driver that is also a fabricDriver moves fabric handles)
	close(dev int, base uint64) error
	// copies enqueues the spans on one stream of dev and waits for them
	// once; errs[i] says how span i ended.
	copies(dev int, spans []span) []error
	release()
}

// Transport is the same-host GPU transport. It is safe for concurrent use.
type Transport struct {
	opt  Options
	h    transport.Host
	drvs map[string]driver // by location kind: every runtime that loads
	self segment.HostID
	rpc  atomic.Pointer[string]

	// call reaches another engine's control plane (replaced in tests).
	call func(ctx context.Context, rpc string, body []byte) ([]byte, error)

	// Owner side: buffers exported, by capability key, and who opened them.
	omu     sync.Mutex
	exports map[uint64]*exported

	// Peer side: buffers this engine maps, and the handles behind them.
	// Several registered buffers may share one allocation, so one handle;
	// the driver maps a handle once per context, hence the count.
	imu     sync.Mutex
	imports map[importKey]*mapping
	hmu     sync.Mutex // serialises opening and closing handles
	handles map[handleKey]*opened

	// Goroutines the transport starts (per Submit, closing stale
	// mappings) are counted under lmu, against closed, so none starts
	// once Close waits for them.
	lmu    sync.Mutex
	wg     sync.WaitGroup
	closed atomic.Bool
	st     Stats
}

// Stats counts the transport's protocol events.
type Stats struct {
	Opened, Closed, CloseRequests, PeersGone, PeersSilent atomic.Uint64
	// Multi-node NVLink: buffers exported with a fabric handle, buffers
	// registered while a domain is set that have none (the reason is
	// logged: cuMemAlloc memory, say), and fabric handles mapped here (of
	// Opened).
	FabricExported, FabricRefused, FabricOpened atomic.Uint64
}

type exported struct {
	addr, length uint64
	openers      map[string]opener // by peer instance
}

type opener struct {
	rpc string
	pid int
}

type importKey struct {
	owner string // owner instance
	key   uint64
	kind  string // runtime of the buffer and of this side's mapping
	dev   int
}

type handleKey struct {
	owner  string
	h      gpu.IPCHandle
	kind   string
	dev    int
	fabric bool // h is a fabric handle of an allocation of size bytes
	size   uint64
}

type opened struct {
	base  uint64
	users int // buffers using this mapping
}

// mapping is one buffer of an owner mapped on the peer side.
type mapping struct {
	hk       handleKey
	ownerRPC string
	pid      uint32        // this process's pid for the owner; 0 on another host
	ready    chan struct{} // closed once the open finished (err says how)
	err      error
	base     uint64 // local address of the owner's allocation
	refs     int    // copies in flight (guarded by imu)
	closing  bool   // no new copies; being closed
}

// New returns a transport with default options; the engine starts it.
func New() *Transport {
	return &Transport{opt: DefaultOptions(), exports: map[uint64]*exported{}, imports: map[importKey]*mapping{},
		handles: map[handleKey]*opened{}}
}

// Name returns "cudaipc".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach and the memory it moves. Only GPU memory, between engines on one host.
func (t *Transport) Caps() transport.Caps {
	return transport.Caps{SameProcess: true, SameHost: true, CrossHost: t.opt.Domain != "", GPUMemory: true, Rank: 20}
}

// Stats returns the protocol counters by name (transport.StatsReporter:
// Engine.TransportStats()["cudaipc"], te_metrics' te_transport_stat).
func (t *Transport) Stats() map[string]uint64 {
	s := &t.st
	return map[string]uint64{
		"opened":          s.Opened.Load(),
		"closed":          s.Closed.Load(),
		"close_requests":  s.CloseRequests.Load(),
		"peers_gone":      s.PeersGone.Load(),
		"peers_silent":    s.PeersSilent.Load(),
		"fabric_exported": s.FabricExported.Load(),
		"fabric_refused":  s.FabricRefused.Load(),
		"fabric_opened":   s.FabricOpened.Load(),
	}
}

// Start loads every GPU runtime te has (gpu.Kinds: CUDA, HIP); without any
// that loads and sees a device it fails with TransportUnavailable and the
// reasons, and the engine runs without cudaipc.
func (t *Transport) Start(h transport.Host) error {
	for k, p := range map[string]*time.Duration{"cudaipc.close_timeout": &t.opt.CloseTimeout, "cudaipc.call_timeout": &t.opt.CallTimeout} {
		if v, ok := h.Param(k); ok {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 || d > time.Hour {
				return errs.New(errs.InvalidArgument, "cudaipc", "%s=%q is not a duration in (0, 1h]", k, v)
			}
			*p = d
		}
	}
	if t.opt.Domain == "" {
		t.opt.Domain = os.Getenv(EnvDomain)
	}
	if v, ok := h.Param("cudaipc.mnnvl_domain"); ok {
		t.opt.Domain = v
	}
	if len(t.opt.Domain) > maxDomain || strings.ContainsAny(t.opt.Domain, " \t\n") {
		return errs.New(errs.InvalidArgument, "cudaipc", "NVLink domain %.40q: at most %d characters, no spaces", t.opt.Domain, maxDomain)
	}
	self, err := hostID()
	if err != nil {
		return err
	}
	if t.drvs == nil {
		drvs, err := loadDrivers()
		if err != nil {
			return err
		}
		t.drvs = drvs
	}
	t.h, t.self = h, self
	if t.opt.Domain == "" {
		t.opt.Domain = nvlinkDomain(t.drvs, h.Logf)
	}
	if t.call == nil {
		t.call = func(ctx context.Context, rpc string, body []byte) ([]byte, error) {
			return h.Control().Call(ctx, rpc, wire.KindCUDA, body)
		}
	}
	h.Control().Handle(wire.KindCUDA, t.handle)
	return nil
}

// nvlinkDomain asks the management library (NVML) for the NVLink domain of
// the CUDA devices: "" where there is none. Why not is logged where a
// fabric should be there (a registration not finished or failed, GPUs of
// two domains), not on the many hosts that plainly have none.
func nvlinkDomain(drvs map[string]driver, logf func(string, ...any)) string {
	g, ok := drvs["cuda"].(*gpuDriver)
	if !ok {
		return ""
	}
	var buses []string
	for i := range g.devs {
		b, err := g.d.PCIBusID(i)
		if err != nil {
			return ""
		}
		buses = append(buses, b)
	}
	d, err := nvml.Domain(buses)
	switch {
	case err == nil:
		logf("te: cudaipc: NVLink domain %s (from NVML): fabric handles are exchanged with engines in it", d)
	case errs.CodeOf(err) != errs.NotSupported:
		logf("te: cudaipc: no NVLink domain, fabric handles are not used: %v", err)
	}
	return d
}

// loadDrivers opens every registered runtime that loads and sees a device.
func loadDrivers() (map[string]driver, error) {
	drvs := map[string]driver{}
	var why []string
	for _, k := range gpu.Kinds() {
		d, _, err := gpu.Load(k)
		var g *gpuDriver
		if err == nil {
			g, err = newGPUDriver(d)
		}
		if err != nil {
			why = append(why, fmt.Sprintf("%s: %v", k, err))
			continue
		}
		drvs[k] = g
	}
	if len(drvs) == 0 {
		return nil, errs.New(errs.TransportUnavailable, "cudaipc", "no GPU runtime is available (%s)", strings.Join(why, "; "))
	}
	return drvs, nil
}

func hostID() (segment.HostID, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return segment.HostID{}, errs.Wrap(errs.TransportUnavailable, "cudaipc", err, "read the boot id")
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return segment.HostID{}, errs.Wrap(errs.TransportUnavailable, "cudaipc", err, "read the pid namespace")
	}
	boot := strings.TrimSpace(string(b))
	if v := os.Getenv(envBootID); v != "" {
		boot = v
	}
	return segment.HostID{BootID: boot, PidNS: ns, Pid: os.Getpid()}, nil
}

// sameHost reports whether d's engine runs on this host, in this pid
// namespace: IPC handles open, and pids name the same processes.
func (t *Transport) sameHost(d *segment.Desc) bool {
	return d.Host != nil && d.Host.BootID == t.self.BootID && d.Host.PidNS == t.self.PidNS
}

// otherHost reports whether d says its engine runs on another host (or in
// another pid namespace). A descriptor without a host identity is taken as
// this host's, as before fabric handles: Reachable has vetted it.
func (t *Transport) otherHost(d *segment.Desc) bool {
	return d.Host != nil && !t.sameHost(d)
}

// sameDomain reports whether d's engine is in this engine's NVLink domain.
func (t *Transport) sameDomain(d *segment.Desc) bool {
	return t.opt.Domain != "" && d.Endpoints[EndpointDomain] == t.opt.Domain
}

// Describe publishes the host identity (as shm does) and learns this
// engine's control address, which peers call back on.
func (t *Transport) Describe(d *segment.Desc) {
	if d.Host == nil {
		h := t.self
		d.Host = &h
	}
	if d.RPC != "" {
		rpc := d.RPC
		t.rpc.Store(&rpc)
	}
	if t.opt.Domain != "" {
		if d.Endpoints == nil {
			d.Endpoints = map[string]string{}
		}
		d.Endpoints[EndpointDomain] = t.opt.Domain
	}
}

// Register exports a remote-accessible GPU buffer: it puts the IPC handle of
// the allocation that holds it, made by the buffer's runtime, into the
// buffer's descriptor. Host memory needs nothing. GPU memory that cannot be
// exported (VMM allocations, a range spanning two allocations, a runtime
// that did not load) is logged and left to other transports, rather than
// failing the registration.
func (t *Transport) Register(r *segment.Region) error {
	if !r.Remote || !gpu.IsDevice(r.Location.Kind) {
		return nil
	}
	drv := t.drvs[r.Location.Kind]
	if drv == nil {
		t.h.Logf("te: cudaipc: buffer [%#x,+%d) on %s is not exported: no %s runtime here", r.Addr, r.Length, r.Location, r.Location.Kind)
		return nil
	}
	e, err := drv.export(r.Location.Index, r.Addr, r.Length)
	if err == nil {
		setExport(&r.Desc, r.Location.Kind, e)
	}
	var ferr error = errs.New(errs.NotSupported, "cudaipc", "no NVLink domain set")
	if fd, ok := drv.(fabricDriver); ok && t.opt.Domain != "" {
		var fe export
		if fe, ferr = fd.exportFabric(r.Location.Index, r.Addr, r.Length); ferr == nil {
			setFabric(&r.Desc, fe)
			t.st.FabricExported.Add(1)
		} else {
			t.st.FabricRefused.Add(1)
			t.h.Logf("te: cudaipc: buffer [%#x,+%d) on %s has no fabric handle, so GPUs of other hosts reach it only through other transports: %v",
				r.Addr, r.Length, r.Location, ferr)
		}
	}
	if err != nil && ferr != nil {
		t.h.Logf("te: cudaipc: buffer [%#x,+%d) on %s is not exported: %v", r.Addr, r.Length, r.Location, err)
		return nil
	}
	t.omu.Lock()
	t.exports[r.Desc.Key] = &exported{addr: r.Addr, length: r.Length, openers: map[string]opener{}}
	t.omu.Unlock()
	return nil
}

// Unregister follows the design's unregister order for memory peers write
// without the owner checking: it tells every peer that opened the buffer's
// handle to close it and waits until each has confirmed (its copies into the
// buffer have ended and the mapping is gone) or has exited. A peer that is
// alive but does not confirm within CloseTimeout makes Unregister fail with
// Timeout: the caller must not reuse the memory yet.
func (t *Transport) Unregister(r *segment.Region) error {
	t.omu.Lock()
	ex := t.exports[r.Desc.Key]
	delete(t.exports, r.Desc.Key)
	t.omu.Unlock()
	if ex == nil {
		return nil
	}
	return t.revoke(r.Desc.Key, ex)
}

// revoke runs the close protocol with every opener of ex, in parallel.
func (t *Transport) revoke(key uint64, ex *exported) error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errl []error
	)
	body := (&msg{Op: opClose, Key: key, Instance: t.h.Instance()}).encode()
	for inst, o := range ex.openers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.st.CloseRequests.Add(1)
			ctx, cancel := context.WithTimeout(context.Background(), t.opt.CloseTimeout)
			rep, err := t.call(ctx, o.rpc, body)
			cancel()
			if err == nil {
				_, err = checkAck(rep, opClose)
			}
			if err == nil {
				return
			}
			if gone(o.pid) {
				t.st.PeersGone.Add(1) // its mappings died with it
				return
			}
			t.st.PeersSilent.Add(1)
			mu.Lock()
			errl = append(errl, errs.Wrap(errs.Timeout, "cudaipc", err,
				"peer %s (pid %d) did not confirm closing its mapping of [%#x,+%d)", inst, o.pid, ex.addr, ex.length).
				WithHint("the peer may still write into this memory: do not free or reuse it yet"))
			mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(errl...)
}

// gone reports whether process pid has exited (same pid namespace).
func gone(pid int) bool {
	if pid <= 0 {
		return false
	}
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// Reachable says yes for this engine itself, for engines on this host in
// this pid namespace (their descriptor lists cudaipc only if they have CUDA)
// and for engines of any host in this engine's NVLink domain (whose buffers
// it then reaches through fabric handles only).
func (t *Transport) Reachable(d *segment.Desc) error {
	if d.Instance != "" && d.Instance == t.h.Instance() {
		return nil
	}
	if t.sameDomain(d) && d.RPC != "" && d.Instance != "" && !t.sameHost(d) {
		return nil
	}
	h := d.Host
	switch {
	case h == nil:
		return errs.New(errs.TransportUnavailable, "cudaipc", "segment %q publishes no host identity", d.Name)
	case h.BootID != t.self.BootID:
		return errs.New(errs.TransportUnavailable, "cudaipc", "segment %q runs on another host (boot id differs) outside this engine's NVLink domain", d.Name)
	case h.PidNS != t.self.PidNS:
		return errs.New(errs.TransportUnavailable, "cudaipc", "segment %q runs in another pid namespace", d.Name)
	case d.RPC == "" || d.Instance == "":
		return errs.New(errs.TransportUnavailable, "cudaipc", "segment %q publishes no control address or instance", d.Name)
	}
	return nil
}

// DeviceMemory reports whether cudaipc can serve a request from local to
// buf of d: in this engine any memory of one runtime (a copy with unified
// addressing), in another process only a buffer whose owner exported its
// handle, with a runtime here of the same kind. Device memory of two
// runtimes never pairs: neither runtime can copy the other's memory.
func (t *Transport) DeviceMemory(d *segment.Desc, buf *segment.BufferDesc, local *segment.Region) bool {
	lk := ""
	if local != nil && gpu.IsDevice(local.Location.Kind) {
		lk = local.Location.Kind
	}
	rk := kindOf(buf)
	if d.Instance != "" && d.Instance == t.h.Instance() {
		_, err := t.pairKind(lk, rk)
		return err == nil
	}
	if !t.otherHost(d) {
		kind, _, ok, err := exportOf(buf)
		if ok && err == nil && t.drvs[kind] != nil && (lk == "" || lk == kind) {
			return true
		}
	}
	if t.sameDomain(d) && (lk == "" || lk == "cuda") {
		_, ok, err := fabricOf(buf)
		_, fd := t.drvs["cuda"].(fabricDriver)
		return ok && err == nil && fd
	}
	return false
}

// pairKind is the runtime that copies between memory of kinds a and b (""
// for host memory): the one both name, or any that loaded for host to host.
func (t *Transport) pairKind(a, b string) (string, error) {
	switch {
	case a != "" && b != "" && a != b:
		return "", errs.New(errs.NotSupported, "cudaipc", "%s memory and %s memory do not pair: no runtime copies between them", a, b)
	case a == "" && b == "":
		for _, k := range gpu.Kinds() {
			if t.drvs[k] != nil {
				return k, nil
			}
		}
		return "", errs.New(errs.TransportUnavailable, "cudaipc", "no GPU runtime")
	case a == "":
		a = b
	}
	if t.drvs[a] == nil {
		return "", errs.New(errs.NotSupported, "cudaipc", "%s memory, but no %s runtime in this process", a, a)
	}
	return a, nil
}

// Submit copies the requests on the GPU: one goroutine per call enqueues
// every copy of the call on a stream per device and waits once, so a batch
// of small KV blocks costs one synchronisation, not one per block.
//
// The goroutine reaches each request through the transport's own state,
// claimed first: Cancel may have completed a request before the goroutine
// runs, and the engine may have reset its slot since (Batch.Reset), so an
// unclaimed request's slot is never read.
func (t *Transport) Submit(in []transport.Request) {
	states := make([]reqState, len(in)) // one allocation for the call
	for i := range in {
		states[i].r, states[i].tk = &in[i], in[i].Ticket()
		in[i].Priv = &states[i]
	}
	if !t.spawn(func() { t.run(states) }) {
		for i := range states {
			if states[i].claim() {
				states[i].tk.Complete(errs.New(errs.Closed, "cudaipc", "transport closed"))
			}
		}
	}
}

// spawn runs f on a goroutine Close waits for, unless Close has begun.
func (t *Transport) spawn(f func()) bool {
	t.lmu.Lock()
	if t.closed.Load() {
		t.lmu.Unlock()
		return false
	}
	t.wg.Add(1)
	t.lmu.Unlock()
	go func() {
		defer t.wg.Done()
		f()
	}()
	return true
}

// prepared is a request ready to copy: its span, the runtime and device
// that copy it and what to release once the copy ended.
type prepared struct {
	s       *reqState
	at      devKey
	sp      span
	release func()
}

// devKey is a device of a runtime.
type devKey struct {
	kind string
	dev  int
}

func (t *Transport) run(states []reqState) {
	byDev := map[devKey][]prepared{}
	var alive ownerCheck
	for i := range states {
		s := &states[i]
		if !s.claim() {
			continue // Cancel completed it: its slot is not ours to read
		}
		p, err := t.prepare(s.r, &alive)
		if err != nil {
			s.tk.Complete(err)
			continue
		}
		p.s = s
		byDev[p.at] = append(byDev[p.at], p)
	}
	for dev, ps := range byDev {
		spans := make([]span, len(ps))
		for i, p := range ps {
			spans[i] = p.sp
		}
		errl := t.drvs[dev.kind].copies(dev.dev, spans)
		for i, p := range ps {
			// Release before Complete: the copy has ended, and an Unregister
			// waiting on the mapping need not wait for the caller.
			p.release()
			p.s.tk.Complete(errl[i])
		}
	}
}

// ownerCheck remembers, for one run of copies, whether the last owner looked
// at is alive (a run mostly targets one owner).
type ownerCheck struct {
	inst string
	err  error
}

// ownerAlive fails a copy into another engine whose process has exited: the
// mapping outlives it, and a WRITE into it would complete into memory
// nobody owns any more. The owner's mappings are closed.
func (t *Transport) ownerAlive(c *ownerCheck, d *segment.Desc) error {
	if c.inst != "" && c.inst == d.Instance {
		return c.err
	}
	c.inst, c.err = d.Instance, nil
	if d.Host != nil && gone(d.Host.Pid) {
		c.err = errs.New(errs.PeerUnreachable, "cudaipc", "the process of segment %q (pid %d) has exited", d.Name, d.Host.Pid)
		t.forgetOwner(d.Instance)
	}
	return c.err
}

// forgetOwner closes, off the caller's goroutine, every mapping of an owner
// that has exited.
func (t *Transport) forgetOwner(inst string) {
	var keys []uint64
	t.imu.Lock()
	for k, m := range t.imports {
		if k.owner == inst && !m.closing {
			keys = append(keys, k.key)
		}
	}
	t.imu.Unlock()
	for _, key := range keys {
		t.spawn(func() {
			ctx, cancel := context.WithTimeout(context.Background(), t.opt.CloseTimeout)
			defer cancel()
			t.closeMappings(ctx, inst, key)
		})
	}
}

// prepare resolves a request's addresses: the target in this engine, or in
// the owner's allocation mapped here (opening its handle on first use).
func (t *Transport) prepare(r *transport.Request, alive *ownerCheck) (prepared, error) {
	if t.closed.Load() {
		return prepared{}, errs.New(errs.Closed, "cudaipc", "transport closed")
	}
	dev, lk := -1, ""
	if r.Region != nil && gpu.IsDevice(r.Region.Location.Kind) {
		dev, lk = r.Region.Location.Index, r.Region.Location.Kind
	}
	var kind string
	var remote uint64
	var release func()
	if r.Peer.Instance == t.h.Instance() {
		// This engine: the target address is ours; count the access so
		// Unregister waits for it.
		reg, err := t.h.Registry().Acquire(r.Remote, r.Length, r.Key, true,
			segment.Caller{Name: t.h.SegmentName(), Instance: t.h.Instance(), Known: true})
		if err != nil {
			return prepared{}, err
		}
		rk := ""
		if gpu.IsDevice(reg.Location.Kind) {
			rk = reg.Location.Kind
		}
		if kind, err = t.pairKind(lk, rk); err != nil {
			reg.Release()
			return prepared{}, err
		}
		remote, release = r.Remote, reg.Release
		if dev < 0 && rk != "" {
			dev = reg.Location.Index
		}
	} else {
		k, e, ok, err := exportOf(r.Buffer)
		if err != nil {
			return prepared{}, err
		}
		local := !t.otherHost(r.Peer)
		if !ok || !local {
			// Another host, or memory with no IPC handle (VMM): the
			// fabric handle, in one NVLink domain.
			fe, fok, ferr := fabricOf(r.Buffer)
			switch {
			case ferr != nil:
				return prepared{}, ferr
			case !fok || !t.sameDomain(r.Peer):
				return prepared{}, errs.New(errs.NotSupported, "cudaipc", "buffer %s at %#x of %q has no IPC handle this engine can open and no fabric handle of its NVLink domain",
					r.Buffer.Name, r.Buffer.Addr, r.Peer.Name)
			}
			k, e = "cuda", fe
		}
		// The handle opens only with the runtime that made it, and only
		// into memory of that runtime (or host memory) on this side.
		if kind, err = t.pairKind(lk, k); err != nil {
			return prepared{}, err
		}
		if local {
			if err := t.ownerAlive(alive, r.Peer); err != nil {
				return prepared{}, err
			}
		}
		if dev < 0 {
			dev = t.deviceFor(kind, e.UUID)
		}
		if dev < 0 {
			dev = 0
		}
		m, err := t.acquire(r.Peer, r.Buffer, kind, e, dev)
		if err != nil {
			return prepared{}, err
		}
		remote, release = m.base+e.Offset+(r.Remote-r.Buffer.Addr), func() { t.releaseMapping(m) }
	}
	if dev < 0 {
		dev = 0
	}
	sp := span{dst: remote, src: r.Local, n: r.Length}
	if r.Op == transport.Read {
		sp = span{dst: r.Local, src: remote, n: r.Length}
	}
	return prepared{at: devKey{kind, dev}, sp: sp, release: release}, nil
}

// deviceFor finds the local ordinal of runtime kind's GPU with uuid, or -1.
func (t *Transport) deviceFor(kind, uuid string) int {
	drv := t.drvs[kind]
	if uuid == "" || drv == nil {
		return -1
	}
	for i := 0; i < drv.devices(); i++ {
		if drv.uuid(i) == uuid {
			return i
		}
	}
	return -1
}

// acquire returns the mapping of the owner's buffer on device dev, opening
// the handle on first use, and counts a copy in flight on it. The owner is
// told before the handle is opened, so its Unregister always knows whom to
// ask; a close request that arrives meanwhile waits for the open to finish.
func (t *Transport) acquire(d *segment.Desc, buf *segment.BufferDesc, kind string, e export, dev int) (*mapping, error) {
	k := importKey{owner: d.Instance, key: buf.Key, kind: kind, dev: dev}
	t.imu.Lock()
	m := t.imports[k]
	fresh := m == nil
	var stale []importKey
	if fresh {
		m = &mapping{ownerRPC: d.RPC, ready: make(chan struct{})}
		if !t.otherHost(d) {
			// The owner checks this pid to tell an exited peer from a
			// silent one; on another host it names nothing there.
			m.pid = uint32(t.self.Pid)
		}
		t.imports[k] = m
		// Mappings of an earlier instance of the engine at this address: it
		// restarted, and its memory stays allocated while we map it.
		for ok, om := range t.imports {
			if om.ownerRPC == d.RPC && ok.owner != d.Instance {
				stale = append(stale, ok)
			}
		}
	}
	t.imu.Unlock()
	for _, sk := range stale {
		// After Close began, Close closes every mapping itself.
		t.spawn(func() {
			ctx, cancel := context.WithTimeout(context.Background(), t.opt.CloseTimeout)
			defer cancel()
			t.closeMappings(ctx, sk.owner, sk.key)
		})
	}
	if fresh {
		t.open(k, m, buf, e)
	}
	<-m.ready
	t.imu.Lock()
	defer t.imu.Unlock()
	switch {
	case m.err != nil:
		return nil, m.err
	case m.closing:
		return nil, errs.New(errs.StaleDescriptor, "cudaipc", "buffer at %#x of %q is being unregistered", buf.Addr, d.Name)
	}
	m.refs++
	return m, nil
}

func (t *Transport) open(k importKey, m *mapping, buf *segment.BufferDesc, e export) {
	defer close(m.ready)
	fail := func(err error) {
		t.imu.Lock()
		m.err = err
		if t.imports[k] == m {
			delete(t.imports, k) // a later request tries again
		}
		t.imu.Unlock()
	}
	rpc := t.rpc.Load()
	if rpc == nil {
		fail(errs.New(errs.Internal, "cudaipc", "this engine's control address is not known yet"))
		return
	}
	req := msg{Op: opOpen, Key: buf.Key, Addr: buf.Addr, Length: buf.Length, Pid: m.pid, Instance: t.h.Instance(), RPC: *rpc}
	ctx, cancel := context.WithTimeout(context.Background(), t.opt.CallTimeout)
	rep, err := t.call(ctx, m.ownerRPC, req.encode())
	cancel()
	if err == nil {
		_, err = checkAck(rep, opOpen)
	}
	if err != nil {
		fail(errs.Wrap(errs.CodeOf(err), "cudaipc", err, "owner refused access to buffer at %#x", buf.Addr))
		return
	}
	hk := handleKey{owner: k.owner, h: e.Handle, kind: k.kind, dev: k.dev, fabric: e.Fabric, size: e.Size}
	base, err := t.openHandle(hk)
	if err != nil {
		t.releaseOwner(m.ownerRPC, k.key)
		fail(err)
		return
	}
	t.imu.Lock()
	m.base, m.hk = base, hk
	t.imu.Unlock()
}

// openHandle maps a handle, or counts one more user of its mapping.
func (t *Transport) openHandle(hk handleKey) (uint64, error) {
	t.hmu.Lock()
	defer t.hmu.Unlock()
	if o := t.handles[hk]; o != nil {
		o.users++
		return o.base, nil
	}
	var base uint64
	var err error
	if hk.fabric {
		fd, ok := t.drvs[hk.kind].(fabricDriver)
		if !ok {
			return 0, errs.New(errs.NotSupported, "cudaipc", "the %s runtime here has no fabric handles", hk.kind)
		}
		base, err = fd.openFabric(hk.dev, hk.h, hk.size)
	} else {
		base, err = t.drvs[hk.kind].open(hk.dev, hk.h)
	}
	if err != nil {
		return 0, err
	}
	t.st.Opened.Add(1)
	if hk.fabric {
		t.st.FabricOpened.Add(1)
	}
	t.handles[hk] = &opened{base: base, users: 1}
	return base, nil
}

// closeHandle drops one user of a mapping and unmaps it after the last.
func (t *Transport) closeHandle(hk handleKey) error {
	t.hmu.Lock()
	defer t.hmu.Unlock()
	o := t.handles[hk]
	if o == nil {
		return nil
	}
	if o.users--; o.users > 0 {
		return nil
	}
	delete(t.handles, hk)
	t.st.Closed.Add(1)
	if hk.fabric {
		return t.drvs[hk.kind].(fabricDriver).closeFabric(hk.dev, o.base, hk.size)
	}
	return t.drvs[hk.kind].close(hk.dev, o.base)
}

func (t *Transport) releaseMapping(m *mapping) {
	t.imu.Lock()
	m.refs--
	t.imu.Unlock()
}

// releaseOwner tells an owner, best effort, that this engine no longer maps
// the buffer.
func (t *Transport) releaseOwner(rpc string, key uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), t.opt.CallTimeout)
	defer cancel()
	t.call(ctx, rpc, (&msg{Op: opRelease, Key: key, Instance: t.h.Instance()}).encode())
}

// handle serves kind wire.KindCUDA.
func (t *Transport) handle(ctx context.Context, body []byte) ([]byte, error) {
	m, err := decode(body)
	if err != nil {
		return nil, err
	}
	// Every op acts on the instance the body names (the opener recorded,
	// the owner whose mappings close): with a secret it must be the one
	// the session proved, or an engine holding the secret could close
	// another's mappings or speak for it.
	if by := transport.CallerOf(ctx); by.Known && by.Instance != m.Instance {
		return nil, errs.New(errs.Unauthenticated, "cudaipc",
			"message names instance %s, but its session proved instance %s (segment %q)", m.Instance, by.Instance, by.Name)
	}
	switch m.Op {
	case opOpen:
		return t.handleOpen(m)
	case opClose:
		n, err := t.closeMappings(ctx, m.Instance, m.Key)
		if err != nil {
			return nil, err
		}
		return ack(opClose, uint32(n)), nil
	default: // opRelease
		t.omu.Lock()
		if ex := t.exports[m.Key]; ex != nil {
			delete(ex.openers, m.Instance)
		}
		t.omu.Unlock()
		return ack(opRelease, 0), nil
	}
}

// handleOpen records a peer that is about to open a buffer's handle, after
// checking the buffer is still registered under the key the peer holds.
func (t *Transport) handleOpen(m *msg) ([]byte, error) {
	if m.Instance == "" || m.RPC == "" {
		return nil, errs.New(errs.InvalidArgument, "cudaipc", "open without an instance or a control address")
	}
	if m.Instance == t.h.Instance() {
		return nil, errs.New(errs.InvalidArgument, "cudaipc", "an engine does not open its own handles")
	}
	// Checking the export under omu orders this against Unregister, which
	// removes the export under omu before it collects the openers.
	t.omu.Lock()
	defer t.omu.Unlock()
	ex := t.exports[m.Key]
	if ex == nil || ex.addr != m.Addr || ex.length != m.Length {
		return nil, errs.New(errs.StaleDescriptor, "cudaipc", "no exported buffer [%#x,+%d) under this key", m.Addr, m.Length)
	}
	ex.openers[m.Instance] = opener{rpc: m.RPC, pid: int(m.Pid)}
	return ack(opOpen, 0), nil
}

// closeMappings closes this engine's mappings of owner's buffer key (on
// every device): new copies are refused at once, copies in flight finish,
// then each handle is closed. It returns how many it closed.
func (t *Transport) closeMappings(ctx context.Context, owner string, key uint64) (int, error) {
	var ms []*mapping
	var ks []importKey
	t.imu.Lock()
	for k, m := range t.imports {
		if k.owner == owner && k.key == key {
			m.closing = true
			ms = append(ms, m)
			ks = append(ks, k)
		}
	}
	t.imu.Unlock()
	n := 0
	var first error
	for i, m := range ms {
		select {
		case <-m.ready:
		case <-ctx.Done():
			return n, errs.Wrap(errs.Timeout, "cudaipc", ctx.Err(), "a handle is still being opened")
		}
		for d := time.Microsecond; ; {
			t.imu.Lock()
			busy := m.refs > 0
			t.imu.Unlock()
			if !busy {
				break
			}
			select {
			case <-ctx.Done():
				return n, errs.Wrap(errs.Timeout, "cudaipc", ctx.Err(), "copies on a mapping are still in flight")
			case <-time.After(d):
			}
			if d < time.Millisecond {
				d *= 2
			}
		}
		t.imu.Lock()
		if t.imports[ks[i]] == m {
			delete(t.imports, ks[i])
		}
		t.imu.Unlock()
		if m.err == nil && m.base != 0 {
			if err := t.closeHandle(m.hk); err != nil && first == nil {
				first = err
			}
			n++
		}
	}
	return n, first
}

// Close fails new requests, waits for the copies in flight, closes every
// handle this engine opened (telling their owners) and runs the close
// protocol for every buffer it exported, so no peer keeps a mapping of
// memory the application may free after Close.
func (t *Transport) Close() error {
	if t.drvs == nil {
		return nil
	}
	t.lmu.Lock()
	if t.closed.Load() {
		t.lmu.Unlock()
		return nil
	}
	t.closed.Store(true)
	t.lmu.Unlock()
	// Requests not yet enqueued fail (Closed); copies enqueued end when
	// their stream synchronises.
	t.wg.Wait()
	type own struct {
		owner, rpc string
		key        uint64
	}
	seen := map[own]bool{}
	t.imu.Lock()
	for k, m := range t.imports {
		seen[own{k.owner, m.ownerRPC, k.key}] = true
	}
	t.imu.Unlock()
	// Owners and peers are told in parallel: each call is bounded by a
	// timeout, and Close must not add them up.
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	keep := func(err error) {
		mu.Lock()
		if err != nil && first == nil {
			first = err
		}
		mu.Unlock()
	}
	for o := range seen {
		ctx, cancel := context.WithTimeout(context.Background(), t.opt.CloseTimeout)
		_, err := t.closeMappings(ctx, o.owner, o.key)
		cancel()
		keep(err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.releaseOwner(o.rpc, o.key)
		}()
	}
	t.omu.Lock()
	exports := t.exports
	t.exports = map[uint64]*exported{}
	t.omu.Unlock()
	for key, ex := range exports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			keep(t.revoke(key, ex))
		}()
	}
	wg.Wait()
	for _, d := range t.drvs {
		d.release()
	}
	return first
}
