package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// op is one transport request, cut into slices. A slice is released exactly
// once, by whoever takes it off the connection's queue or pending table (or
// by the connection's end); the op completes with its last slice, so it
// completes only once no goroutine of the transport touches its memory.
type op struct {
	req       *transport.Request // not to be read once the op completed
	tk        transport.Ticket   // completes the op (kept: the slot is the engine's)
	p         *peer
	inst      string // the instance the request's descriptor names
	write     bool
	gpu       int // local memory: 0 host, else device ordinal+1 (staged, gpu.go)
	remaining atomic.Int32
	err       atomic.Pointer[errBox]
	canceled  atomic.Bool
}

type errBox struct{ err error }

// item is one slice of an op on the wire.
type item struct {
	op     *op
	off, n uint64
}

// done releases one slice; the op ends with its last slice, failed if any
// slice failed.
func (it item) done(err error) {
	o := it.op
	if err != nil {
		o.err.CompareAndSwap(nil, &errBox{err})
	}
	if o.remaining.Add(-1) == 0 {
		if b := o.err.Load(); b != nil {
			o.tk.Complete(b.err)
		} else {
			o.tk.Complete(nil)
		}
	}
}

var errCanceled = errs.New(errs.Canceled, "tcp", "request canceled before it finished")

// peer is the set of connections to one endpoint.
type peer struct {
	t        *Transport
	addr     string
	rr       atomic.Uint64 // striping start
	lastUsed atomic.Int64  // unix nanoseconds of the last submit
	mu       sync.Mutex
	conns    []*conn
	gone     bool // pruned: get goes to the peer's replacement
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
	// Under t.mu, so the janitor never prunes a peer a submit just chose.
	p.lastUsed.Store(time.Now().UnixNano())
	return p, nil
}

// janitor prunes peers that had no request for PeerIdle, with their idle
// connections, so autoscaled-away peers do not pile up; a peer whose
// connections are all dead and idle goes at the next round.
func (t *Transport) janitor() {
	defer t.wg.Done()
	tick := 30 * time.Second
	if t.opt.PeerIdle > 0 {
		tick = min(max(t.opt.PeerIdle/4, 10*time.Millisecond), tick)
	}
	tk := time.NewTicker(tick)
	defer tk.Stop()
	for {
		select {
		case <-t.ctx.Done():
			return
		case now := <-tk.C:
			t.prune(now)
			t.pruneMooncake(now)
		}
	}
}

