package tcp

import (
	"context"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/cpuid/v2"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

// Name is the transport's name.
const Name = "tcp"

func init() {
	transport.RegisterFactory(Name, func() (transport.Transport, error) { return New(), nil })
}

// Limits of the parameters.
const (
	MinConns = 2
	MaxConns = 64
	MinSlice = 4 << 10
	MaxSlice = wire.MaxDataLength
)

// Options are the transport's parameters, read from the engine's Params in
// Start.
type Options struct {
	Conns       int           // connections per peer
	Slice       uint64        // largest request on the wire; larger ones are cut
	Listen      string        // data listener address; "" for the RPC listener's IP
	DialTimeout time.Duration // connect timeout (at most Timeout)
	// Devices lists the NICs (interface names or addresses) the transport
	// listens on, publishes an endpoint for, and stripes slices from
	// (tcp.devices). "": every interface that is up when the data
	// listener is on the wildcard address, else the listener's alone.
	Devices string
	// Timeout fails a connection (and the requests on it) when requests
	// are in flight and no byte arrived for this long: a peer that hangs
	// without closing its socket does not hold requests, and the memory
	// they pin, forever. Default: Progress, so one figure
	// (TE_PROGRESS_TIMEOUT) governs a silent peer whichever way the bytes
	// go; tcp.timeout overrides it.
	Timeout time.Duration
	// GPUStaging is the pinned host memory per connection that GPU
	// payloads are staged through (half for each direction).
	GPUStaging uint64
	// Progress bounds how long a payload may take to move each 4 MiB
	// (either way, on either side): a peer that stalls or trickles is cut
	// off. Default: the engine's Limits.ProgressTimeout (10s).
	Progress time.Duration
	// Idle closes an accepted connection with nothing in flight after this
	// long (the engine's Limits.IdleTimeout, 5m); Header bounds the rest of
	// a request header once its first byte came, and the preface
	// (Limits.HandshakeTimeout, 10s).
	Idle, Header time.Duration
	// PeerIdle drops a peer's pooled connections after this long without a
	// request (Limits.PeerIdleTimeout, 2m).
	PeerIdle time.Duration
	// MaxConns and MaxConnsPerHost bound the accepted data connections, in
	// all and per remote IP address (Limits.MaxConns, MaxConnsPerHost).
	MaxConns, MaxConnsPerHost int
	// AcceptMooncake serves Mooncake peers' data requests, which carry no
	// key (parameter mooncake.accept; the engine sets it from
	// Config.AcceptMooncakePeers). Off: they are refused.
	AcceptMooncake bool
}

// DefaultOptions derives the defaults from the machine: one connection per
// core (at least two, so a reader and a writer on each side can overlap), and
// slices of half the L2 cache clamped to [256 KiB, 1 MiB], so a slice is
// still cache-warm when the kernel copies it into the socket.
func DefaultOptions() Options {
	conns := runtime.NumCPU()
	conns = max(MinConns, min(conns, 8))
	slice := uint64(512 << 10)
	if l2 := cpuid.CPU.Cache.L2; l2 > 0 {
		slice = uint64(l2) / 2
	}
	slice = max(256<<10, min(slice, 1<<20))
	return Options{Conns: conns, Slice: slice, DialTimeout: 5 * time.Second, Timeout: 10 * time.Second, GPUStaging: DefaultGPUStaging,
		Progress: 10 * time.Second, Idle: 5 * time.Minute, Header: 10 * time.Second, PeerIdle: 2 * time.Minute,
		MaxConns: 1024, MaxConnsPerHost: 256}
}

func parseOptions(h transport.Host) (Options, error) {
	o := DefaultOptions()
	bad := func(key, v, why string) error {
		return errs.New(errs.InvalidArgument, "tcp", "parameter %s=%q: %s", key, v, why)
	}
	if v, ok := h.Param("tcp.conns"); ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < MinConns || n > MaxConns {
			return o, bad("tcp.conns", v, "want an integer in ["+strconv.Itoa(MinConns)+", "+strconv.Itoa(MaxConns)+"]")
		}
		o.Conns = n
	}
	if v, ok := h.Param("tcp.slice"); ok {
		n, err := transport.ParseSize(v)
		if err != nil || n < MinSlice || n > MaxSlice {
			return o, bad("tcp.slice", v, "want a size from 4KiB to 64MiB")
		}
		o.Slice = n
	}
	if v, ok := h.Param("tcp.listen"); ok {
		if _, _, err := net.SplitHostPort(v); err != nil {
			return o, bad("tcp.listen", v, "want host:port")
		}
		o.Listen = v
	}
	if v, ok := h.Param("tcp.devices"); ok {
		if strings.TrimSpace(v) == "" {
			return o, bad("tcp.devices", v, "want interface names or addresses, separated by commas")
		}
		o.Devices = v
	}
	if v, ok := h.Param("tcp.dial_timeout"); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return o, bad("tcp.dial_timeout", v, "want a positive duration")
		}
		o.DialTimeout = d
	}
	silence := false
	if v, ok := h.Param("tcp.timeout"); ok {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return o, bad("tcp.timeout", v, "want a positive duration")
		}
		o.Timeout, silence = d, true
	}
	for _, p := range []struct {
		key string
		dst *time.Duration
	}{
		{"limits.progress_timeout", &o.Progress}, {"limits.idle_timeout", &o.Idle},
		{"limits.handshake_timeout", &o.Header}, {"limits.peer_idle_timeout", &o.PeerIdle},
	} {
		if v, ok := h.Param(p.key); ok {
			d, err := time.ParseDuration(v)
			never := d == 0 && (p.dst == &o.Idle || p.dst == &o.PeerIdle)
			if err != nil || (d <= 0 && !never) {
				return o, bad(p.key, v, "want a positive duration")
			}
			*p.dst = d
		}
	}
	for _, p := range []struct {
		key string
		dst *int
	}{{"limits.max_conns", &o.MaxConns}, {"limits.max_conns_per_host", &o.MaxConnsPerHost}} {
		if v, ok := h.Param(p.key); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return o, bad(p.key, v, "want a positive integer")
			}
			*p.dst = n
		}
	}
	if v, ok := h.Param(ParamAcceptMooncake); ok {
		o.AcceptMooncake = v == "1" || v == "true"
	}
	if v, ok := h.Param("tcp.gpu_staging"); ok {
		n, err := transport.ParseSize(v)
		if err != nil || n < MinGPUStaging || n > MaxGPUStaging {
			return o, bad("tcp.gpu_staging", v, "want a size from 64KiB to 1GiB")
		}
		o.GPUStaging = n
	}
	if !silence {
		o.Timeout = o.Progress
	}
	return o, nil
}

