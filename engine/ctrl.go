package engine

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/connlimit"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/wire"
)

type handler func(ctx context.Context, body []byte) ([]byte, error)

// reserver admits the body of a frame of one kind against a budget before
// the body is read: reserve returns how much it took (released by the
// control plane once the handler said how much it keeps) or a refusal.
type reserver struct {
	reserve func(sender string, bodyLen uint64) (uint64, error)
	release func(sender string, n uint64)
}

// callInfo travels to a handler in its context.
type callInfo struct {
	sender   string // budget key: the proven instance, or the remote IP
	reserved uint64 // taken by the kind's reserver before the body was read
	kept     uint64 // set by the handler: how much of reserved it keeps
}

type callInfoKey struct{}

func callInfoFrom(ctx context.Context) *callInfo {
	ci, _ := ctx.Value(callInfoKey{}).(*callInfo)
	return ci
}

// ctrlOptions is what the control plane needs of the engine's config.
type ctrlOptions struct {
	secret      *peerauth.Secret
	instance    string
	limits      Limits
	dialTimeout time.Duration
	logger      *slog.Logger
	// mooncake: answer a Mooncake peer's handshake (kinds 1 to 3) on a
	// connection that opens with one (no secret, or Mooncake peers are
	// allowed with it); else it is refused and counted.
	mooncake bool
}

// ctrlCounters count the control plane's refusals (Stats().Control).
type ctrlCounters struct {
	authRefused, authFailedOut, handshakeTimeouts atomic.Uint64
	idleClosed, slowClosed, refusedFrames         atomic.Uint64
	refusedMooncake, refusedNotifies, throttled   atomic.Uint64
	peerIdleClosed, acceptErrors                  atomic.Uint64
	callsInFlight                                 atomic.Int64
	lastRefusalLog                                atomic.Int64
	suppressedRefusalLogs                         atomic.Uint64
}

// workerIdle is how long a pool goroutine waits for another call before it
// exits: the pool shrinks back after a burst.
const workerIdle = time.Second

// ctrl is the engine's control plane: one listener serving descriptor
// fetch, notify, probe and the transports' own kinds, and one persistent,
// multiplexed client connection per peer. Every connection, accepted or
// dialled, opens with peerauth's exchange; every resource a peer can make
// it hold is bounded (spec.md, "Resource bounds").
type ctrl struct {
	opt    ctrlOptions
	ln     net.Listener
	lim    *connlimit.Limiter
	ctx    context.Context
	cancel context.CancelFunc

	hmu       sync.RWMutex
	handlers  map[uint8]handler
	reservers map[uint8]reserver

	calls      chan struct{} // engine-wide call slots (Limits.MaxCalls)
	jobs       chan func()   // hands a call to an idle pool goroutine
	workerGone chan struct{} // a pool goroutine exited: a waiting dispatch may start one
	workers    atomic.Int32

	mu     sync.Mutex
	conns  map[*srvConn]struct{} // accepted, for Close
	peers  map[string]*peerConn  // dialled, by address
	closed bool
	wg     sync.WaitGroup
	nextID atomic.Uint64

	st ctrlCounters
}

func newCtrl(ln net.Listener, opt ctrlOptions) *ctrl {
	ctx, cancel := context.WithCancel(context.Background())
	l := opt.limits
	return &ctrl{
		opt: opt, ln: ln, lim: connlimit.New(l.MaxConns, l.MaxConnsPerHost), ctx: ctx, cancel: cancel,
		handlers: map[uint8]handler{}, reservers: map[uint8]reserver{},
		calls: make(chan struct{}, l.MaxCalls), jobs: make(chan func()), workerGone: make(chan struct{}, 1),
		conns: map[*srvConn]struct{}{}, peers: map[string]*peerConn{},
	}
}

// Handle installs the handler for kind (transport.Control).
func (c *ctrl) Handle(kind uint8, h func(ctx context.Context, body []byte) ([]byte, error)) {
	c.hmu.Lock()
	c.handlers[kind] = h
	c.hmu.Unlock()
}

// reserveFor makes frames of kind pass r before their body is read.
func (c *ctrl) reserveFor(kind uint8, r reserver) {
	c.hmu.Lock()
	c.reservers[kind] = r
	c.hmu.Unlock()
}