func (t *Transport) prune(now time.Time) {
	// Lock order is p.mu, then t.mu (peer.get takes t.mu in newConn while
	// it holds p.mu): the peers are listed first, then each is looked at
	// under its own lock.
	t.mu.Lock()
	peers := make([]*peer, 0, len(t.peers))
	for _, p := range t.peers {
		peers = append(peers, p)
	}
	t.mu.Unlock()
	var drop []*conn
	for _, p := range peers {
		idle := t.opt.PeerIdle > 0 && now.UnixNano()-p.lastUsed.Load() > int64(t.opt.PeerIdle)
		p.mu.Lock()
		busy, alive := false, false
		for _, c := range p.conns {
			if c != nil {
				busy = busy || c.busy()
				alive = alive || !c.isDead()
			}
		}
		if !busy && (idle || !alive) && !p.gone {
			t.mu.Lock()
			// A submit that chose p since it was listed moved lastUsed
			// under t.mu: it is not idle after all.
			recent := now.UnixNano()-p.lastUsed.Load() <= int64(t.opt.PeerIdle) && alive
			if t.peers[p.addr] == p && !recent {
				delete(t.peers, p.addr)
				p.gone = true
			}
			t.mu.Unlock()
			if p.gone {
				for _, c := range p.conns {
					if c != nil {
						drop = append(drop, c)
					}
				}
			}
		}
		p.mu.Unlock()
	}
	for _, c := range drop {
		c.fail(errs.New(errs.Closed, "tcp", "idle connection to %s pruned", c.p.addr))
	}
	if len(drop) > 0 {
		t.pruned.Add(uint64(len(drop)))
	}
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
	if p.gone {
		// Pruned between the submit's lookup and now: use its successor.
		q, err := p.t.peer(p.addr)
		if err != nil {
			return newConn(p) // dead already: the transport is closed
		}
		return q.get(i)
	}
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
func (t *Transport) Submit(reqs []transport.Request) {
	type key struct {
		p *peer
		i int
	}
	var groups map[key][]item
	var lastAddr string
	var last *peer
	var mc []*transport.Request
	ops := make([]op, len(reqs)) // one allocation per submit
	for i := range reqs {
		r := &reqs[i]
		if r.Peer.IsMooncake() {
			mc = append(mc, r) // Mooncake's framing (mooncake_client.go)
			continue
		}
		addr := r.Peer.Endpoints[Name]
		if addr == "" {
			r.Complete(errs.New(errs.TransportUnavailable, "tcp", "segment %q publishes no tcp endpoint", r.Peer.Name))
			continue
		}
		p := last
		if p == nil || addr != lastAddr {
			var err error
			if p, err = t.peer(addr); err != nil {
				r.Complete(err)
				continue
			}
			last, lastAddr = p, addr
		}
		if r.Length == 0 {
			r.Complete(errs.New(errs.InvalidArgument, "tcp", "zero length"))
			continue
		}
		o := &ops[i]
		o.req, o.tk, o.p, o.write, o.inst = r, r.Ticket(), p, r.Op == transport.Write, r.Peer.Instance
		if isDevice(r.Region) {
			if _, err := cudaLoad(); err != nil {
				r.Complete(errs.Wrap(errs.NotSupported, "tcp", err, "local %#x is GPU memory", r.Local))
				continue
			}
			o.gpu = r.Region.Location.Index + 1
		}
		r.Priv = o
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
	if mc != nil {
		t.submitMooncake(mc)
	}
}

// Cancel releases the slices of reqs that no goroutine is moving: queued ones
// and those sent and waiting for their completion (whose late completion is
// then dropped, its payload read into scratch). A slice being written or read
// right now is released when that I/O ends, which the progress timeout
// bounds. The connections stay up for everyone else.
func (t *Transport) Cancel(reqs []*transport.Request) {
	t.cancelMooncake(reqs)
	peers := map[*peer]bool{}
	for _, r := range reqs {
		o, ok := r.Priv.(*op)
		if !ok || o == nil {
			continue
		}
		o.canceled.Store(true)
		peers[o.p] = true
	}
	for p := range peers {
		for _, c := range p.all() {
			c.cancel()
		}
	}
}

// conn is one initiator connection: the writer goroutine dials, then sends
// queued slices; the reader goroutine matches completions to them. The last
// of the two to exit fails whatever is still queued or pending, so no slice
// is released while a goroutine may still touch its memory.
type conn struct {
	p *peer

	mu      sync.Mutex
	queue   []item
	pending map[uint64]slot
	nextID  uint64
	// Slices with ids in [sendLo, sendHi) are in the writer's current
	// write: a canceled WRITE among them is the writer's to release.
	sendLo, sendHi uint64
	dead           bool
	err            error
	nc             net.Conn
	running        int           // goroutines not yet exited
	wake           chan struct{} // queue not empty
	down           chan struct{} // closed when dead
}

// slot is a sent slice; released means a Cancel already let go of it and its
// completion, when it comes, is dropped.
type slot struct {
	item
	released bool
}

func newConn(p *peer) *conn {
	c := &conn{p: p, pending: map[uint64]slot{}, wake: make(chan struct{}, 1), down: make(chan struct{}), running: 1}
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

// busy reports whether the connection has slices queued or in flight.
func (c *conn) busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue) > 0 || len(c.pending) > 0
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

// cancel releases the canceled slices nobody is moving (see Transport.Cancel).
func (c *conn) cancel() {
	var out []item
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return // its last goroutine releases everything
	}
	c.queue, out = takeCanceled(c.queue, func(it item) bool { return it.op.canceled.Load() })
	for id, s := range c.pending {
		if s.released || !s.op.canceled.Load() {
			continue
		}
		if s.op.write && id >= c.sendLo && id < c.sendHi {
			continue // its payload is being written now
		}
		s.released = true
		c.pending[id] = s
		out = append(out, s.item)
	}
	c.mu.Unlock()
	for _, it := range out {
		it.done(errCanceled)
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
// slice still queued or pending.
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
	for _, s := range pending {
		if !s.released {
			s.done(err)
		}
	}
	c.p.t.wg.Done()
}

func (c *conn) writeLoop() {
	defer c.exit()
	st := c.p.t.newStage()
	defer st.release() // before exit: its copies end before any slice is released
	t := c.p.t
	nc, err := t.dial(c.p.addr, "")
	if err != nil {
		c.fail(err)
		return
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		nc.Close()
		return
	}
	c.nc = nc
	c.mu.Unlock()
	inst, err := t.clientHello(nc, c.p.addr)
	if err != nil {
		c.fail(err)
		return
	}
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return
	}
	c.running++
	t.wg.Add(1)
	c.mu.Unlock()
	go c.readLoop(nc)

	var spare, stale []item
	var hdrs []byte
	var bufs, chunk net.Buffers
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
		c.sendLo = c.nextID
		n := 0
		for _, it := range batch {
			if inst != it.op.inst && it.op.inst != "" {
				// The endpoint now serves another engine (restarted,
				// or a rewritten descriptor): the request was built
				// for the old one.
				stale = append(stale, it)
				continue
			}
			batch[n] = it
			n++
		}
		clear(batch[n:])
		batch = batch[:n]
		for i, it := range batch {
			id := c.nextID
			c.nextID++
			c.pending[id] = slot{item: it}
			r := it.op.req
			kind := wire.DataRead
			if r.Op == transport.Write {
				kind = wire.DataWrite
			}
			off := i * wire.ReqHeaderSize
			wire.PutDataRequest(hdrs[off:], wire.DataRequest{Kind: kind, ID: id, Addr: r.Remote + it.off, Length: it.n, Key: r.Key})
			if kind == wire.DataWrite && it.op.gpu > 0 {
				bufs = append(bufs, hdrs[start:off+wire.ReqHeaderSize])
				devs = append(devs, devPiece{at: len(bufs), dev: it.op.gpu - 1, addr: r.Local + it.off, n: it.n})
				start = off + wire.ReqHeaderSize
			} else if kind == wire.DataWrite {
				bufs = append(bufs, hdrs[start:off+wire.ReqHeaderSize], mem.Bytes(r.Local+it.off, it.n))
				start = off + wire.ReqHeaderSize
			}
		}
		c.sendHi = c.nextID
		c.mu.Unlock()
		for _, it := range stale {
			it.done(errs.New(errs.StaleDescriptor, "tcp", "%s is now engine %s, not %s", c.p.addr, inst, it.op.inst))
		}
		clear(stale)
		stale = stale[:0]
		if end := len(batch) * wire.ReqHeaderSize; start < end {
			bufs = append(bufs, hdrs[start:end])
		}
		clear(batch)
		spare = batch
		if len(devs) > 0 {
			err = st.write(progressWriter{nc, t.opt.Progress}, bufs, devs)
		} else {
			chunk, err = writeProgress(nc, bufs, chunk, t.opt.Progress)
		}
		c.sent()
		if err != nil {
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "send to %s", c.p.addr))
			return
		}
	}
}