// Transport is the tcp transport. Use New (or the engine's factory).
type Transport struct {
	opt  Options
	reg  *segment.Registry
	logf func(string, ...any)
	ln   net.Listener // nil when loop serves the listener
	addr net.Addr     // the data listener's
	// devs are the local NICs (tcp.devices) rails dial from; extra the
	// listeners on those the data listener does not cover (it is bound
	// to another address), served by the goroutine path; devEps the
	// endpoints published for them beside the primary one.
	devs     []device
	localIPs []net.IP // every address of this host, when it started
	extra    []net.Listener
	devEps   []string
	// railSets are the rails to peers that publish several endpoints
	// (rails.go).
	railSets railSets
	resends  sync.WaitGroup // slices on their way to another rail
	// loop accepts and serves Mooncake initiators when the engine accepts
	// them (mcloop.go).
	loop *mcLoop

	// The initiator side: te's framing and Mooncake's, each a pool of
	// peers with their pipelined connections (client.go).
	tef, mcf framing

	mu     sync.Mutex
	closed bool
	served map[*serverConn]struct{} // accepted connections
	idle   chan *serverConn         // hands one to a waiting server goroutine
	quit   chan struct{}            // closed by Close: server goroutines exit
	wg     sync.WaitGroup           // the listener's goroutines
	gpu    gpuPool                  // pinned rings for GPU payloads (gpu.go)

	instance string           // this engine's, proven to peers
	segName  string           // this engine's segment name, proven to peers
	secret   *peerauth.Secret // nil: peers are not authenticated
	encrypt  bool             // sessions seal data payloads too
	// headersOnly asks for sessions that leave payloads unauthenticated
	// (Config.HeadersOnly); the peer must ask for it too.
	headersOnly bool
	limiter     *connlimit.Limiter // accepted connections, total and per address

	mc mcState // Mooncake interop (mooncake.go)

	authRefused, authFailed, slowClosed, recordsRefused atomic.Uint64
	dialed                                              atomic.Uint64 // data connections this side dialed
}