func (c *ctrl) start() {
	c.wg.Add(1)
	go c.acceptLoop()
	if c.opt.limits.PeerIdleTimeout > 0 {
		c.wg.Add(1)
		go c.janitor()
	}
}

func (c *ctrl) acceptLoop() {
	defer c.wg.Done()
	backoff := 5 * time.Millisecond
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			if c.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors, say: wait and carry on rather
			// than stop serving for good.
			c.st.acceptErrors.Add(1)
			select {
			case <-c.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 5 * time.Millisecond
		release, err := c.lim.Admit(conn.RemoteAddr())
		if err != nil {
			// A fresh socket's send buffer is empty: this write does
			// not wait for the peer.
			peerauth.Refuse(conn, time.Now().Add(50*time.Millisecond))
			conn.Close()
			continue
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		ctx, cancel := context.WithCancel(c.ctx)
		sc := &srvConn{c: c, conn: conn, br: bufio.NewReader(conn), ctx: ctx, cancel: cancel,
			slots: make(chan struct{}, c.opt.limits.MaxCallsPerConn)}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			cancel()
			release()
			conn.Close()
			return
		}
		c.conns[sc] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go sc.serve(release)
	}
}

// srvConn is one accepted connection: one reader (serve) and the pool
// goroutines running its calls.
type srvConn struct {
	c       *ctrl
	conn    net.Conn
	br      *bufio.Reader
	ctx     context.Context // canceled when the connection ends
	cancel  context.CancelFunc
	sender  string        // budget key, set once authenticated
	slots   chan struct{} // calls in flight on this connection
	wmu     sync.Mutex
	bw      *bufio.Writer // under wmu
	wdl     time.Time     // write deadline set last, under wmu
	waiting atomic.Int32  // repliers waiting for wmu
	last    atomic.Int64  // unix nanoseconds of the last reply
}

func (sc *srvConn) serve(release func()) {
	c := sc.c
	defer c.wg.Done()
	defer release()
	defer func() {
		sc.cancel()
		sc.conn.Close()
		// Wait for this connection's calls: their bodies count against
		// the bounds until they are done.
		for i := 0; i < cap(sc.slots); i++ {
			sc.slots <- struct{}{}
		}
		c.mu.Lock()
		delete(c.conns, sc)
		c.mu.Unlock()
	}()
	if !sc.authenticate() {
		return
	}
	sc.last.Store(time.Now().UnixNano())
	for sc.readCall() {
	}
}

// authenticate runs the server side of the exchange under the handshake
// deadline; nothing else is read before it succeeded.
func (sc *srvConn) authenticate() bool {
	c := sc.c
	dl := time.Now().Add(c.opt.limits.HandshakeTimeout)
	sc.conn.SetReadDeadline(dl)
	hdr, err := sc.br.Peek(wire.FrameHeaderSize)
	if err != nil {
		if isTimeout(err) {
			c.st.handshakeTimeouts.Add(1)
		}
		return false
	}
	if !peerauth.IsAuthFrame(hdr) {
		if wire.IsMooncakeKind(hdr[wire.OffFrameKind]) {
			// A Mooncake peer's handshake: one exchange on a connection
			// of its own (ctrl_mooncake.go), or refused when Mooncake
			// peers are shut out by the secret.
			if c.opt.mooncake {
				c.serveMooncake(sc.conn, sc.br)
			} else {
				c.st.refusedMooncake.Add(1)
			}
		} else {
			c.st.refusedFrames.Add(1)
		}
		return false
	}
	peer, err := peerauth.Server(peerauth.WithReader(sc.conn, sc.br), c.opt.secret, c.opt.instance, dl)
	if err != nil {
		switch errs.CodeOf(err) {
		case errs.Timeout:
			c.st.handshakeTimeouts.Add(1)
		case errs.Unauthenticated:
			c.st.authRefused.Add(1)
			c.logRefusal("te: refused a control connection", err)
		case errs.PeerUnreachable:
		default:
			c.st.refusedFrames.Add(1)
		}
		return false
	}
	if c.opt.secret != nil {
		sc.sender = "instance " + peer
	} else {
		sc.sender = "address " + hostOf(sc.conn.RemoteAddr())
	}
	// Only now: a flood that never authenticates costs no reply buffer.
	sc.bw = bufio.NewWriterSize(sc.conn, 16<<10)
	return true
}

