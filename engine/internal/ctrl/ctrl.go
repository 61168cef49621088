package ctrl

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
)

// Handler serves one kind of call: the body in, the reply out, or an error
// the caller receives as one.
type Handler func(ctx context.Context, body []byte) ([]byte, error)

// Reserver admits the body of a frame of one kind against a budget before
// the body is read: Reserve returns how much it took (released by the plane
// once the handler said how much it keeps, CallInfo.Kept) or a refusal,
// which the caller receives.
type Reserver struct {
	Reserve func(sender string, bodyLen uint64) (uint64, error)
	Release func(sender string, n uint64)
}

// CallInfo travels to a handler in its context (Info).
type CallInfo struct {
	Sender string // budget key: "instance <proven id>", or "address <IP>"
	// PeerName and PeerInstance are the calling engine's segment name and
	// instance id as its session proved them; both empty without a
	// secret (nothing is proven then) and for Mooncake peers, and
	// PeerName is empty for an initiator that has no segment.
	PeerName, PeerInstance string
	Reserved               uint64 // taken by the kind's Reserver before the body was read
	Kept                   uint64 // set by the handler: how much of Reserved it keeps
}

type callInfoKey struct{}

// Info returns the CallInfo of the call ctx was given to, or nil.
func Info(ctx context.Context) *CallInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*CallInfo)
	return ci
}

// Limits are the bounds the plane applies (engine.Config.Limits, defaults
// filled in).
type Limits struct {
	connlimit.Policy
	MaxCalls        int    // calls in flight in the engine
	MaxCallsPerConn int    // calls in flight on one accepted connection
	MaxFrame        uint64 // largest descriptor a Describe reply may carry
}

// Options are what the plane needs of the engine's config.
type Options struct {
	Secret *peerauth.Secret // nil: peers are not authenticated
	// Encrypt seals control bodies with encryption rather than
	// integrity alone (either side asking is enough); needs Secret.
	Encrypt  bool
	Instance string // this engine's, proven to peers
	// Name and Addr are this engine's segment name and RPC address,
	// proven to peers with the secret (version 3 of the exchange).
	Name, Addr  string
	Limits      Limits
	DialTimeout time.Duration
	Logger      *slog.Logger
	// Mooncake: answer a Mooncake peer's handshake (kinds 1 to 3) on a
	// connection that opens with one (no secret, or Mooncake peers are
	// allowed with it); else it is refused and counted.
	Mooncake bool
}

// counters count the plane's refusals (Stats).
type counters struct {
	authRefused, authFailedOut, handshakeTimeouts atomic.Uint64
	idleClosed, slowClosed, refusedFrames         atomic.Uint64
	refusedMooncake, refusedNotifies, throttled   atomic.Uint64
	acceptErrors, wrongPeer, evicted              atomic.Uint64
	callsInFlight                                 atomic.Int64
	lastRefusalLog                                atomic.Int64
	suppressedRefusalLogs                         atomic.Uint64
}

// Stats are the plane's counters (engine.ControlStats has their meaning).
type Stats struct {
	ConnsOpen, ConnsPeak                               int
	ConnsAccepted, RefusedConns, RefusedConnsPerHost   uint64
	AuthRefused, AuthFailedOutbound, HandshakeTimeouts uint64
	IdleClosed, PeerIdleClosed, SlowClosed             uint64
	RefusedFrames, RefusedMooncake, RefusedNotifies    uint64
	CallsInFlight                                      int64
	CallsThrottled, AcceptErrors                       uint64
	// WrongPeer counts calls refused unsent because the connection's
	// server proved another segment than the one meant.
	WrongPeer uint64
	// EvictedPending counts connections closed before they authenticated
	// to make room for a new one.
	EvictedPending uint64
	// Peers is the peers the dialled pool holds, PeerConnsOpen their
	// connections alive now.
	Peers, PeerConnsOpen int
}

// workerIdle is how long a pool goroutine waits for another call before it
// exits: the pool shrinks back after a burst.
const workerIdle = time.Second

// closeGrace bounds how long Close waits for calls already read to reply
// before it closes their connections anyway (a peer that does not read its
// replies).
const closeGrace = 2 * time.Second

// Plane is the control plane: the listener and its accepted connections
// (server.go), and the pooled connections to peers (client.go).
type Plane struct {
	opt    Options
	ln     net.Listener
	lim    *connlimit.Limiter
	ctx    context.Context // canceled by Close
	cancel context.CancelFunc

	hmu       sync.RWMutex
	handlers  map[uint8]Handler
	reservers map[uint8]Reserver

	calls      chan struct{} // engine-wide call slots (Limits.MaxCalls)
	jobs       chan func()   // hands a call to an idle pool goroutine
	workerGone chan struct{} // a pool goroutine exited: a waiting dispatch may start one
	workers    atomic.Int32

	pool *pipe.Pool[*call] // dialled connections, one per peer

	mu     sync.Mutex
	conns  map[*srvConn]struct{} // accepted, for Close
	closed bool
	wg     sync.WaitGroup // every goroutine of the plane
	served sync.WaitGroup // the accepted connections' readers

	st counters
}

