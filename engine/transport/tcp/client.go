package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/errs"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/engine/wire"
	"github.com/tecache/te/internal/sys/mem"
)

// op is one transport request, cut into slices.
type op struct {
	req       *transport.Request
	gpu       int // local memory: 0 host, else device ordinal+1 (staged, gpu.go)
	remaining atomic.Int32
	err       atomic.Pointer[errBox]
}

type errBox struct{ err error }

// item is one slice of an op on the wire.
type item struct {
	op     *op
	off, n uint64
}

// done ends one slice; the op ends with its last slice, failed if any slice
// failed.
func (it item) done(err error) {
	o := it.op
	if err != nil {
		o.err.CompareAndSwap(nil, &errBox{err})
	}
	if o.remaining.Add(-1) == 0 {
		if b := o.err.Load(); b != nil {
			o.req.Done(b.err)
		} else {
			o.req.Done(nil)
		}
	}
}

// peer is the set of connections to one endpoint.
type peer struct {
	t     *Transport
	addr  string
	rr    atomic.Uint64 // striping start
	mu    sync.Mutex
	conns []*conn
}

func (t *Transport) peer(addr string) (*peer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, errs.New(errs.Closed, "tcp", "transport closed")
	}
	p := t.peers[addr]
	if p == nil {
		p = &peer{t: t, addr: addr, conns: make([]*conn, t.opt.Conns)}
		t.peers[addr] = p
	}
	return p, nil
}

// all returns the peer's live connection objects.
func (p *peer) all() []*conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*conn
	for _, c := range p.conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// get returns connection i, replacing a dead one: the next request after a
// connection loss reconnects.
func (p *peer) get(i int) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.conns[i]
	if c != nil && !c.isDead() {
		return c
	}
	c = newConn(p)
	p.conns[i] = c
	return c
}

// Submit cuts each request into slices, stripes them over the peer's
// connections and queues them; it does not block on the network.
func (t *Transport) Submit(reqs []*transport.Request) {
	type key struct {
		p *peer
		i int
	}
	var groups map[key][]item
	var lastAddr string
	var last *peer
	for _, r := range reqs {
		addr := r.Peer.Endpoints[Name]
		if addr == "" {
			r.Done(errs.New(errs.TransportUnavailable, "tcp", "segment %q publishes no tcp endpoint", r.Peer.Name))
			continue
		}
		p := last
		if p == nil || addr != lastAddr {
			var err error
			if p, err = t.peer(addr); err != nil {
				r.Done(err)
				continue
			}
			last, lastAddr = p, addr
		}
		if r.Length == 0 {
			r.Done(errs.New(errs.InvalidArgument, "tcp", "zero length"))
			continue
		}
		o := &op{req: r}
		if g, ok := t.reg.Lookup(r.Local, r.Length); ok && isDevice(g) {
			if _, err := cudaLoad(); err != nil {
				r.Done(errs.Wrap(errs.NotSupported, "tcp", err, "local %#x is GPU memory", r.Local))
				continue
			}
			o.gpu = g.Location.Index + 1
		}
		n := (r.Length + t.opt.Slice - 1) / t.opt.Slice
		o.remaining.Store(int32(n))
		start := int((p.rr.Add(1) - 1) % uint64(len(p.conns)))
		if groups == nil {
			groups = make(map[key][]item, len(p.conns))
		}
		for s := uint64(0); s < n; s++ {
			off := s * t.opt.Slice
			k := key{p, (start + int(s)) % len(p.conns)}
			groups[k] = append(groups[k], item{op: o, off: off, n: min(t.opt.Slice, r.Length-off)})
		}
	}
	for k, items := range groups {
		k.p.get(k.i).enqueue(items)
	}
}

// conn is one initiator connection: the writer goroutine dials, then sends
// queued slices; the reader goroutine matches completions to them. The last
// of the two to exit fails whatever is still queued or pending, so no Done
// runs while a goroutine may still touch that request's memory.
type conn struct {
	p *peer

	mu      sync.Mutex
	queue   []item
	pending map[uint64]item
	nextID  uint64
	dead    bool
	err     error
	nc      net.Conn
	running int           // goroutines not yet exited
	wake    chan struct{} // queue not empty
	down    chan struct{} // closed when dead
}