// readCall reads one request frame and hands it to the pool; false ends the
// connection.
func (sc *srvConn) readCall() bool {
	c := sc.c
	kind, n, err := sc.readHeader()
	if err != nil {
		return false
	}
	if kind < wire.KindDescribe || kind == wire.KindAuth {
		c.st.refusedFrames.Add(1)
		return false
	}
	if limit := wire.RequestLimit(kind); n > limit || n < wire.CallHeaderSize {
		c.st.refusedFrames.Add(1)
		if n > limit {
			sc.refuseOversize(kind, n, limit)
		}
		return false
	}
	// Backpressure: at the bound, stop reading this connection until one
	// of its calls ends.
	if !acquire(sc.ctx, sc.slots, &c.st.throttled) {
		return false
	}
	done := func() { <-sc.slots }
	c.hmu.RLock()
	r, budgeted := c.reservers[kind]
	h := c.handlers[kind]
	c.hmu.RUnlock()
	var reserved uint64
	if budgeted {
		if reserved, err = r.reserve(sc.sender, n); err != nil {
			// Refused before the body is stored: drop it through a
			// small buffer and tell the sender.
			defer done()
			id, err2 := sc.readCallID()
			if err2 == nil {
				err2 = wire.DiscardBody(sc.br, n-wire.CallHeaderSize, sc.progress)
			}
			if err2 != nil {
				c.noteSlowIf(err2)
				return false
			}
			e := asError(err)
			return sc.reply(kind, id, wire.FlagReplyErr, wire.AppendError(nil, e.Code, e.Error())) == nil
		}
	}
	unreserve := func() {
		if budgeted && reserved > 0 {
			r.release(sc.sender, reserved)
		}
	}
	body, err := wire.ReadBody(sc.br, n, sc.progress)
	if err != nil {
		unreserve()
		done()
		c.noteSlowIf(err)
		return false
	}
	call, err := wire.DecodeCall(body)
	if err != nil || call.Flags != wire.FlagRequest {
		unreserve()
		done()
		c.st.refusedFrames.Add(1)
		return false
	}
	// An engine-wide slot: at the bound every reader waits here.
	if !acquire(sc.ctx, c.calls, &c.st.throttled) {
		unreserve()
		done()
		return false
	}
	c.st.callsInFlight.Add(1)
	c.dispatch(func() {
		defer func() {
			c.st.callsInFlight.Add(-1)
			<-c.calls
			done()
		}()
		ci := &callInfo{sender: sc.sender, reserved: reserved}
		var flags uint8
		var out []byte
		if h == nil {
			flags, out = wire.FlagReplyErr, wire.AppendError(nil, errs.NotSupported, "no handler for this message kind")
		} else if res, err := h(context.WithValue(sc.ctx, callInfoKey{}, ci), call.Payload); err != nil {
			e := asError(err)
			msg := e.Error()
			if len(msg) > 4096 {
				msg = msg[:4096]
			}
			flags, out = wire.FlagReplyErr, wire.AppendError(nil, e.Code, msg)
		} else {
			flags, out = wire.FlagReplyOK, res
		}
		if budgeted && reserved > ci.kept {
			r.release(sc.sender, reserved-ci.kept)
		}
		if sc.reply(kind, call.ID, flags, out) != nil {
			sc.conn.Close()
		}
		sc.last.Store(time.Now().UnixNano())
	})
	return true
}

