package engine

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/internal/ctrl"
	"github.com/tecache/te/engine/meta"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/wire"
)

// Engine is one te instance: it owns registered memory, publishes it as a
// segment, opens peers' segments and moves bytes between them. All methods
// are safe for concurrent use.
type Engine struct {
	cfg      Config
	name     string
	instance string
	hostname string
	rpcAddr  string
	p2p      bool
	store    meta.Store

	reg   *segment.Registry
	regMu sync.Mutex // serialises register/unregister and publication

	transports []transport.Transport // rank order: selection tries them so
	byName     map[string]transport.Transport

	// reachEpoch grows when a transport says its Reachable answers
	// changed; cached transport choices older than it are made again.
	reachEpoch atomic.Uint64

	ctrl *ctrl.Plane // the control plane: handlers here, connections there
	desc atomic.Pointer[segment.Desc]
	// own is the descriptor this engine's own requests resolve against:
	// desc plus the private storage buffers (RegisterFile without
	// Remote), which no peer is shown. It is desc itself when there are
	// none.
	own     atomic.Pointer[segment.Desc]
	version atomic.Uint64

	segMu sync.Mutex
	segs  map[string]*segState

	batchMu sync.Mutex
	batches map[*Batch]struct{}

	nq notifyQueue
	np notifyPeers // which peers take NotifyOnce (notify.go)

	secret  *peerauth.Secret            // nil: peers are not authenticated
	descEnc atomic.Pointer[encodedDesc] // the last descriptor served, encoded once

	stats  stats
	reaper reaper
	mc     *mooncakeState // Mooncake interop (mooncake.go)

	envParams   map[string]string // transport parameter -> the variable that set it (env.go)
	paramsAsked sync.Map          // parameters a transport asked for
	metrics     metricsState      // histograms and the /metrics listener (metrics.go)

	closed    atomic.Bool
	closeOnce sync.Once
	// handMu orders a submit handing its requests to the transports (R)
	// against Close (W): once Close holds it, no request reaches a
	// transport, so nothing a transport moves can start after Close.
	handMu sync.RWMutex
	lifeMu sync.Mutex // orders wg.Add against Close's wg.Wait
	wg     sync.WaitGroup
	done   chan struct{}
}

// goTracked runs f in a goroutine Close waits for; it reports false (and does
// not run f) once the engine is closing.
func (e *Engine) goTracked(f func()) bool {
	e.lifeMu.Lock()
	if e.closed.Load() {
		e.lifeMu.Unlock()
		return false
	}
	e.wg.Add(1)
	e.lifeMu.Unlock()
	go func() {
		defer e.wg.Done()
		f()
	}()
	return true
}