// sent ends the writer's hold on the slices it just wrote: canceled WRITEs
// among them are released now (their payload is on the wire; the completion
// that follows is dropped).
func (c *conn) sent() {
	var out []item
	c.mu.Lock()
	for id := c.sendLo; id < c.sendHi; id++ {
		s, ok := c.pending[id]
		if ok && !s.released && s.op.canceled.Load() {
			s.released = true
			c.pending[id] = s
			out = append(out, s.item)
		}
	}
	c.sendLo = c.sendHi
	c.mu.Unlock()
	for _, it := range out {
		it.done(errCanceled)
	}
}

func (c *conn) readLoop(nc net.Conn) {
	defer c.exit()
	st := c.p.t.newStage()
	defer st.release() // before exit: its copies end before any slice is released
	br := bufio.NewReaderSize(nc, readBufSize)
	var h [wire.CompHeaderSize]byte
	var scratch []byte
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
				if !c.busy() {
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
		s, ok := c.pending[comp.ID]
		delete(c.pending, comp.ID)
		c.mu.Unlock()
		if !ok {
			c.fail(errs.New(errs.Protocol, "tcp", "%s completed unknown request %d", c.p.addr, comp.ID))
			return
		}
		it := s.item
		o := it.op
		want := uint64(0)
		if !o.write && comp.Status == errs.OK {
			want = it.n
		}
		if comp.Length != want {
			err := errs.New(errs.Protocol, "tcp", "%s answered %d bytes for a request of %d", c.p.addr, comp.Length, it.n)
			if !s.released {
				it.done(err)
			}
			c.fail(err)
			return
		}
		if s.released {
			// Canceled: its completion is dropped, its payload read
			// into scratch.
			if want > 0 {
				if scratch == nil {
					scratch = make([]byte, drainChunk)
				}
				if err := drain(br, want, scratch); err != nil {
					c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "connection to %s lost", c.p.addr))
					return
				}
			}
			continue
		}
		r := o.req
		if comp.Status != errs.OK {
			it.done(errs.New(comp.Status, "tcp", "%s refused %v of [%#x,+%d)", c.p.addr, r.Op, r.Remote+it.off, it.n))
			continue
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
			if err := readProgress(br, nc, mem.Bytes(r.Local+it.off, want), c.p.t.opt.Progress); err != nil {
				err := errs.Wrap(errs.PeerUnreachable, "tcp", err, "connection to %s lost", c.p.addr)
				it.done(err)
				c.fail(err)
				return
			}
			armed = time.Time{}
		}
		it.done(nil)
	}
}

// dial connects to addr for the transport (what names the peer in errors,
// e.g. "Mooncake peer "): Closed once the transport closes, PeerUnreachable
// otherwise.
func (t *Transport) dial(addr, what string) (net.Conn, error) {
	d := net.Dialer{Timeout: t.opt.DialTimeout}
	nc, err := d.DialContext(t.ctx, "tcp", addr)
	if err != nil {
		if t.ctx.Err() != nil {
			return nil, errs.New(errs.Closed, "tcp", "transport closed")
		}
		return nil, errs.Wrap(errs.PeerUnreachable, "tcp", err, "connect to %s%s", what, addr)
	}
	tune(nc)
	return nc, nil
}

// takeCanceled removes from q, in place, the entries canceled reports and
// returns what stays and what was taken.
func takeCanceled[T any](q []T, canceled func(T) bool) (keep, out []T) {
	keep = q[:0]
	for _, x := range q {
		if canceled(x) {
			out = append(out, x)
		} else {
			keep = append(keep, x)
		}
	}
	clear(q[len(keep):])
	return keep, out
}
