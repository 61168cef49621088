package engine

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/wire"
)

type handler func(ctx context.Context, body []byte) ([]byte, error)

// ctrl is the engine's control plane: one listener serving handshake,
// descriptor fetch, notify, probe and the transports' own kinds, and one
// persistent, multiplexed client connection per peer.
type ctrl struct {
	maxFrame    uint64
	dialTimeout time.Duration
	ln          net.Listener
	ctx         context.Context
	cancel      context.CancelFunc

	hmu      sync.RWMutex
	handlers map[uint8]handler

	mu     sync.Mutex
	conns  map[net.Conn]struct{} // accepted, for Close
	peers  map[string]*peerConn  // dialled, by address
	closed bool
	wg     sync.WaitGroup
	nextID atomic.Uint64
}

func newCtrl(ln net.Listener, maxFrame uint64, dialTimeout time.Duration) *ctrl {
	ctx, cancel := context.WithCancel(context.Background())
	c := &ctrl{
		maxFrame: maxFrame, dialTimeout: dialTimeout, ln: ln, ctx: ctx, cancel: cancel,
		handlers: map[uint8]handler{}, conns: map[net.Conn]struct{}{}, peers: map[string]*peerConn{},
	}
	return c
}

func (c *ctrl) Handle(kind uint8, h func(ctx context.Context, body []byte) ([]byte, error)) {
	c.hmu.Lock()
	c.handlers[kind] = h
	c.hmu.Unlock()
}

func (c *ctrl) start() {
	c.wg.Add(1)
	go c.acceptLoop()
}

func (c *ctrl) acceptLoop() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.Accept()
		if err != nil {
			return // listener closed
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			conn.Close()
			return
		}
		c.conns[conn] = struct{}{}
		c.wg.Add(1)
		c.mu.Unlock()
		go c.serve(conn)
	}
}

func (c *ctrl) serve(conn net.Conn) {
	defer c.wg.Done()
	defer func() {
		c.mu.Lock()
		delete(c.conns, conn)
		c.mu.Unlock()
		conn.Close()
	}()
	var wmu sync.Mutex
	var calls sync.WaitGroup
	defer calls.Wait()
	r := bufio.NewReader(conn)
	if c.mooncakeFirst(conn, r) { // a Mooncake peer's handshake (ctrl_mooncake.go)
		return
	}
	for {
		kind, body, err := wire.ReadFrame(r, c.maxFrame)
		if err != nil {
			return
		}
		if kind < wire.KindDescribe {
			// Mooncake's handshake kinds open a connection of their own
			// (one exchange each); later in a te connection they are
			// out of place.
			return
		}
		call, err := wire.DecodeCall(body)
		if err != nil || call.Flags != wire.FlagRequest {
			return
		}
		c.hmu.RLock()
		h := c.handlers[kind]
		c.hmu.RUnlock()
		calls.Add(1)
		go func() {
			defer calls.Done()
			var out []byte
			if h == nil {
				out = wire.AppendCall(nil, call.ID, wire.FlagReplyErr,
					wire.AppendError(nil, errs.NotSupported, "no handler for this message kind"))
			} else if res, err := h(c.ctx, call.Payload); err != nil {
				e := asError(err)
				out = wire.AppendCall(nil, call.ID, wire.FlagReplyErr, wire.AppendError(nil, e.Code, e.Error()))
			} else {
				out = wire.AppendCall(nil, call.ID, wire.FlagReplyOK, res)
			}
			frame := wire.AppendFrame(nil, kind, out)
			wmu.Lock()
			conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
			_, err := conn.Write(frame)
			wmu.Unlock()
			if err != nil {
				conn.Close()
			}
		}()
	}
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
	addr    string
	conn    net.Conn
	wmu     sync.Mutex
	mu      sync.Mutex
	pending map[uint64]chan reply
	dead    chan struct{}
	err     error
	reused  atomic.Bool // handed out before: may have died unnoticed
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
			c.mu.Unlock()
			p.reused.Store(true)
			return p, nil
		}
	}
	c.mu.Unlock()

	d := net.Dialer{Timeout: c.dialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, errs.Wrap(errs.PeerUnreachable, "rpc", err, "connect to %s", addr)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	p := &peerConn{addr: addr, conn: conn, pending: map[uint64]chan reply{}, dead: make(chan struct{})}
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
	r := bufio.NewReader(p.conn)
	for {
		_, body, err := wire.ReadFrame(r, c.maxFrame)
		if err != nil {
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

// Call sends a request to the peer's control address and waits for its reply,
// the context's end, or the connection's loss, whichever comes first.
func (c *ctrl) Call(ctx context.Context, addr string, kind uint8, body []byte) ([]byte, error) {
	if uint64(len(body))+wire.CallHeaderSize > c.maxFrame {
		return nil, errs.New(errs.TooLarge, "rpc", "message of %d bytes exceeds the frame limit", len(body))
	}
	p, err := c.peer(ctx, addr)
	if err != nil {
		return nil, err
	}
	res, err := c.call(ctx, p, addr, kind, body)
	if err != nil && p.reused.Load() && errs.CodeOf(err) == errs.PeerUnreachable && ctx.Err() == nil {
		// A pooled connection can be dead before its reader has noticed
		// (the peer restarted under the same address): dial once more. The
		// old peer is gone, so the new one cannot see the call twice.
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
	for conn := range c.conns {
		conn.Close()
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