// New starts an engine: it loads the cluster secret, binds the RPC listener
// (on the advertised host unless ListenAddr says otherwise), starts the
// transports and publishes an empty segment.
func New(cfg Config) (_ *Engine, err error) {
	envParams, fromEnv, err := cfg.applyEnv(os.Getenv, os.Environ())
	if err != nil {
		return nil, err
	}
	defer func() { err = blameEnv(err, fromEnv) }()
	if err := envLogger(&cfg, os.Getenv); err != nil {
		return nil, err
	}
	cfg.fill()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := checkHostname(cfg.Hostname, min(cfg.RPCTimeout, 5*time.Second)); err != nil {
		return nil, err
	}
	secret, source, err := peerauth.LoadSecret(cfg.AuthSecret, cfg.AuthSecretFile, nil)
	if err != nil {
		return nil, err
	}
	if cfg.Encrypt && secret == nil {
		return nil, errs.New(errs.InvalidArgument, "new", "encryption (Config.Encrypt, %s) needs the cluster secret: the session keys are derived from it", EnvEncrypt).
			WithHint("set TE_AUTH_SECRET_FILE, TE_AUTH_SECRET or Config.AuthSecret on every engine, or do not ask for encryption")
	}
	mc, err := newMooncakeState(&cfg, secret != nil)
	if err != nil {
		return nil, err
	}
	e := &Engine{mc: mc,
		cfg: cfg, reg: segment.NewRegistry(), byName: map[string]transport.Transport{},
		segs: map[string]*segState{}, batches: map[*Batch]struct{}{}, done: make(chan struct{}),
		p2p: meta.IsP2P(cfg.Metadata), secret: secret, envParams: envParams,
	}
	var inst [16]byte
	rand.Read(inst[:])
	e.instance = hex.EncodeToString(inst[:])

	bind, explicit, err := listenAddr(&cfg)
	if err != nil {
		return nil, err
	}
	// The HTTP store derives te-sidecar's bearer token from the same secret.
	store, err := meta.OpenWith(cfg.Metadata, meta.Options{AuthSecret: cfg.AuthSecret, AuthSecretFile: cfg.AuthSecretFile})
	if err != nil {
		return nil, err
	}
	e.store = store

	ln, err := net.Listen("tcp", bind)
	if err != nil {
		if store != nil {
			store.Close()
		}
		le := errs.Wrap(errs.InvalidArgument, "new", err, "listen on %s", bind)
		if !explicit {
			le = le.WithHint("an engine binds the host it advertises (Hostname); if peers reach it at an address " +
				"this host does not have (NAT), set ListenAddr, e.g. 0.0.0.0:0")
		}
		return nil, le
	}
	port := ln.Addr().(*net.TCPAddr).Port
	e.hostname = cfg.Hostname
	if e.hostname == "" {
		e.hostname = defaultHost(ln.Addr().(*net.TCPAddr).IP)
	}
	e.rpcAddr = net.JoinHostPort(e.hostname, strconv.Itoa(port))
	e.name = cfg.SegmentName
	if e.name == "" {
		e.name = e.rpcAddr
	}
	if secret == nil {
		cfg.Logger.Warn("te: no cluster secret: peers are not authenticated; whoever reaches this engine's ports can read "+
			"and write its registered memory (set TE_AUTH_SECRET_FILE, TE_AUTH_SECRET or Config.AuthSecret; see SECURITY.md)",
			"listen", ln.Addr().String())
	} else {
		mode := "integrity (headers, control messages and data payloads authenticated, payloads readable on the path)"
		switch {
		case cfg.Encrypt:
			mode = "encryption (everything sealed)"
		case cfg.HeadersOnly:
			mode = "headers (headers and control messages authenticated; data payloads unauthenticated unless a peer asks for more: " + EnvIntegrity + "=headers)"
		}
		cfg.Logger.Info("te: peers authenticate with the cluster secret", "from", source, "key_ids", secret.KeyIDs(),
			"session", mode, "listen", ln.Addr().String())
	}
	l := cfg.Limits
	e.ctrl = ctrl.New(ln, ctrl.Options{Secret: secret, Encrypt: cfg.Encrypt, Instance: e.instance, Name: e.name, Addr: e.rpcAddr,
		Limits:      ctrl.Limits{Policy: l.policy(), MaxCalls: l.MaxCalls, MaxCallsPerConn: l.MaxCallsPerConn, MaxFrame: l.MaxFrame},
		DialTimeout: cfg.RPCTimeout, Logger: cfg.Logger, Mooncake: mc.open})
	e.ctrl.Handle(wire.KindDescribe, e.handleDescribe)
	e.ctrl.Handle(wire.KindNotify, e.handleNotify)
	e.ctrl.Reserve(wire.KindNotify, ctrl.Reserver{Reserve: e.reserveNotify, Release: e.releaseNotify})
	e.ctrl.Handle(wire.KindNotifyOnce, e.handleNotifyOnce)
	e.ctrl.Reserve(wire.KindNotifyOnce, ctrl.Reserver{Reserve: e.reserveNotifyOnce, Release: e.releaseNotify})
	e.ctrl.Handle(wire.KindProbe, e.handleProbe)
	e.installMooncake()

	err = e.startTransports()
	if err == nil {
		if err = e.checkEnvParams(); err != nil {
			e.closeTransports()
		}
	}
	if err != nil {
		e.ctrl.Close()
		if store != nil {
			store.Close()
		}
		return nil, err
	}
	e.ctrl.Start()
	if cfg.TransferTimeout > 0 {
		e.wg.Add(1)
		go e.runReaper()
	}
	if err := e.publish(); err != nil {
		e.Close()
		return nil, err
	}
	e.startMetaSync()
	if err := e.startMetrics(); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// listenAddr is the address the RPC listener binds: ListenAddr when it names
// a host (0.0.0.0 included: explicit), else the advertised host (Hostname,
// else the first non-loopback IPv4 address, else 127.0.0.1) at ListenAddr's
// port, or port 0.
func listenAddr(cfg *Config) (addr string, explicit bool, err error) {
	port := "0"
	if cfg.ListenAddr != "" {
		h, p, err := net.SplitHostPort(cfg.ListenAddr)
		if err != nil {
			return "", false, errs.Wrap(errs.InvalidArgument, "new", err, "listen address %q is not host:port", cfg.ListenAddr)
		}
		if h != "" {
			return cfg.ListenAddr, true, nil
		}
		port = p
	}
	host := cfg.Hostname
	if host == "" {
		host = defaultHost(nil)
	}
	return net.JoinHostPort(host, port), false, nil
}

func defaultHost(ip net.IP) string {
	if ip != nil && !ip.IsUnspecified() {
		return ip.String()
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
				return n.IP.String()
			}
		}
	}
	return "127.0.0.1"
}