func newConn(p *peer) *conn {
	c := &conn{p: p, pending: map[uint64]item{}, wake: make(chan struct{}, 1), down: make(chan struct{}), running: 1}
	t := p.t
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.dead, c.err, c.running = true, errs.New(errs.Closed, "tcp", "transport closed"), 0
		close(c.down)
		return c
	}
	t.wg.Add(1)
	t.mu.Unlock()
	go c.writeLoop()
	return c
}

func (c *conn) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

// enqueue queues slices; on a dead connection they fail at once.
func (c *conn) enqueue(items []item) {
	c.mu.Lock()
	if c.dead {
		err := c.err
		c.mu.Unlock()
		for _, it := range items {
			it.done(err)
		}
		return
	}
	c.queue = append(c.queue, items...)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// fail marks the connection dead and closes its socket so both goroutines
// return promptly.
func (c *conn) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return
	}
	c.dead, c.err = true, err
	close(c.down)
	if c.nc != nil {
		c.nc.Close()
	}
}

// exit is the last thing each goroutine does; the last one out fails every
// request still queued or pending.
func (c *conn) exit() {
	c.mu.Lock()
	c.running--
	if c.running > 0 {
		c.mu.Unlock()
		c.p.t.wg.Done()
		return
	}
	if !c.dead {
		c.dead, c.err = true, errs.New(errs.PeerUnreachable, "tcp", "connection to %s ended", c.p.addr)
		close(c.down)
	}
	if c.nc != nil {
		c.nc.Close()
	}
	err := c.err
	queue, pending := c.queue, c.pending
	c.queue, c.pending = nil, nil
	c.mu.Unlock()
	for _, it := range queue {
		it.done(err)
	}
	for _, it := range pending {
		it.done(err)
	}
	c.p.t.wg.Done()
}

func (c *conn) writeLoop() {
	defer c.exit()
	st := c.p.t.newStage()
	defer st.release() // before exit: its copies end before any Done
	t := c.p.t
	d := net.Dialer{Timeout: t.opt.DialTimeout}
	nc, err := d.DialContext(t.ctx, "tcp", c.p.addr)
	if err != nil {
		if t.ctx.Err() != nil {
			c.fail(errs.New(errs.Closed, "tcp", "transport closed"))
		} else {
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "connect to %s", c.p.addr))
		}
		return
	}
	tune(nc)
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		nc.Close()
		return
	}
	c.nc = nc
	c.running++
	t.wg.Add(1)
	c.mu.Unlock()
	go c.readLoop(nc)

	if _, err := nc.Write([]byte(wire.DataPreface)); err != nil {
		c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "send to %s", c.p.addr))
		return
	}
	var spare []item
	var hdrs []byte
	var bufs net.Buffers
	var devs []devPiece
	for {
		select {
		case <-c.wake:
		case <-c.down:
			return
		}
		c.mu.Lock()
		if c.dead {
			c.mu.Unlock()
			return
		}
		batch := c.queue
		if len(batch) == 0 {
			c.mu.Unlock()
			continue
		}
		c.queue = spare[:0]
		hdrs = grow(hdrs, len(batch)*wire.ReqHeaderSize)
		bufs, devs = bufs[:0], devs[:0]
		start := 0
		for i, it := range batch {
			id := c.nextID
			c.nextID++
			c.pending[id] = it
			r := it.op.req
			kind := wire.DataRead
			if r.Op == transport.Write {
				kind = wire.DataWrite
			}
			off := i * wire.ReqHeaderSize
			wire.PutDataRequest(hdrs[off:], wire.DataRequest{Kind: kind, ID: id, Addr: r.Remote + it.off, Length: it.n, Key: r.Buffer.Key})
			if kind == wire.DataWrite && it.op.gpu > 0 {
				bufs = append(bufs, hdrs[start:off+wire.ReqHeaderSize])
				devs = append(devs, devPiece{at: len(bufs), dev: it.op.gpu - 1, addr: r.Local + it.off, n: it.n})
				start = off + wire.ReqHeaderSize
			} else if kind == wire.DataWrite {
				bufs = append(bufs, hdrs[start:off+wire.ReqHeaderSize], mem.Bytes(r.Local+it.off, it.n))
				start = off + wire.ReqHeaderSize
			}
		}
		c.mu.Unlock()
		if end := len(batch) * wire.ReqHeaderSize; start < end {
			bufs = append(bufs, hdrs[start:end])
		}
		clear(batch)
		spare = batch
		if len(devs) > 0 {
			if err := st.write(nc, bufs, devs); err != nil {
				c.fail(errs.Wrap(errs.CodeOf(err), "tcp", err, "send GPU payload to %s", c.p.addr))
				return
			}
			continue
		}
		w := bufs // WriteTo consumes its receiver
		if _, err := w.WriteTo(nc); err != nil {
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "send to %s", c.p.addr))
			return
		}
	}
}

