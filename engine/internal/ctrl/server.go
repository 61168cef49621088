package ctrl

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

func (c *Plane) acceptLoop() {
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
		if err != nil && c.evictPending(conn.RemoteAddr()) {
			release, err = c.lim.Admit(conn.RemoteAddr())
		}
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
			slots: make(chan struct{}, c.opt.Limits.MaxCallsPerConn), release: release, since: time.Now(), gone: make(chan struct{})}
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
		c.served.Add(1)
		c.mu.Unlock()
		go sc.serve(release)
	}
}

// srvConn is one accepted connection: one reader (serve) and the pool
// goroutines running its calls.
type srvConn struct {
	c       *Plane
	conn    net.Conn
	br      *bufio.Reader
	ctx     context.Context // canceled when the connection ends
	cancel  context.CancelFunc
	sender  string          // budget key, set once authenticated
	peer    string          // the initiator's proven segment name ("" without a secret)
	peerID  string          // its proven instance ("" without a secret)
	op      *session.Opener // the session's reading half (nil: none); the reader's
	seal    *session.Sealer // its writing half, under wmu
	slots   chan struct{}   // calls in flight on this connection
	wmu     sync.Mutex
	bw      *bufio.Writer // under wmu
	wdl     time.Time     // write deadline set last, under wmu
	waiting atomic.Int32  // repliers waiting for wmu
	last    atomic.Int64  // unix nanoseconds of the last reply
	// release gives back the connection's slot (idempotent); since is
	// when it was accepted; state is pending, authenticated or evicted.
	release func()
	since   time.Time
	state   atomic.Int32
	gone    chan struct{} // closed when serve has returned
}

// Connection states: a pending connection has not authenticated yet and is
// the first to go when a slot is needed.
const (
	statePending int32 = iota
	stateAuthenticated
	stateEvicted
)

// evictPending makes room for a connection from remote that the limiter
// refused: it closes the oldest connection that has not authenticated, from
// remote's address if there is one (the per-address cap), else from any,
// and gives its slot back at once. It reports whether it closed one. A
// flood of connections that never authenticate thus delays a peer with the
// secret by one exchange, never locks it out.
func (c *Plane) evictPending(remote net.Addr) bool {
	host := hostOf(remote)
	c.mu.Lock()
	var oldest, oldestHere *srvConn
	for sc := range c.conns {
		if sc.state.Load() != statePending {
			continue
		}
		if oldest == nil || sc.since.Before(oldest.since) {
			oldest = sc
		}
		if hostOf(sc.conn.RemoteAddr()) == host && (oldestHere == nil || sc.since.Before(oldestHere.since)) {
			oldestHere = sc
		}
	}
	c.mu.Unlock()
	victim := oldestHere
	if victim == nil {
		victim = oldest
	}
	if victim == nil || !victim.state.CompareAndSwap(statePending, stateEvicted) {
		return false
	}
	c.st.evicted.Add(1)
	victim.conn.Close()
	// Its reader ends at once on the closed socket: wait for it (a short
	// bound), so goroutines stay within the connection cap too.
	select {
	case <-victim.gone:
	case <-time.After(200 * time.Millisecond):
	}
	victim.release()
	return true
}