func (e *Engine) startTransports() error {
	names := e.cfg.Transports
	explicit := len(names) > 0
	if !explicit {
		names = transport.Names()
	}
	seen := map[string]bool{}
	for _, n := range names {
		n = strings.TrimSpace(strings.ToLower(n))
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		f, ok := transport.Lookup(n)
		if !ok {
			e.closeTransports()
			return errs.New(errs.TransportUnavailable, "new", "no transport named %q", n).
				WithHint("available: " + strings.Join(transport.Names(), ", "))
		}
		t, err := f()
		if err == nil {
			err = t.Start(host{e})
		}
		if err != nil {
			if name := e.envParamRefused(n, err); name != "" {
				e.closeTransports()
				return errs.Wrap(errs.InvalidArgument, "new", err, "%s", name)
			}
			if explicit {
				e.closeTransports()
				return errs.Wrap(errs.TransportUnavailable, "new", err, "transport %s", n)
			}
			e.cfg.Logger.Info("te: transport not installed", "transport", n, "reason", err.Error())
			continue
		}
		e.transports = append(e.transports, t)
		e.byName[n] = t
	}
	if len(e.transports) == 0 {
		err := errs.New(errs.TransportUnavailable, "new", "no transport could start")
		if len(transport.Names()) == 0 {
			err = err.WithHint(`no transport is linked into this program: import _ "github.com/tecache/te/engine/std" ` +
				"(or the transport packages it needs)")
		}
		return err
	}
	// Rank order (the transports' own Caps.Rank), whatever order the
	// caller listed them in: selection tries them in this order.
	slices.SortStableFunc(e.transports, func(a, b transport.Transport) int {
		if c := cmp.Compare(a.Caps().Rank, b.Caps().Rank); c != 0 {
			return c
		}
		return strings.Compare(a.Name(), b.Name())
	})
	if f := e.cfg.ForceTransport; f != "" && e.byName[f] == nil {
		e.closeTransports()
		return errs.New(errs.TransportUnavailable, "new", "forced transport %q is not installed", f)
	}
	return nil
}