func (c *conn) readLoop(nc net.Conn) {
	defer c.exit()
	st := c.p.t.newStage()
	defer st.release() // before exit: its copies end before any Done
	br := bufio.NewReaderSize(nc, readBufSize)
	var h [wire.CompHeaderSize]byte
	// The read deadline is pushed out at most every quarter timeout (a
	// timer update per completion would cost more than the completion).
	idle := c.p.t.opt.Timeout
	var armed time.Time
	for {
		if now := time.Now(); now.Sub(armed) > idle/4 {
			nc.SetReadDeadline(now.Add(idle))
			armed = now
		}
		n, err := io.ReadFull(br, h[:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && n == 0 {
				c.mu.Lock()
				busy := len(c.pending) > 0
				c.mu.Unlock()
				if !busy {
					armed = time.Time{} // idle pool connection: fine
					continue
				}
				c.fail(errs.New(errs.PeerUnreachable, "tcp", "no answer from %s for %v with requests in flight", c.p.addr, idle))
				return
			}
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "connection to %s lost", c.p.addr))
			return
		}
		comp, err := wire.DecodeCompletion(h[:])
		if err != nil {
			c.fail(errs.Wrap(errs.Protocol, "tcp", err, "from %s", c.p.addr))
			return
		}
		c.mu.Lock()
		it, ok := c.pending[comp.ID]
		delete(c.pending, comp.ID)
		c.mu.Unlock()
		if !ok {
			c.fail(errs.New(errs.Protocol, "tcp", "%s completed unknown request %d", c.p.addr, comp.ID))
			return
		}
		r := it.op.req
		if comp.Status != errs.OK {
			it.done(errs.New(comp.Status, "tcp", "%s refused %v of [%#x,+%d)", c.p.addr, r.Op, r.Remote+it.off, it.n))
			continue
		}
		want := uint64(0)
		if r.Op == transport.Read {
			want = it.n
		}
		if comp.Length != want {
			err := errs.New(errs.Protocol, "tcp", "%s answered %d bytes for a %v of %d", c.p.addr, comp.Length, r.Op, it.n)
			it.done(err)
			c.fail(err)
			return
		}
		if want > 0 && it.op.gpu > 0 {
			copyErr, ioErr := st.recv(br, nc, it.op.gpu-1, r.Local+it.off, want)
			if ioErr != nil {
				err := errs.Wrap(errs.PeerUnreachable, "tcp", ioErr, "connection to %s lost", c.p.addr)
				it.done(err)
				c.fail(err)
				return
			}
			if copyErr != nil {
				it.done(errs.Wrap(errs.CodeOf(copyErr), "tcp", copyErr, "stage %d bytes into GPU memory at %#x", want, r.Local+it.off))
				continue
			}
		} else if want > 0 {
			if err := readFull(br, nc, mem.Bytes(r.Local+it.off, want)); err != nil {
				err := errs.Wrap(errs.PeerUnreachable, "tcp", err, "connection to %s lost", c.p.addr)
				it.done(err)
				c.fail(err)
				return
			}
		}
		it.done(nil)
	}
}