// New returns a plane serving ln; Start starts serving.
func New(ln net.Listener, opt Options) *Plane {
	ctx, cancel := context.WithCancel(context.Background())
	l := opt.Limits
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	c := &Plane{
		opt: opt, ln: ln, lim: connlimit.New(l.MaxConns, l.MaxConnsPerHost), ctx: ctx, cancel: cancel,
		handlers: map[uint8]Handler{}, reservers: map[uint8]Reserver{},
		calls: make(chan struct{}, max(l.MaxCalls, 1)), jobs: make(chan func()), workerGone: make(chan struct{}, 1),
		conns: map[*srvConn]struct{}{},
	}
	// Silence: a dialled connection with calls in flight whose peer sends
	// nothing for the progress timeout is cut, and calls that may be sent
	// again go on a fresh one. Without it a connection whose stream stalled
	// (a path that dropped it, TCP retransmissions backed off for seconds
	// after a partition healed) kept every later call waiting behind it
	// until each timed out.
	c.pool = pipe.New[*call](callDialect{c}, pipe.Options{Conns: 1, PeerIdle: l.PeerIdleTimeout, ReadBuffer: 16 << 10,
		Component: "rpc", Silence: l.ProgressTimeout})
	return c
}

// Handle installs the handler for kind.
func (c *Plane) Handle(kind uint8, h func(ctx context.Context, body []byte) ([]byte, error)) {
	c.hmu.Lock()
	c.handlers[kind] = h
	c.hmu.Unlock()
}

// Reserve makes frames of kind pass r before their body is read.
func (c *Plane) Reserve(kind uint8, r Reserver) {
	c.hmu.Lock()
	c.reservers[kind] = r
	c.hmu.Unlock()
}

// Addr returns the listener's address.
func (c *Plane) Addr() net.Addr { return c.ln.Addr() }

// Start serves the listener.
func (c *Plane) Start() {
	c.wg.Add(1)
	go c.acceptLoop()
}

// RefusedNotify counts a notification refused over a bound of the engine's.
func (c *Plane) RefusedNotify() { c.st.refusedNotifies.Add(1) }

// testHookDraining, when set, runs in Close once no accepted connection
// reads new calls and before Close waits for those running.
var testHookDraining func()

// Close stops the listener and the reading of new calls, cancels the
// contexts of the calls running and lets them reply (closeGrace at most),
// then drops every connection and waits for the goroutines: calls this plane
// made fail with Closed.
func (c *Plane) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.cancel()
	c.ln.Close()
	conns := slices.Collect(maps.Keys(c.conns))
	c.mu.Unlock()
	for _, sc := range conns {
		sc.stop()
	}
	if testHookDraining != nil {
		testHookDraining()
	}
	c.pool.Close(errs.New(errs.Closed, "rpc", "engine closed"))
	drained := make(chan struct{})
	go func() {
		c.served.Wait()
		close(drained)
	}()
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-drained:
	case <-grace.C:
		c.mu.Lock()
		for sc := range c.conns {
			sc.conn.Close()
		}
		c.mu.Unlock()
		<-drained
	}
	c.wg.Wait()
}

// Stats returns the plane's counters.
func (c *Plane) Stats() Stats {
	ls := c.lim.Stats()
	peers, conns := c.pool.Live()
	return Stats{
		Peers:               peers,
		PeerConnsOpen:       conns,
		ConnsOpen:           ls.Open,
		ConnsPeak:           ls.Peak,
		ConnsAccepted:       ls.Accepted,
		RefusedConns:        ls.RefusedTotal,
		RefusedConnsPerHost: ls.RefusedPerHost,
		AuthRefused:         c.st.authRefused.Load(),
		AuthFailedOutbound:  c.st.authFailedOut.Load(),
		HandshakeTimeouts:   c.st.handshakeTimeouts.Load(),
		IdleClosed:          c.st.idleClosed.Load(),
		PeerIdleClosed:      c.pool.Pruned(),
		SlowClosed:          c.st.slowClosed.Load(),
		RefusedFrames:       c.st.refusedFrames.Load(),
		RefusedMooncake:     c.st.refusedMooncake.Load(),
		RefusedNotifies:     c.st.refusedNotifies.Load(),
		CallsInFlight:       c.st.callsInFlight.Load(),
		CallsThrottled:      c.st.throttled.Load(),
		AcceptErrors:        c.st.acceptErrors.Load(),
		WrongPeer:           c.st.wrongPeer.Load(),
		EvictedPending:      c.st.evicted.Load(),
	}
}

func (c *Plane) noteSlowIf(err error) {
	if isTimeout(err) {
		c.st.slowClosed.Add(1)
	}
}

// logRefusal logs at most one refusal a second: a peer hammering the port
// must not flood the host's log.
func (c *Plane) logRefusal(msg string, err error) {
	now := time.Now().UnixNano()
	last := c.st.lastRefusalLog.Load()
	if now-last < int64(time.Second) || !c.st.lastRefusalLog.CompareAndSwap(last, now) {
		c.st.suppressedRefusalLogs.Add(1)
		return
	}
	c.opt.Logger.Warn(msg, "err", err.Error(), "suppressed_since_last", c.st.suppressedRefusalLogs.Swap(0))
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// hostOf returns the IP of a, the budget key of a peer without a proven
// identity.
func hostOf(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.IP.String()
	}
	if a == nil {
		return ""
	}
	return a.String()
}

func asError(err error) *errs.Error {
	var e *errs.Error
	if errors.As(err, &e) {
		return e
	}
	return errs.Wrap(errs.Internal, "", err, "")
}

// sessionOptions are the control connections' session settings. A control
// connection carries no data payloads, so headers mode already
// authenticates every byte after the opening; asking for it (rather than
// payload integrity) keeps control connections open to engines that
// predate that mode.
func (o Options) sessionOptions() peerauth.SessionOptions {
	return peerauth.SessionOptions{Channel: session.Control, Encrypt: o.Encrypt, HeadersOnly: true, Name: o.Name, Addr: o.Addr}
}