func (sc *srvConn) serve(release func()) {
	c := sc.c
	defer close(sc.gone)
	defer c.wg.Done()
	defer c.served.Done()
	defer release()
	defer func() {
		// The calls read are answered before the socket closes (a
		// notification already queued must not look lost to its sender):
		// their contexts end, so they end promptly, and their bodies
		// count against the bounds until they are done.
		sc.cancel()
		for i := 0; i < cap(sc.slots); i++ {
			sc.slots <- struct{}{}
		}
		sc.conn.Close()
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

// stop makes the connection read nothing more: its reader sees the end of
// the stream, while the replies of the calls it read still go out.
func (sc *srvConn) stop() {
	if tc, ok := sc.conn.(*net.TCPConn); ok && tc.CloseRead() == nil {
		return
	}
	sc.conn.Close()
}

// authenticate runs the server side of the exchange under the handshake
// deadline; nothing else is read before it succeeded.
func (sc *srvConn) authenticate() bool {
	c := sc.c
	dl := time.Now().Add(c.opt.Limits.HandshakeTimeout)
	sc.conn.SetReadDeadline(dl)
	hdr, err := sc.br.Peek(wire.FrameHeaderSize)
	if err != nil {
		if isTimeout(err) {
			c.st.handshakeTimeouts.Add(1)
		}
		return false
	}
	// The first frame says the dialect: te's opens with the
	// authentication exchange, a Mooncake peer's with its handshake
	// (mooncake.go), one exchange on a connection of its own.
	switch {
	case peerauth.IsAuthFrame(hdr):
	case wire.IsMooncakeKind(hdr[wire.OffFrameKind]) && c.opt.Mooncake:
		c.serveMooncake(sc.conn, sc.br)
		return false
	case wire.IsMooncakeKind(hdr[wire.OffFrameKind]):
		c.st.refusedMooncake.Add(1) // shut out by the secret
		return false
	default:
		c.st.refusedFrames.Add(1)
		return false
	}
	o, err := peerauth.ServerSession(peerauth.WithReader(sc.conn, sc.br), c.opt.Secret, c.opt.Instance, dl,
		c.opt.sessionOptions())
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
	if c.opt.Secret != nil {
		sc.sender = "instance " + o.PeerInstance
		sc.peer, sc.peerID = o.PeerName, o.PeerInstance
	} else {
		sc.sender = "address " + hostOf(sc.conn.RemoteAddr())
	}
	sc.seal, sc.op = o.Session.Split()
	if !sc.state.CompareAndSwap(statePending, stateAuthenticated) {
		return false // evicted while it authenticated
	}
	// Only now: a flood that never authenticates costs no reply buffer.
	sc.bw = bufio.NewWriterSize(sc.conn, 16<<10)
	return true
}

// readCall reads one request frame and hands it to the pool; false ends the
// connection.
func (sc *srvConn) readCall() bool {
	c := sc.c
	h, err := sc.readHeader()
	if err != nil {
		return false
	}
	kind, n := h.kind, h.n
	if kind < wire.KindDescribe || kind == wire.KindAuth {
		c.st.refusedFrames.Add(1)
		return false
	}
	if limit := wire.RequestLimit(kind); n > limit || n < wire.CallHeaderSize {
		c.st.refusedFrames.Add(1)
		if n > limit {
			sc.refuseOversize(h, limit)
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
	handler := c.handlers[kind]
	c.hmu.RUnlock()
	var reserved uint64
	if budgeted {
		if reserved, err = r.Reserve(sc.sender, n); err != nil {
			// Refused before the body is stored: drop it through a
			// small buffer and tell the sender.
			defer done()
			id, err2 := h.id, error(nil)
			if !h.call {
				id, err2 = sc.readCallID()
			}
			if err2 == nil {
				// In a session its records are opened all the same: they
				// count in the sequence.
				err2 = sc.op.DiscardBody(sc.br, n-wire.CallHeaderSize, sc.progress)
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
			r.Release(sc.sender, reserved)
		}
	}
	call, err := readPayload(sc.br, sc.op, sc.conn, h, c.opt.Limits.ProgressTimeout)
	if err != nil {
		unreserve()
		done()
		sc.noteReadErr(err)
		return false
	}
	if call.Flags != wire.FlagRequest {
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
		ci := &CallInfo{Sender: sc.sender, PeerName: sc.peer, PeerInstance: sc.peerID, Reserved: reserved}
		var flags uint8
		var out []byte
		if handler == nil {
			flags, out = wire.FlagReplyErr, wire.AppendError(nil, errs.NotSupported, "no handler for this message kind")
		} else if res, err := handler(context.WithValue(sc.ctx, callInfoKey{}, ci), call.Payload); err != nil {
			e := asError(err)
			msg := e.Error()
			if len(msg) > 4096 {
				msg = msg[:4096]
			}
			flags, out = wire.FlagReplyErr, wire.AppendError(nil, e.Code, msg)
		} else {
			flags, out = wire.FlagReplyOK, res
		}
		if budgeted && reserved > ci.Kept {
			r.Release(sc.sender, reserved-ci.Kept)
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
func (sc *srvConn) readHeader() (head, error) {
	c := sc.c
	idle := c.opt.Limits.IdleTimeout
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
			return head{}, err
		}
		if len(sc.slots) > 0 {
			sc.last.Store(time.Now().UnixNano()) // busy is not idle
			continue
		}
		if time.Duration(time.Now().UnixNano()-sc.last.Load()) >= idle {
			c.st.idleClosed.Add(1)
			return head{}, err
		}
	}
	h, err := readFrameHeader(sc.br, sc.op, sc.conn, c.opt.Limits.HandshakeTimeout)
	if err != nil {
		sc.noteReadErr(err)
	}
	return h, err
}

// noteReadErr counts why a read ended the connection: a deadline, a
// malformed frame, or a session record that did not open (logged: someone
// on the path tampers with the connection, or relays it).
func (sc *srvConn) noteReadErr(err error) {
	c := sc.c
	c.noteSlowIf(err)
	switch errs.CodeOf(err) {
	case errs.Protocol:
		c.st.refusedFrames.Add(1)
	case errs.Unauthenticated:
		c.st.refusedFrames.Add(1)
		c.logRefusal("te: closed a control connection whose frame did not authenticate", err)
	}
}

// progress sets the deadline for the next size bytes of a body, unless they
// are already buffered.
func (sc *srvConn) progress(size int) {
	if sc.br.Buffered() < size {
		sc.conn.SetReadDeadline(time.Now().Add(sc.c.opt.Limits.ProgressTimeout))
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
func (sc *srvConn) refuseOversize(h head, limit uint64) {
	id := h.id
	if !h.call {
		var b [wire.CallHeaderSize]byte
		sc.conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := io.ReadFull(sc.br, b[:]); err != nil {
			return
		}
		id = binary.LittleEndian.Uint64(b[wire.OffCallID:])
	}
	sc.reply(h.kind, id, wire.FlagReplyErr, wire.AppendError(nil, errs.TooLarge,
		errs.New(errs.TooLarge, "rpc", "a frame of %d bytes exceeds the limit of %d for kind %#x; the connection is closed", h.n, limit, h.kind).Error()))
}

// reply writes one reply frame; each 64 KiB of it must leave within
// ProgressTimeout (a peer that does not read its replies is cut off).
// Replies are buffered and the last of a run of concurrent repliers
// flushes, so pipelined calls share system calls and no reply waits for
// a call still running.
// testHookDropReply, when set, is asked before each reply is written; true
// cuts the connection instead (the call was served, its reply is lost).
var testHookDropReply atomic.Pointer[func(kind uint8) bool]

func (sc *srvConn) reply(kind uint8, id uint64, flags uint8, payload []byte) error {
	if h := testHookDropReply.Load(); h != nil && (*h)(kind) {
		sc.conn.Close()
		return errs.New(errs.PeerUnreachable, "rpc", "reply dropped (test)")
	}
	var h [callFrameHeader]byte
	putCallHeader(h[:], kind, id, flags, len(payload))
	sc.waiting.Add(1)
	sc.wmu.Lock()
	sc.waiting.Add(-1)
	defer sc.wmu.Unlock()
	if int(sc.seal.Size(uint64(len(h)+len(payload)))) > sc.bw.Available() {
		sc.writeDeadline()
	}
	// In a session, sealed here, under wmu: records go out in the order
	// they were sealed.
	var rec [sealedHeader]byte
	hdr, err := sc.seal.Seal(rec[:0], h[:])
	if err != nil {
		return err
	}
	sc.bw.Write(hdr)
	first := true
	err = sc.seal.WriteBody(sc.bw, payload, func(int) {
		if !first {
			sc.writeDeadline()
		}
		first = false
	})
	if err != nil {
		sc.c.noteSlowIf(err)
		return err
	}
	if sc.waiting.Load() > 0 {
		return nil // the next replier writes this one out with its own
	}
	sc.writeDeadline()
	err = sc.bw.Flush()
	sc.c.noteSlowIf(err)
	return err
}

// writeDeadline makes sure the next write has at least half of
// ProgressTimeout, and at most all of it; moving a deadline costs, so it
// moves only when half is spent. Callers hold wmu.
func (sc *srvConn) writeDeadline() {
	pt := sc.c.opt.Limits.ProgressTimeout
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
func (c *Plane) dispatch(f func()) {
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

func (c *Plane) worker(f func()) {
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