func (e *Engine) closeTransports() {
	for _, t := range e.transports {
		if err := t.Close(); err != nil {
			e.cfg.Logger.Warn("te: closing transport", "transport", t.Name(), "err", err)
		}
	}
}

// host is the engine as its transports see it.
type host struct{ e *Engine }

func (h host) SegmentName() string             { return h.e.name }
func (h host) ReachChanged()                   { h.e.reachEpoch.Add(1) }
func (h host) Instance() string                { return h.e.instance }
func (h host) Registry() *segment.Registry     { return h.e.reg }
func (h host) Control() transport.Control      { return hostControl(h) }
func (h host) Logf(format string, args ...any) { h.e.cfg.Logger.Info(fmt.Sprintf(format, args...)) }
func (h host) Param(key string) (string, bool) {
	if key == ParamHostname {
		// The advertised host: transports that pick a NIC by address
		// (fabric's domain) follow it.
		return h.e.hostname, h.e.hostname != ""
	}
	if _, ok := h.e.envParams[key]; ok {
		h.e.paramsAsked.Store(key, true)
	}
	if v, ok := h.e.mooncakeParam(key); ok {
		return v, true
	}
	if v, ok := h.e.cfg.Params[key]; ok {
		return v, true
	}
	return h.e.cfg.Limits.param(key)
}

// hostControl is the control plane as a transport sees it: its handlers
// learn who calls (transport.CallerOf), as the session proved it.
type hostControl struct{ e *Engine }

func (c hostControl) Handle(kind uint8, h func(ctx context.Context, body []byte) ([]byte, error)) {
	known := c.e.secret != nil
	c.e.ctrl.Handle(kind, func(ctx context.Context, body []byte) ([]byte, error) {
		by := segment.Anyone
		if ci := ctrl.Info(ctx); ci != nil && known {
			// With a secret every session proved its initiator; a
			// Mooncake peer proves nothing and names no one.
			by = segment.Caller{Name: ci.PeerName, Instance: ci.PeerInstance, Known: true}
		}
		return h(transport.WithCaller(ctx, by), body)
	})
}

func (c hostControl) Call(ctx context.Context, rpcAddr string, kind uint8, body []byte) ([]byte, error) {
	return c.e.ctrl.Call(ctx, rpcAddr, kind, body)
}

// ParamHostname is the parameter (Host.Param) that tells transports the
// host the engine advertises.
const ParamHostname = "engine.hostname"

// Name returns the local segment name.
func (e *Engine) Name() string { return e.name }

// RPCAddr returns host:port of the RPC listener.
func (e *Engine) RPCAddr() string { return e.rpcAddr }

// RPCPort returns the RPC listener's port.
func (e *Engine) RPCPort() int { return e.ctrl.Addr().(*net.TCPAddr).Port }

// Instance returns the random identity of this engine start.
func (e *Engine) Instance() string { return e.instance }

// Transports lists the installed transports in rank order (Caps.Rank).
func (e *Engine) Transports() []string {
	out := make([]string, len(e.transports))
	for i, t := range e.transports {
		out[i] = t.Name()
	}
	return out
}

// Descriptor returns a copy of the published local descriptor.
func (e *Engine) Descriptor() *segment.Desc { return e.desc.Load().Clone() }