// readHeader waits for the next frame (closing the connection once it was
// idle for IdleTimeout with nothing in flight), then reads the header under
// the handshake deadline. Bytes already buffered (pipelined calls) need no
// deadline.
func (sc *srvConn) readHeader() (uint8, uint64, error) {
	c := sc.c
	idle := c.opt.limits.IdleTimeout
	for sc.br.Buffered() == 0 {
		if idle > 0 {
			since := time.Duration(time.Now().UnixNano() - sc.last.Load())
			sc.conn.SetReadDeadline(time.Now().Add(max(idle-since, time.Millisecond)))
		} else {
			sc.conn.SetReadDeadline(time.Time{})
		}
		_, err := sc.br.Peek(1)
		if err == nil {
			break
		}
		if !isTimeout(err) {
			return 0, 0, err
		}
		if len(sc.slots) > 0 {
			sc.last.Store(time.Now().UnixNano()) // busy is not idle
			continue
		}
		if time.Duration(time.Now().UnixNano()-sc.last.Load()) >= idle {
			c.st.idleClosed.Add(1)
			return 0, 0, err
		}
	}
	if sc.br.Buffered() < wire.FrameHeaderSize {
		sc.conn.SetReadDeadline(time.Now().Add(c.opt.limits.HandshakeTimeout))
	}
	kind, n, err := wire.ReadFrameHeader(sc.br)
	if err != nil {
		c.noteSlowIf(err)
		if errs.CodeOf(err) == errs.Protocol {
			c.st.refusedFrames.Add(1)
		}
	}
	return kind, n, err
}

// progress sets the deadline for the next size bytes of a body, unless they
// are already buffered.
func (sc *srvConn) progress(size int) {
	if sc.br.Buffered() < size {
		sc.conn.SetReadDeadline(time.Now().Add(sc.c.opt.limits.ProgressTimeout))
	}
}

func (sc *srvConn) readCallID() (uint64, error) {
	var h [wire.CallHeaderSize]byte
	sc.progress(len(h))
	if _, err := io.ReadFull(sc.br, h[:]); err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(h[wire.OffCallID:]), nil
}

// refuseOversize answers the call (if its id arrives in time) with
// TooLarge before the connection is closed: the body's claimed length
// cannot be trusted, so nothing after it is read.
func (sc *srvConn) refuseOversize(kind uint8, n, limit uint64) {
	var h [wire.CallHeaderSize]byte
	sc.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := io.ReadFull(sc.br, h[:]); err == nil {
		id := binary.LittleEndian.Uint64(h[wire.OffCallID:])
		sc.reply(kind, id, wire.FlagReplyErr, wire.AppendError(nil, errs.TooLarge,
			errs.New(errs.TooLarge, "rpc", "a frame of %d bytes exceeds the limit of %d for kind %#x; the connection is closed", n, limit, kind).Error()))
	}
}

// reply writes one reply frame; each 64 KiB of it must leave within
// ProgressTimeout (a peer that does not read its replies is cut off).
// Replies are buffered and the last of a run of concurrent repliers
// flushes, so pipelined calls share system calls and no reply waits for
// a call still running.
func (sc *srvConn) reply(kind uint8, id uint64, flags uint8, payload []byte) error {
	var h [wire.FrameHeaderSize + wire.CallHeaderSize]byte
	binary.LittleEndian.PutUint64(h[wire.OffFrameLength:], uint64(1+wire.CallHeaderSize+len(payload)))
	h[wire.OffFrameKind] = kind
	binary.LittleEndian.PutUint64(h[wire.FrameHeaderSize+wire.OffCallID:], id)
	h[wire.FrameHeaderSize+wire.OffCallFlags] = flags
	sc.waiting.Add(1)
	sc.wmu.Lock()
	sc.waiting.Add(-1)
	defer sc.wmu.Unlock()
	if len(h)+len(payload) > sc.bw.Available() {
		sc.writeDeadline()
	}
	sc.bw.Write(h[:])
	for off := 0; off < len(payload); off += wire.BodyChunk {
		if off > 0 {
			sc.writeDeadline()
		}
		if _, err := sc.bw.Write(payload[off:min(len(payload), off+wire.BodyChunk)]); err != nil {
			sc.c.noteSlowIf(err)
			return err
		}
	}
	if sc.waiting.Load() > 0 {
		return nil // the next replier writes this one out with its own
	}
	sc.writeDeadline()
	err := sc.bw.Flush()
	sc.c.noteSlowIf(err)
	return err
}

// writeDeadline makes sure the next write has at least half of
// ProgressTimeout, and at most all of it; moving a deadline costs, so it
// moves only when half is spent. Callers hold wmu.
func (sc *srvConn) writeDeadline() {
	pt := sc.c.opt.limits.ProgressTimeout
	now := time.Now()
	if sc.wdl.Sub(now) < pt/2 {
		sc.wdl = now.Add(pt)
		sc.conn.SetWriteDeadline(sc.wdl)
	}
}