// authHoster is implemented by engine hosts with a cluster secret: every data
// connection then authenticates both ways before its first request.
type authHoster interface{ AuthSecret() *peerauth.Secret }

// encryptHoster is implemented by engine hosts that say whether sessions
// encrypt data payloads (Config.Encrypt).
type encryptHoster interface{ Encrypt() bool }

// sessionOptions are the data connections' session settings.
func (t *Transport) sessionOptions() peerauth.SessionOptions {
	return peerauth.SessionOptions{Channel: session.Data, Encrypt: t.encrypt, HeadersOnly: t.headersOnly, Name: t.segName}
}

// headersOnlyHoster is implemented by engine hosts that say whether sessions
// leave data payloads unauthenticated (Config.HeadersOnly).
type headersOnlyHoster interface{ HeadersOnly() bool }

// Stats returns the transport's counters: connections open and refused at
// the listener's bounds, peers that failed authentication (refused here, or
// refusing us), connections cut by a deadline (a stalled or trickling
// payload, a silent or idle peer), idle peer connections pruned, Mooncake
// initiators' requests served (MooncakeServed), data connections dialed to
// peers (peer_conns_dialed: a warmed-up peer's first request adds none);
// with peers that publish several endpoints, per rail ("rail.L-R.*", local
// address L, "any" when unbound, to peer address R) the payload bytes the
// peer acknowledged, failures, slices sent again on another rail and
// cooldowns, and their sums (rail_bytes, rail_errors, rail_retries,
// rail_cooldowns); "rail.L-R.rate" is a gauge, the rail's measured
// throughput in bytes per second (0 until measured).
func (t *Transport) Stats() map[string]uint64 {
	st := t.limiter.Stats()
	out := map[string]uint64{
		"conns_open":             uint64(st.Open),
		"conns_peak":             uint64(st.Peak),
		"conns_refused":          st.RefusedTotal,
		"conns_refused_per_host": st.RefusedPerHost,
		"auth_refused":           t.authRefused.Load(),
		"auth_failed":            t.authFailed.Load(),
		"slow_closed":            t.slowClosed.Load(),
		"records_refused":        t.recordsRefused.Load(),
		"peer_conns_pruned":      t.pruned(),
		"mooncake_served":        t.mc.served.Load(),
		"peer_conns_dialed":      t.dialed.Load(),
	}
	t.railSets.stats(out)
	return out
}

// Live reports the peers the initiator side holds (te's framing and
// Mooncake's), its connections to them and the accepted data connections
// open now (transport.LiveReporter).
func (t *Transport) Live() transport.Live {
	var l transport.Live
	for _, f := range []*framing{&t.tef, &t.mcf} {
		if f.pool != nil {
			p, c := f.pool.Live()
			l.Peers += p
			l.ConnsDialed += c
		}
	}
	l.ConnsAccepted = t.limiter.Stats().Open
	return l
}

func (t *Transport) pruned() uint64 {
	var n uint64
	for _, f := range []*framing{&t.tef, &t.mcf} {
		if f.pool != nil {
			n += f.pool.Pruned()
		}
	}
	return n
}