// publish builds the descriptor from the registry and publishes it. Callers
// hold regMu (or are New).
func (e *Engine) publish() error {
	d := &segment.Desc{
		Name:      e.name,
		Protocol:  mooncakeTCP, // a transport's Describe may name another
		Buffers:   []segment.BufferDesc{},
		Timestamp: time.Now().UTC().Format(time.RFC3339Nano),
		Version:   e.version.Add(1),
		Instance:  e.instance,
		RPC:       e.rpcAddr,
		Endpoints: map[string]string{},
	}
	for _, t := range e.transports {
		d.Transports = append(d.Transports, t.Name())
		t.Describe(d)
	}
	e.mooncakeProtocol(d)
	own := d
	for _, r := range e.reg.Regions() {
		private := !r.Remote && r.Storage != nil
		if r.Closing() || !(r.Remote || private) {
			continue
		}
		if private && own == d {
			c := *d
			c.Buffers = append([]segment.BufferDesc(nil), d.Buffers...)
			own = &c
		}
		if r.Remote {
			d.Buffers = append(d.Buffers, r.Desc)
		}
		if own != d {
			own.Buffers = append(own.Buffers, r.Desc) // in address order, as Find needs
		}
	}
	e.own.Store(own)
	e.desc.Store(d)
	if e.store == nil {
		return nil
	}
	b, err := d.Encode()
	if err != nil {
		return err
	}
	// With a secret both records carry a MAC (spec.md, "Authenticated
	// store records"): a store writer can delete them, not redirect them.
	if b, err = e.secret.SignRecord(meta.KeyRAM(e.name), b); err != nil {
		return err
	}
	rpc, err := e.secret.SignRecord(meta.KeyRPC(e.name), meta.EncodeRPCMeta(e.hostname, e.RPCPort()))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RPCTimeout)
	defer cancel()
	if err := e.store.Put(ctx, meta.KeyRAM(e.name), b); err != nil {
		return errs.Wrap(errs.Metadata, "publish", err, "segment %s", e.name)
	}
	if err := e.store.Put(ctx, meta.KeyRPC(e.name), rpc); err != nil {
		return errs.Wrap(errs.Metadata, "publish", err, "rpc meta of %s", e.name)
	}
	return nil
}

func (e *Engine) live(op string) error {
	if e.closed.Load() {
		return errs.New(errs.Closed, op, "engine closed")
	}
	return nil
}

// MemoryRegion is one range for RegisterMemoryBatch.
type MemoryRegion struct {
	Addr     uint64
	Length   uint64
	Location string // "cpu", "cpu:N", "cuda:N", "hip:N" or "*"
	Remote   bool   // remote-accessible
}

// RegisterMemory registers [addr, addr+length) with every installed transport
// and publishes it (when remote is true). Zero length is InvalidArgument; an
// overlap with a registered range is AddressOverlapped; registering the same
// range again with the same location and flag succeeds and changes nothing.
func (e *Engine) RegisterMemory(addr, length uint64, location string, remote bool) error {
	return e.RegisterMemoryBatch([]MemoryRegion{{addr, length, location, remote}})
}