// acquire takes a slot of sem, counting a wait in throttled; false when
// ctx ended first.
func acquire(ctx context.Context, sem chan struct{}, throttled *atomic.Uint64) bool {
	select {
	case sem <- struct{}{}:
		return true
	default:
	}
	throttled.Add(1)
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// dispatch runs f on a pool goroutine. The caller holds an engine-wide call
// slot, so at most MaxCalls calls run; the pool has at most MaxCalls
// goroutines, started as needed and gone after workerIdle without work.
func (c *ctrl) dispatch(f func()) {
	max := int32(cap(c.calls))
	for {
		select {
		case c.jobs <- f:
			return
		default:
		}
		if n := c.workers.Load(); n < max {
			if c.workers.CompareAndSwap(n, n+1) {
				c.wg.Add(1)
				go c.worker(f)
				return
			}
			continue
		}
		// Every pool goroutine exists; since this caller holds a slot,
		// one of them is between calls and will take f, unless it is
		// exiting, which workerGone reports.
		select {
		case c.jobs <- f:
			return
		case <-c.workerGone:
		case <-c.ctx.Done():
			f() // closing: the call fails on its canceled context
			return
		}
	}
}

func (c *ctrl) worker(f func()) {
	defer c.wg.Done()
	t := time.NewTimer(workerIdle)
	defer t.Stop()
	for {
		f()
		t.Reset(workerIdle)
		select {
		case f = <-c.jobs:
			continue
		case <-t.C:
		case <-c.ctx.Done():
		}
		c.workers.Add(-1)
		select {
		case c.workerGone <- struct{}{}:
		default:
		}
		return
	}
}

func (c *ctrl) noteSlowIf(err error) {
	if isTimeout(err) {
		c.st.slowClosed.Add(1)
	}
}

// logRefusal logs at most one refusal a second: a peer hammering the port
// must not flood the host's log.
func (c *ctrl) logRefusal(msg string, err error) {
	now := time.Now().UnixNano()
	last := c.st.lastRefusalLog.Load()
	if now-last < int64(time.Second) || !c.st.lastRefusalLog.CompareAndSwap(last, now) {
		c.st.suppressedRefusalLogs.Add(1)
		return
	}
	c.opt.logger.Warn(msg, "err", err.Error(), "suppressed_since_last", c.st.suppressedRefusalLogs.Swap(0))
}

func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

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

type reply struct {
	flags   uint8
	payload []byte
}

type peerConn struct {
	addr     string
	instance string // the peer's instance id, proven when a secret is set
	conn     net.Conn
	wmu      sync.Mutex
	mu       sync.Mutex
	pending  map[uint64]chan reply
	dead     chan struct{}
	err      error
	reused   atomic.Bool  // handed out before: may have died unnoticed
	lastUsed atomic.Int64 // unix nanoseconds of the last handout
}

func (p *peerConn) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return
	}
	p.err = err
	close(p.dead)
	p.conn.Close()
}

func (c *ctrl) peer(ctx context.Context, addr string) (*peerConn, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errs.New(errs.Closed, "rpc", "engine closed")
	}
	if p := c.peers[addr]; p != nil {
		select {
		case <-p.dead:
			delete(c.peers, addr)
		default:
			p.lastUsed.Store(time.Now().UnixNano())
			c.mu.Unlock()
			p.reused.Store(true)
			return p, nil
		}
	}
	c.mu.Unlock()

	d := net.Dialer{Timeout: c.opt.dialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errs.Wrap(errs.PeerUnreachable, "rpc", err, "connect to %s", addr)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	dl := time.Now().Add(c.opt.limits.HandshakeTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(dl) {
		dl = cd
	}
	inst, err := peerauth.Client(conn, c.opt.secret, c.opt.instance, dl)
	if err != nil {
		conn.Close()
		if errs.CodeOf(err) == errs.Unauthenticated {
			c.st.authFailedOut.Add(1)
		}
		return nil, err
	}
	p := &peerConn{addr: addr, instance: inst, conn: conn, pending: map[uint64]chan reply{}, dead: make(chan struct{})}
	p.lastUsed.Store(time.Now().UnixNano())
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		conn.Close()
		return nil, errs.New(errs.Closed, "rpc", "engine closed")
	}
	if q := c.peers[addr]; q != nil {
		select {
		case <-q.dead:
		default:
			q.lastUsed.Store(time.Now().UnixNano())
			c.mu.Unlock()
			conn.Close()
			return q, nil
		}
	}
	c.peers[addr] = p
	c.wg.Add(1)
	c.mu.Unlock()
	go c.readReplies(p)
	return p, nil
}