// New returns an unstarted transport.
func New() *Transport {
	return &Transport{served: map[*serverConn]struct{}{}, limiter: connlimit.New(0, 0),
		idle: make(chan *serverConn), quit: make(chan struct{})}
}

// Name returns "tcp".
func (t *Transport) Name() string { return Name }

// Caps declares the transport's reach and the memory it moves. GPU memory is staged through pinned host buffers.
func (t *Transport) Caps() transport.Caps {
	// FileMemory: a peer's files, which the server reads and writes
	// (server_file.go).
	return transport.Caps{SameHost: true, CrossHost: true, HostMemory: true, GPUMemory: true, Windows: true, Rank: 40,
		FileMemory: true}
}

// Options returns the options in effect (after Start).
func (t *Transport) Options() Options { return t.opt }

// testStarted, set by tests only, sees every transport that started.
var testStarted func(*Transport)

// bindHoster is implemented by engine hosts that can say which IP their RPC
// listener is bound to; the data listener binds the same one.
type bindHoster interface{ BindIP() string }

// Start reads the parameters and opens the data listener.
func (t *Transport) Start(h transport.Host) error {
	o, err := parseOptions(h)
	if err != nil {
		return err
	}
	t.opt = o
	t.gpu.setGeometry(o)
	t.reg = h.Registry()
	t.logf = h.Logf
	t.instance = h.Instance()
	t.segName = h.SegmentName()
	if a, ok := h.(authHoster); ok {
		t.secret = a.AuthSecret()
	}
	if e, ok := h.(encryptHoster); ok && t.secret != nil {
		t.encrypt = e.Encrypt()
	}
	if e, ok := h.(headersOnlyHoster); ok && t.secret != nil {
		t.headersOnly = e.HeadersOnly()
	}
	t.limiter = connlimit.New(o.MaxConns, o.MaxConnsPerHost)
	addr := o.Listen
	if addr == "" {
		ip := "0.0.0.0"
		if b, ok := h.(bindHoster); ok && b.BindIP() != "" {
			ip = b.BindIP()
		}
		addr = net.JoinHostPort(ip, "0")
	}
	// No TCP keepalive on accepted connections: idle ones are closed by
	// the idle timeout, busy ones by the progress timeout, and the four
	// setsockopt calls it costs per connection show with initiators that
	// connect per request (Mooncake's default).
	lc := net.ListenConfig{KeepAlive: -1}
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return errs.Wrap(errs.TransportUnavailable, "tcp", err, "data listener on %s", addr)
	}
	t.addr = ln.Addr()
	if err := t.listenDevices(lc, ln.Addr().(*net.TCPAddr)); err != nil {
		ln.Close()
		return err
	}
	if o.AcceptMooncake {
		l, err := t.startLoop(ln)
		ln.Close() // the loop holds its own descriptor of the socket
		if err != nil {
			t.closeExtra()
			return errs.Wrap(errs.TransportUnavailable, "tcp", err, "data listener on %s", addr)
		}
		t.loop = l
	} else {
		t.ln = ln
	}
	// Replies must come within Timeout while requests are in flight: a
	// peer that hangs without closing its socket does not hold requests,
	// and the memory they pin, forever.
	po := pipe.Options{Conns: o.Conns, Silence: o.Timeout, PeerIdle: o.PeerIdle, ReadBuffer: readBufSize, Component: "tcp"}
	t.tef = framing{pool: pipe.New[item](teDialect{t}, po), gpu: true}
	// Mooncake's framing has no ids: replies come in order.
	po.Ordered, po.Retries, po.Label = true, maxMcTries, "Mooncake peer "
	t.mcf = framing{pool: pipe.New[item](mcDialect{t}, po)}
	t.wg.Add(1)
	if t.loop != nil {
		go t.loop.run()
	} else {
		go t.acceptLoop(t.ln)
	}
	for _, x := range t.extra {
		t.wg.Add(1)
		go t.acceptLoop(x)
	}
	if testStarted != nil {
		testStarted(t)
	}
	return nil
}

// Addr returns the data listener's address.
func (t *Transport) Addr() net.Addr { return t.addr }