// RegisterMemoryBatch registers several ranges, all or none, and publishes the
// descriptor once.
func (e *Engine) RegisterMemoryBatch(rs []MemoryRegion) error {
	if err := e.live("register"); err != nil {
		return err
	}
	if len(rs) == 0 {
		return errs.New(errs.InvalidArgument, "register", "no regions")
	}
	regions := make([]*segment.Region, len(rs))
	for i, m := range rs {
		r, err := segment.NewRegion(m.Addr, m.Length, m.Location, m.Remote)
		if err != nil {
			return err
		}
		regions[i] = r
	}
	if err := resolveLocations(regions); err != nil {
		return err
	}
	// Overlap within the batch itself.
	for i := range regions {
		for j := i + 1; j < len(regions); j++ {
			a, b := regions[i], regions[j]
			if a.Addr < b.End() && b.Addr < a.End() && !(a.Addr == b.Addr && a.Length == b.Length) {
				return errs.New(errs.AddressOverlapped, "register", "ranges %#x and %#x in one batch overlap", a.Addr, b.Addr)
			}
		}
	}
	e.regMu.Lock()
	defer e.regMu.Unlock()
	// Transports first, then the registry: a region becomes visible to
	// remote accesses only once every transport holds it.
	var fresh []*segment.Region
	for _, r := range regions {
		if old, ok := e.reg.Lookup(r.Addr, r.Length); ok && !old.Closing() && old.Addr == r.Addr && old.Length == r.Length &&
			old.Location == r.Location && old.Remote == r.Remote {
			continue // identical re-registration
		}
		fresh = append(fresh, r)
	}
	if len(fresh) == 0 {
		return nil
	}
	var done []*segment.Region
	for _, r := range fresh {
		var held int
		var partialErr error
		for i, t := range e.transports {
			if err := t.Register(r); err != nil {
				if _, partial := t.(transport.BufferReacher); partial && errs.CodeOf(err) == errs.NotSupported {
					// A range it cannot serve (outside its mapping):
					// the other transports serve it.
					partialErr = errs.Wrap(errs.NotSupported, "register", err, "transport %s refused [%#x,+%d)", t.Name(), r.Addr, r.Length)
					continue
				}
				for _, u := range e.transports[:i] {
					u.Unregister(r)
				}
				e.rollback(done)
				return errs.Wrap(errs.CodeOf(err), "register", err, "transport %s refused [%#x,+%d)", t.Name(), r.Addr, r.Length)
			}
			held++
		}
		if held == 0 && partialErr != nil {
			// No transport would serve it.
			for _, t := range e.transports {
				t.Unregister(r)
			}
			e.rollback(done)
			return partialErr
		}
		done = append(done, r)
	}
	if _, _, err := e.reg.Add(fresh...); err != nil {
		e.rollback(done)
		return err
	}
	if err := e.publish(); err != nil {
		e.cfg.Logger.Warn("te: publishing descriptor", "err", err)
	}
	return nil
}

func (e *Engine) rollback(rs []*segment.Region) {
	for _, r := range rs {
		for _, t := range e.transports {
			t.Unregister(r)
		}
	}
}

// UnregisterMemory unregisters the range registered at addr. It refuses new
// accesses at once, lets those in flight (remote ones, and this engine's own
// tasks on the range) finish for Config.UnregisterGrace, then cancels its own
// and cuts the connections or queue pairs of the others, releases transport state
// and publishes the new descriptor. When it returns nil nothing can touch the
// range any more and the caller may free the memory. If a transport cannot
// guarantee that, it returns the error and the range stays registered (and
// refusing accesses): calling it again retries.
func (e *Engine) UnregisterMemory(addr uint64) error {
	return e.UnregisterMemoryBatch([]uint64{addr})
}

// UnregisterMemoryBatch unregisters several ranges (all must be registered)
// and publishes the descriptor once.
func (e *Engine) UnregisterMemoryBatch(addrs []uint64) error {
	if len(addrs) == 0 {
		return errs.New(errs.InvalidArgument, "unregister", "no addresses")
	}
	e.regMu.Lock()
	defer e.regMu.Unlock()
	rs, err := e.reg.Close(addrs...)
	if err != nil {
		return err
	}
	// A window dies with the memory under it: its regions in rs refuse
	// accesses from now on, and every transport that lets peers use a
	// window without the owner checking each access (shm) is told.
	wins := e.reg.CloseWindowsOver(rs)
	if err := e.quiesce(rs); err != nil {
		return err
	}
	var first error
	for _, r := range rs {
		for _, t := range e.transports {
			if !registeredWith(t, r) {
				continue
			}
			if err := t.Unregister(r); err != nil && first == nil {
				first = errs.Wrap(errs.CodeOf(err), "unregister", err, "transport %s on [%#x,+%d)", t.Name(), r.Addr, r.Length)
			}
		}
	}
	for _, t := range e.transports {
		wr, ok := t.(transport.WindowRevoker)
		if !ok {
			continue
		}
		for _, w := range wins {
			if err := wr.RevokeWindow(w); err != nil && first == nil {
				first = errs.Wrap(errs.CodeOf(err), "unregister", err, "transport %s revoking a window over [%#x,+%d)",
					t.Name(), w.Addr, w.Length)
			}
		}
	}
	if first != nil {
		return first // still registered, still refusing: a retry tries again
	}
	e.reg.Drop(rs...)
	if err := releaseStorage(rs); err != nil {
		e.cfg.Logger.Warn("te: closing a registered file", "err", err)
	}
	if !e.closed.Load() {
		if err := e.publish(); err != nil {
			e.cfg.Logger.Warn("te: publishing descriptor", "err", err)
		}
	}
	return nil
}