func (c *ctrl) readReplies(p *peerConn) {
	defer c.wg.Done()
	lim := c.opt.limits
	r := bufio.NewReader(p.conn)
	progress := func(size int) {
		if r.Buffered() < size {
			p.conn.SetReadDeadline(time.Now().Add(lim.ProgressTimeout))
		}
	}
	for {
		// Between replies there is no deadline: the janitor closes an
		// idle connection, and each call has its own.
		if r.Buffered() == 0 {
			p.conn.SetReadDeadline(time.Time{})
			if _, err := r.Peek(1); err != nil {
				p.fail(errs.Wrap(errs.PeerUnreachable, "rpc", err, "connection to %s lost", p.addr))
				return
			}
		}
		if r.Buffered() < wire.FrameHeaderSize {
			p.conn.SetReadDeadline(time.Now().Add(lim.HandshakeTimeout))
		}
		kind, n, err := wire.ReadFrameHeader(r)
		if err != nil {
			c.noteSlowIf(err)
			p.fail(errs.Wrap(errs.PeerUnreachable, "rpc", err, "connection to %s lost", p.addr))
			return
		}
		if limit := wire.ReplyLimit(kind, lim.MaxFrame); n > limit || kind < wire.KindDescribe || kind == wire.KindAuth {
			c.st.refusedFrames.Add(1)
			p.fail(errs.New(errs.TooLarge, "rpc", "%s sent a reply of kind %#x and %d bytes (limit %d); connection closed", p.addr, kind, n, limit).
				WithHint("a descriptor above Limits.MaxFrame needs a larger limit on this side"))
			return
		}
		body, err := wire.ReadBody(r, n, progress)
		if err != nil {
			c.noteSlowIf(err)
			p.fail(errs.Wrap(errs.PeerUnreachable, "rpc", err, "connection to %s lost", p.addr))
			return
		}
		call, err := wire.DecodeCall(body)
		if err != nil || call.Flags == wire.FlagRequest {
			p.fail(errs.New(errs.Protocol, "rpc", "bad reply from %s", p.addr))
			return
		}
		p.mu.Lock()
		ch := p.pending[call.ID]
		delete(p.pending, call.ID)
		p.mu.Unlock()
		if ch != nil {
			ch <- reply{call.Flags, call.Payload}
		}
	}
}

// janitor closes dialled connections idle for PeerIdleTimeout.
func (c *ctrl) janitor() {
	defer c.wg.Done()
	idle := c.opt.limits.PeerIdleTimeout
	t := time.NewTicker(min(max(idle/4, 10*time.Millisecond), 30*time.Second))
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now().UnixNano()
		var gone []*peerConn
		c.mu.Lock()
		for addr, p := range c.peers {
			p.mu.Lock()
			busy := len(p.pending) > 0
			p.mu.Unlock()
			if !busy && time.Duration(now-p.lastUsed.Load()) >= idle {
				delete(c.peers, addr)
				gone = append(gone, p)
			}
		}
		c.mu.Unlock()
		for _, p := range gone {
			// PeerUnreachable: a call that raced the close redials.
			p.fail(errs.New(errs.PeerUnreachable, "rpc", "idle connection to %s closed", p.addr))
			c.st.peerIdleClosed.Add(1)
		}
	}
}