// Describe publishes the data endpoint: the host peers reach the engine's RPC
// listener at, with the data listener's port.
func (t *Transport) Describe(d *segment.Desc) {
	if t.addr == nil {
		return
	}
	port := t.addr.(*net.TCPAddr).Port
	host, _, err := net.SplitHostPort(d.RPC)
	if err != nil || host == "" {
		host = t.addr.(*net.TCPAddr).IP.String()
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			host = "127.0.0.1"
		}
	}
	if d.Endpoints == nil {
		d.Endpoints = map[string]string{}
	}
	primary := net.JoinHostPort(host, strconv.Itoa(port))
	d.Endpoints[Name] = primary
	// Every NIC's endpoint, the primary first, under a key of its own:
	// peers that know one endpoint only read Endpoints["tcp"] as before.
	if eps := parseEndpoints(primary, strings.Join(t.devEps, ",")); len(eps) > 1 {
		d.Endpoints[EndpointsKey] = strings.Join(eps, ",")
	}
	d.TCPDataPort = port
	// A Mooncake initiator that reads this descriptor speaks acknowledged
	// framing, so a request te refuses fails there instead of "completing".
	d.TCPProtoVersion = wire.MooncakeVersion
}

// Register needs no transport state: the capability key is the region's own
// (segment.Region.Desc.Key), checked by the registry on every access.
func (t *Transport) Register(*segment.Region) error { return nil }

// Unregister needs no transport state: the registry already refuses new
// accesses and the engine waited for those in flight.
func (t *Transport) Unregister(*segment.Region) error { return nil }

// Reachable reports whether the peer publishes a tcp endpoint.
func (t *Transport) Reachable(d *segment.Desc) error {
	_, _, err := t.route(d)
	return err
}

// clientHello opens a data connection: the preface, then the authentication
// exchange (both within the handshake timeout). It returns the peer's
// instance, proven when this engine has a secret, and the session every
// later frame is sealed in (nil without a secret on either side).
func (t *Transport) clientHello(nc net.Conn, addr string) (string, *session.Session, error) {
	// A peer that does not answer the handshake is a silent peer with a
	// request waiting: the silence bound (the progress timeout) applies,
	// where it is the shorter, as on a connection already open.
	bound := min(t.opt.Header, t.opt.Timeout)
	deadline := time.Now().Add(bound)
	nc.SetWriteDeadline(deadline)
	if _, err := nc.Write([]byte(wire.DataPreface)); err != nil {
		return "", nil, errs.Wrap(errs.PeerUnreachable, "tcp", err, "send preface to %s", addr)
	}
	o, err := peerauth.ClientSession(nc, t.secret, t.instance, deadline, t.sessionOptions())
	if err != nil {
		switch errs.CodeOf(err) {
		case errs.Unauthenticated:
			t.authFailed.Add(1)
		case errs.Timeout:
			// Silence through the whole handshake is the frozen peer the
			// progress timeout names, reported as it is on an open
			// connection so callers see one error for one fault.
			return "", nil, errs.Wrap(errs.PeerUnreachable, "tcp", err, "no answer from %s for %v while opening a data connection", addr, bound)
		}
		return "", nil, errs.Wrap(errs.CodeOf(err), "tcp", err, "data connection to %s", addr)
	}
	return o.PeerInstance, o.Session, nil
}

// Close fails every request in flight, closes the listener and every
// connection, and waits for the transport's goroutines.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed || t.addr == nil {
		t.closed = true
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	if t.loop != nil {
		t.loop.close()
	} else {
		t.ln.Close()
	}
	t.closeExtra()
	close(t.quit)
	for s := range t.served {
		s.nc.Close()
	}
	t.mu.Unlock()
	closed := errs.New(errs.Closed, "tcp", "transport closed")
	t.tef.pool.Close(closed)
	t.mcf.pool.Close(closed)
	t.resends.Wait()
	t.wg.Wait()
	t.closeGPU()
	return nil
}