// quiesce returns once no access to rs is in flight: accesses (remote ones and
// this engine's own tasks) get the grace period, then this engine's tasks on
// rs are canceled and the transports cut what still holds them.
func (e *Engine) quiesce(rs []*segment.Region) error {
	idle := func() bool {
		for _, r := range rs {
			if !r.Idle() {
				return false
			}
		}
		return true
	}
	if waitUntil(idle, e.cfg.UnregisterGrace) {
		return nil
	}
	e.cancelOn(rs)
	for _, r := range rs {
		if r.Idle() {
			continue
		}
		for _, t := range e.transports {
			if err := t.Quiesce(r); err != nil {
				return errs.Wrap(errs.CodeOf(err), "unregister", err, "transport %s could not end the accesses to [%#x,+%d)",
					t.Name(), r.Addr, r.Length)
			}
		}
	}
	// What is left ends on its own (a memcpy by another engine of this
	// process, a task completing): bounded, but not by a peer.
	if !waitUntil(idle, e.cfg.RPCTimeout) {
		return errs.New(errs.Timeout, "unregister", "accesses still in flight after the transports were quiesced")
	}
	return nil
}

// cancelOn cancels this engine's pending tasks on rs: their local memory, or
// the file of this engine they target.
func (e *Engine) cancelOn(rs []*segment.Region) {
	e.batchMu.Lock()
	bs := make([]*Batch, 0, len(e.batches))
	for b := range e.batches {
		bs = append(bs, b)
	}
	e.batchMu.Unlock()
	for _, b := range bs {
		b.smu.Lock()
		b.mu.Lock()
		n, live := b.n, !b.freed && !b.settled
		b.mu.Unlock()
		if live {
			b.cancelWhere(0, n, whyCanceled, rs)
		}
		b.smu.Unlock()
	}
}

// waitUntil polls cond, backing off from a spin to a millisecond, until it
// holds (true) or d passes (false).
func waitUntil(cond func() bool, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for p := time.Microsecond; !cond(); {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(p)
		p = min(2*p, time.Millisecond)
	}
	return true
}

// Close stops the engine. In-flight tasks end FAILED once their transports let
// go of them; listeners, connections and goroutines are gone when it returns.
// Close is idempotent.
func (e *Engine) Close() error {
	e.closeOnce.Do(func() {
		e.lifeMu.Lock()
		e.closed.Store(true)
		e.lifeMu.Unlock()
		close(e.done)
		e.stopMetrics()
		// No submit is handing requests over now, and none will: a
		// small local copy runs inline in Submit, and must not run
		// after Close returned.
		e.handMu.Lock()
		//lint:ignore SA2001 a barrier: waiting for the hand-offs in progress is the point
		e.handMu.Unlock()
		// Transports complete what they hold before they return; then
		// nothing can complete late.
		e.closeTransports()
		// Files still registered: their I/O ended with the transports.
		releaseStorage(e.reg.Regions())
		e.ctrl.Close()
		e.batchMu.Lock()
		bs := make([]*Batch, 0, len(e.batches))
		for b := range e.batches {
			bs = append(bs, b)
		}
		e.batchMu.Unlock()
		for _, b := range bs {
			b.failUnclaimed()
		}
		e.wg.Wait()
		if e.store != nil {
			ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RPCTimeout)
			e.store.Delete(ctx, meta.KeyRAM(e.name))
			e.store.Delete(ctx, meta.KeyRPC(e.name))
			cancel()
			e.store.Close()
		}
	})
	return nil
}