// Call sends a request to the peer's control address and waits for its reply,
// the context's end, or the connection's loss, whichever comes first.
func (c *ctrl) Call(ctx context.Context, addr string, kind uint8, body []byte) ([]byte, error) {
	if limit := wire.RequestLimit(kind); uint64(len(body))+wire.CallHeaderSize > limit {
		return nil, errs.New(errs.TooLarge, "rpc", "message of %d bytes exceeds the limit of %d for kind %#x", len(body), limit-wire.CallHeaderSize, kind)
	}
	p, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	res, err := c.call(ctx, p, addr, kind, body)
	if err != nil && p.reused.Load() && errs.CodeOf(err) == errs.PeerUnreachable && ctx.Err() == nil {
		// A pooled connection can be dead before its reader has noticed
		// (the peer restarted under the same address, or closed it as
		// idle): dial once more. The old peer is gone, so the new one
		// cannot see the call twice.
		if p2, err2 := c.peer(ctx, addr); err2 == nil && p2 != p {
			return c.call(ctx, p2, addr, kind, body)
		}
	}
	return res, err
}

func (c *ctrl) call(ctx context.Context, p *peerConn, addr string, kind uint8, body []byte) ([]byte, error) {
	id := c.nextID.Add(1)
	ch := make(chan reply, 1)
	p.mu.Lock()
	if p.err != nil {
		p.mu.Unlock()
		return nil, p.err
	}
	p.pending[id] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.pending, id)
		p.mu.Unlock()
		p.lastUsed.Store(time.Now().UnixNano())
	}()
	frame := wire.AppendFrame(nil, kind, wire.AppendCall(nil, id, wire.FlagRequest, body))
	p.wmu.Lock()
	if dl, ok := ctx.Deadline(); ok {
		p.conn.SetWriteDeadline(dl)
	} else {
		p.conn.SetWriteDeadline(time.Time{})
	}
	_, err := p.conn.Write(frame)
	p.wmu.Unlock()
	if err != nil {
		p.fail(errs.Wrap(errs.PeerUnreachable, "rpc", err, "send to %s", addr))
		return nil, errs.Wrap(errs.PeerUnreachable, "rpc", err, "send to %s", addr)
	}
	select {
	case r := <-ch:
		if r.flags == wire.FlagReplyErr {
			return nil, wire.DecodeError(r.payload)
		}
		return r.payload, nil
	case <-p.dead:
		return nil, p.err
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, errs.Wrap(errs.Timeout, "rpc", ctx.Err(), "no reply from %s", addr)
		}
		return nil, errs.Wrap(errs.Canceled, "rpc", ctx.Err(), "call to %s", addr)
	}
}

// close stops the listener, drops every connection and waits for the
// goroutines: in-flight calls fail with the connection's loss.
func (c *ctrl) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.cancel()
	c.ln.Close()
	for sc := range c.conns {
		sc.conn.Close()
	}
	peers := make([]*peerConn, 0, len(c.peers))
	for _, p := range c.peers {
		peers = append(peers, p)
	}
	c.mu.Unlock()
	for _, p := range peers {
		p.fail(errs.New(errs.Closed, "rpc", "engine closed"))
	}
	c.wg.Wait()
}

func (e *Engine) controlStats() ControlStats {
	c := e.ctrl
	ls := c.lim.Stats()
	e.nq.mu.Lock()
	nb := e.nq.total
	e.nq.mu.Unlock()
	return ControlStats{
		Authenticated:       e.secret != nil,
		ConnsOpen:           ls.Open,
		ConnsPeak:           ls.Peak,
		ConnsAccepted:       ls.Accepted,
		RefusedConns:        ls.RefusedTotal,
		RefusedConnsPerHost: ls.RefusedPerHost,
		AuthRefused:         c.st.authRefused.Load(),
		AuthFailedOutbound:  c.st.authFailedOut.Load(),
		HandshakeTimeouts:   c.st.handshakeTimeouts.Load(),
		IdleClosed:          c.st.idleClosed.Load(),
		PeerIdleClosed:      c.st.peerIdleClosed.Load(),
		SlowClosed:          c.st.slowClosed.Load(),
		RefusedFrames:       c.st.refusedFrames.Load(),
		RefusedMooncake:     c.st.refusedMooncake.Load(),
		RefusedNotifies:     c.st.refusedNotifies.Load(),
		NotifyBytes:         nb,
		CallsInFlight:       c.st.callsInFlight.Load(),
		CallsThrottled:      c.st.throttled.Load(),
		AcceptErrors:        c.st.acceptErrors.Load(),
	}
}