// Probe is what a peer answers to a probe.
type Probe struct {
	Name     string        `json:"name"`
	Instance string        `json:"instance"`
	Version  uint64        `json:"version"`
	RTT      time.Duration `json:"-"`
}

// encodedDesc is a descriptor and its encoding, shared by every reply that
// serves it: many peers describing at once hold one copy, not one each.
type encodedDesc struct {
	d *segment.Desc
	b []byte
}

func (e *Engine) handleDescribe(_ context.Context, body []byte) ([]byte, error) {
	if len(body) > 0 && string(body) != e.name && string(body) != e.rpcAddr {
		return nil, errs.New(errs.SegmentNotFound, "describe", "this engine serves %q, not %q", e.name, body)
	}
	d := e.desc.Load()
	if c := e.descEnc.Load(); c != nil && c.d == d {
		return c.b, nil
	}
	b, err := d.Encode()
	if err != nil {
		return nil, err
	}
	e.descEnc.Store(&encodedDesc{d, b})
	return b, nil
}

// probeReply is the Probe answer on the wire: the Probe and what the
// engine serves beyond older versions (notify_ids: it dedups NotifyOnce).
type probeReply struct {
	Probe
	NotifyIDs bool `json:"notify_ids,omitempty"`
}

func (e *Engine) handleProbe(context.Context, []byte) ([]byte, error) {
	d := e.desc.Load()
	return json.Marshal(probeReply{Probe{Name: e.name, Instance: e.instance, Version: d.Version}, true})
}

// Probe checks that the segment's engine answers and returns its identity and
// the round-trip time. It blocks up to the RPC timeout.
func (e *Engine) Probe(name string) (Probe, error) {
	if err := e.live("probe"); err != nil {
		return Probe{}, err
	}
	addr, err := e.rpcAddrOf(name)
	if err != nil {
		return Probe{}, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RPCTimeout)
	defer cancel()
	t0 := time.Now()
	b, err := e.probeCall(ctx, addr, name)
	if err != nil {
		return Probe{}, err
	}
	var p Probe
	if err := json.Unmarshal(b, &p); err != nil {
		return Probe{}, errs.Wrap(errs.Protocol, "probe", err, "bad probe reply from %s", name)
	}
	p.RTT = time.Since(t0)
	return p, nil
}

// rpcAddrOf resolves a segment name to its RPC address: the name itself in
// peer-to-peer mode, the rpc_meta record otherwise.
func (e *Engine) rpcAddrOf(name string) (string, error) {
	if name == "" {
		return "", errs.New(errs.InvalidArgument, "resolve", "empty segment name")
	}
	if name == e.name {
		return e.rpcAddr, nil
	}
	if e.p2p {
		if _, _, err := net.SplitHostPort(name); err != nil {
			return "", errs.New(errs.InvalidArgument, "resolve", "segment name %q is not host:port", name).
				WithHint("with P2PHANDSHAKE a segment is named after its engine's RPC address")
		}
		return name, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.RPCTimeout)
	defer cancel()
	b, err := e.store.Get(ctx, meta.KeyRPC(name))
	if err != nil {
		if errs.CodeOf(err) == errs.NotFound {
			return "", errs.New(errs.SegmentNotFound, "resolve", "no segment %q in the metadata store", name)
		}
		return "", errs.Wrap(errs.Metadata, "resolve", err, "segment %q", name)
	}
	if b, err = e.verifyRecord(meta.KeyRPC(name), name, b); err != nil {
		return "", err
	}
	var m meta.RPCMeta
	if err := json.Unmarshal(b, &m); err != nil || m.RPCPort <= 0 || m.RPCPort > 65535 {
		return "", errs.New(errs.Metadata, "resolve", "malformed rpc_meta for %q", name)
	}
	return net.JoinHostPort(m.IPOrHostName, strconv.Itoa(m.RPCPort)), nil
}
