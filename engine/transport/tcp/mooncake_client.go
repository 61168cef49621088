package tcp

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// mcState is the transport's Mooncake interop state.
//
// Lock order: mu, then a peer's mu, then a connection's mu; life is taken
// last, alone. None of them is held while taking Transport.mu.
type mcState struct {
	mu     sync.Mutex
	peers  map[string]*mcPeer // by data endpoint
	life   sync.Mutex         // orders starting a connection against Close
	closed bool               // under life: no connection starts any more
	served atomic.Uint64      // Mooncake requests this target served
	noted  sync.Map           // refusal reason -> *atomic.Uint64, for rate-limited logs
}

func (m *mcState) isClosed() bool {
	m.life.Lock()
	defer m.life.Unlock()
	return m.closed
}

// note logs a refusal of a Mooncake peer: the first of each reason, then one
// in 1024, so an initiator that retries every request on a new connection
// does not flood the log.
func (m *mcState) note(t *Transport, reason, format string, args ...any) {
	v, _ := m.noted.LoadOrStore(reason, new(atomic.Uint64))
	if n := v.(*atomic.Uint64).Add(1); n&1023 == 1 {
		t.logf(format+" (%d so far)", append(args, n)...)
	}
}

// MooncakeServed returns how many Mooncake requests this transport's data
// listener has served.
func (t *Transport) MooncakeServed() uint64 { return t.mc.served.Load() }

// maxMcTries bounds how often a slice is sent again after the connection it
// was on was cut for another request's sake (a refusal, a cancellation).
const maxMcTries = 4

// mooncakeEndpoint is where a Mooncake peer's data listener is: the host of
// its RPC address (the engine fills it in from the segment name or the
// rpc_meta record) and its tcp_data_port. A peer that publishes only the
// unacknowledged framing is not reachable: te never reports a WRITE complete
// that the target did not confirm.
func mooncakeEndpoint(d *segment.Desc) (string, error) {
	if d.TCPDataPort <= 0 || d.TCPDataPort > 65535 {
		return "", errs.New(errs.TransportUnavailable, "tcp", "Mooncake segment %q publishes no tcp data port", d.Name)
	}
	if d.TCPProtoVersion < wire.MooncakeVersion {
		return "", errs.New(errs.TransportUnavailable, "tcp",
			"Mooncake segment %q speaks tcp framing version %d only, which does not acknowledge writes", d.Name, max(d.TCPProtoVersion, 1)).
			WithHint("use a Mooncake Transfer Engine that publishes tcp_proto_version 2")
	}
	host, _, err := net.SplitHostPort(d.RPC)
	if err != nil || host == "" {
		return "", errs.New(errs.TransportUnavailable, "tcp", "no RPC host is known for Mooncake segment %q", d.Name)
	}
	return net.JoinHostPort(host, strconv.Itoa(d.TCPDataPort)), nil
}

// mcPeer is the set of connections to one Mooncake data endpoint.
type mcPeer struct {
	t        *Transport
	addr     string
	rr       atomic.Uint64
	lastUsed atomic.Int64
	mu       sync.Mutex
	conns    []*mcConn
	gone     bool
}

func (t *Transport) mcPeer(addr string) (*mcPeer, error) {
	t.mc.mu.Lock()
	defer t.mc.mu.Unlock()
	if t.mc.isClosed() {
		return nil, errs.New(errs.Closed, "tcp", "transport closed")
	}
	p := t.mc.peers[addr]
	if p == nil {
		p = &mcPeer{t: t, addr: addr, conns: make([]*mcConn, t.opt.Conns)}
		t.mc.peers[addr] = p
	}
	p.lastUsed.Store(time.Now().UnixNano())
	return p, nil
}

func (p *mcPeer) get(i int) *mcConn {
	p.mu.Lock()
	if p.gone {
		// Pruned since the submit chose it: use its successor, looked up
		// without p.mu (the janitor takes mcState.mu before a peer's).
		p.mu.Unlock()
		q, err := p.t.mcPeer(p.addr)
		if err != nil {
			return newMcConn(p) // dead already: the transport is closed
		}
		return q.get(i)
	}
	defer p.mu.Unlock()
	c := p.conns[i]
	if c != nil && !c.isDead() {
		return c
	}
	c = newMcConn(p)
	p.conns[i] = c
	return c
}

func (p *mcPeer) all() []*mcConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*mcConn
	for _, c := range p.conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out
}

// requeue sends slices again, spread over the peer's connections.
func (p *mcPeer) requeue(items []mcItem) {
	n := len(p.conns)
	start := int((p.rr.Add(1) - 1) % uint64(n))
	groups := make([][]mcItem, n)
	for k, it := range items {
		i := (start + k) % n
		groups[i] = append(groups[i], it)
	}
	for i, g := range groups {
		if len(g) > 0 {
			p.get(i).enqueue(g)
		}
	}
}

// mcOp is one request to a Mooncake peer, cut into slices; it completes with
// its last slice, once no goroutine touches its memory.
type mcOp struct {
	req       *transport.Request
	tk        transport.Ticket // completes the op (kept: the slot is the engine's)
	p         *mcPeer
	write     bool
	remaining atomic.Int32
	err       atomic.Pointer[errBox]
	canceled  atomic.Bool
}

type mcItem struct {
	op     *mcOp
	off, n uint64
	tries  uint8
}

func (it mcItem) done(err error) {
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

// submitMooncake starts requests to Mooncake peers: sliced, striped over the
// peer's persistent connections and pipelined, in Mooncake's version 2
// framing (spec.md, "Mooncake interop").
func (t *Transport) submitMooncake(reqs []*transport.Request) {
	type key struct {
		p *mcPeer
		i int
	}
	groups := map[key][]mcItem{}
	ops := make([]mcOp, len(reqs))
	var lastD *segment.Desc
	var last *mcPeer
	for i, r := range reqs {
		if r.Length == 0 {
			r.Complete(errs.New(errs.InvalidArgument, "tcp", "zero length"))
			continue
		}
		if isDevice(r.Region) {
			r.Complete(errs.New(errs.NotSupported, "tcp", "local %#x is GPU memory: not moved to a Mooncake peer over tcp", r.Local))
			continue
		}
		p := last
		if r.Peer != lastD {
			addr, err := mooncakeEndpoint(r.Peer)
			if err == nil {
				p, err = t.mcPeer(addr)
			}
			if err != nil {
				r.Complete(err)
				continue
			}
			lastD, last = r.Peer, p
		}
		o := &ops[i]
		o.req, o.tk, o.p, o.write = r, r.Ticket(), p, r.Op == transport.Write
		r.Priv = o
		n := (r.Length + t.opt.Slice - 1) / t.opt.Slice
		o.remaining.Store(int32(n))
		start := int((p.rr.Add(1) - 1) % uint64(len(p.conns)))
		for s := uint64(0); s < n; s++ {
			off := s * t.opt.Slice
			k := key{p, (start + int(s)) % len(p.conns)}
			groups[k] = append(groups[k], mcItem{op: o, off: off, n: min(t.opt.Slice, r.Length-off)})
		}
	}
	for k, items := range groups {
		k.p.get(k.i).enqueue(items)
	}
}

// cancelMooncake ends canceled requests to Mooncake peers: slices not sent
// yet are never sent; a connection carrying a sent one is closed (Mooncake's
// framing has no request ids to forget one by), and the request completes
// once that connection's reader and writer stopped. The other requests it
// carried are sent again on a new connection.
func (t *Transport) cancelMooncake(reqs []*transport.Request) {
	var peers map[*mcPeer]bool
	for _, r := range reqs {
		o, ok := r.Priv.(*mcOp)
		if !ok || o == nil {
			continue
		}
		o.canceled.Store(true)
		if peers == nil {
			peers = map[*mcPeer]bool{}
		}
		peers[o.p] = true
	}
	for p := range peers {
		for _, c := range p.all() {
			c.cancel()
		}
	}
}

// pruneMooncake drops Mooncake peers idle for PeerIdle, as prune does te's.
func (t *Transport) pruneMooncake(now time.Time) {
	var drop []*mcConn
	t.mc.mu.Lock()
	for addr, p := range t.mc.peers {
		idle := now.UnixNano()-p.lastUsed.Load() > int64(t.opt.PeerIdle)
		p.mu.Lock()
		busy, alive := false, false
		for _, c := range p.conns {
			if c != nil {
				busy = busy || c.busy()
				alive = alive || !c.isDead()
			}
		}
		if !busy && (idle || !alive) {
			p.gone = true
			delete(t.mc.peers, addr)
			for _, c := range p.conns {
				if c != nil {
					drop = append(drop, c)
				}
			}
		}
		p.mu.Unlock()
	}
	t.mc.mu.Unlock()
	for _, c := range drop {
		c.fail(errs.New(errs.Closed, "tcp", "idle connection to %s pruned", c.p.addr))
	}
}

// closeMooncake fails every connection to Mooncake peers (the transport is
// closed: no new one starts); Close then waits for their goroutines.
func (t *Transport) closeMooncake() {
	t.mc.life.Lock()
	t.mc.closed = true
	t.mc.life.Unlock()
	t.mc.mu.Lock()
	peers := make([]*mcPeer, 0, len(t.mc.peers))
	for _, p := range t.mc.peers {
		peers = append(peers, p)
	}
	t.mc.mu.Unlock()
	for _, p := range peers {
		for _, c := range p.all() {
			c.fail(errs.New(errs.Closed, "tcp", "transport closed"))
		}
	}
}

// How a Mooncake connection ended, which decides what happens to the slices
// it still held (exit).
const (
	cutError    = iota // lost or failed: what it held fails
	cutRefused         // the target refused the oldest slice and closed
	cutCanceled        // closed to abandon a canceled slice
)

// mcConn is one connection to a Mooncake target. The writer dials, then sends
// queued slices back to back; the target answers them one at a time in that
// order, so the reader matches each status to the oldest slice in flight.
// The last of the two goroutines to exit settles what is left.
type mcConn struct {
	p *mcPeer

	mu      sync.Mutex
	queue   []mcItem // not taken by the writer yet
	flight  []mcItem // taken by the writer, oldest first from head
	head    int
	dead    bool
	err     error
	cut     int
	refusal error // with cutRefused: the oldest slice's error
	nc      net.Conn
	running int
	wake    chan struct{}
	down    chan struct{}
}

func newMcConn(p *mcPeer) *mcConn {
	c := &mcConn{p: p, wake: make(chan struct{}, 1), down: make(chan struct{}), running: 1}
	t := p.t
	t.mc.life.Lock()
	if t.mc.closed {
		t.mc.life.Unlock()
		c.dead, c.err, c.running = true, errs.New(errs.Closed, "tcp", "transport closed"), 0
		close(c.down)
		return c
	}
	t.wg.Add(1)
	t.mc.life.Unlock()
	go c.writeLoop()
	return c
}

func (c *mcConn) isDead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dead
}

func (c *mcConn) busy() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue) > 0 || c.head < len(c.flight)
}

func (c *mcConn) enqueue(items []mcItem) {
	c.mu.Lock()
	if c.dead {
		err, how := c.err, c.cut
		c.mu.Unlock()
		if how != cutError {
			// Cut for another request's sake since it was picked: the
			// slices go to its replacement.
			c.p.retry(items, err)
			return
		}
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

// cutLocked marks the connection dead and closes its socket; c.mu is held.
func (c *mcConn) cutLocked(how int, err error) {
	if c.dead {
		return
	}
	c.dead, c.err, c.cut = true, err, how
	close(c.down)
	if c.nc != nil {
		c.nc.Close()
	}
}

func (c *mcConn) fail(err error) {
	c.mu.Lock()
	c.cutLocked(cutError, err)
	c.mu.Unlock()
}

func (c *mcConn) cancel() {
	var out []mcItem
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return // its last goroutine settles the canceled slices
	}
	c.queue, out = takeCanceled(c.queue, func(it mcItem) bool { return it.op.canceled.Load() })
	for _, it := range c.flight[c.head:] {
		if it.op.canceled.Load() {
			c.cutLocked(cutCanceled, errs.New(errs.PeerUnreachable, "tcp",
				"connection to Mooncake peer %s closed to abandon a canceled request", c.p.addr))
			break
		}
	}
	c.mu.Unlock()
	for _, it := range out {
		it.done(errCanceled)
	}
}

// exit is the last thing each goroutine does; the last one out settles every
// slice still queued or in flight: canceled ones end Canceled, the refused
// one with its refusal; after a refusal or a cut for a cancellation the
// others go to another connection (the target served none of them after the
// refused one, and serving one again rewrites the same bytes), otherwise
// they fail with the connection's error.
func (c *mcConn) exit() {
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
	err, how, refusal := c.err, c.cut, c.refusal
	flight := c.flight[c.head:]
	queue := c.queue
	c.flight, c.queue = nil, nil
	c.mu.Unlock()
	var again []mcItem
	for i, it := range flight {
		switch {
		case it.op.canceled.Load():
			it.done(errCanceled)
		case i == 0 && how == cutRefused:
			it.done(refusal)
		case how == cutError:
			it.done(err)
		default:
			again = append(again, it)
		}
	}
	if how == cutError {
		for _, it := range queue {
			it.done(err)
		}
	} else {
		again = append(again, queue...)
	}
	c.p.retry(again, err)
	c.p.t.wg.Done()
}

// retry sends slices again on the peer's other or new connections, up to
// maxMcTries times each (then they fail with err); canceled ones end.
func (p *mcPeer) retry(items []mcItem, err error) {
	again := items[:0]
	for _, it := range items {
		switch {
		case it.op.canceled.Load():
			it.done(errCanceled)
		case it.tries >= maxMcTries:
			it.done(err)
		default:
			it.tries++
			again = append(again, it)
		}
	}
	if len(again) > 0 {
		p.requeue(again)
	}
}

func (c *mcConn) writeLoop() {
	defer c.exit()
	t := c.p.t
	nc, err := t.dial(c.p.addr, "Mooncake peer ")
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
	c.running++
	t.wg.Add(1)
	c.mu.Unlock()
	go c.readLoop(nc)

	var spare []mcItem
	var hdrs []byte
	var bufs, chunk net.Buffers
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
		if c.head == len(c.flight) {
			c.flight, c.head = c.flight[:0], 0
		}
		c.flight = append(c.flight, batch...)
		c.mu.Unlock()
		hdrs = grow(hdrs, len(batch)*wire.MooncakeHeaderSize)
		bufs = bufs[:0]
		start := 0
		for i, it := range batch {
			r := it.op.req
			op := wire.MooncakeRead
			if it.op.write {
				op = wire.MooncakeWrite
			}
			off := i * wire.MooncakeHeaderSize
			end := off + wire.MooncakeHeaderSize
			wire.PutMooncakeRequest(hdrs[off:end], wire.MooncakeRequest{Size: it.n, Addr: r.Remote + it.off, Op: op, V2: true})
			if it.op.write {
				bufs = append(bufs, hdrs[start:end], mem.Bytes(r.Local+it.off, it.n))
				start = end
			}
		}
		if end := len(batch) * wire.MooncakeHeaderSize; start < end {
			bufs = append(bufs, hdrs[start:end])
		}
		clear(batch)
		spare = batch
		chunk, err = writeProgress(nc, bufs, chunk, t.opt.Progress)
		clear(bufs)
		if err != nil {
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "send to Mooncake peer %s", c.p.addr))
			return
		}
	}
}

// mooncakeRefusal turns a target's refusal status into an error.
func mooncakeRefusal(addr string, code uint32, it mcItem) error {
	r := it.op.req
	c := errs.AccessDenied
	why := "refused"
	switch code {
	case wire.MooncakeAddrRejected:
		c, why = errs.AddressNotRegistered, "rejected the address of"
	case wire.MooncakeNotServed:
		c = errs.NotSupported
	}
	return errs.New(c, "tcp", "Mooncake peer %s %s %v of [%#x,+%d) (status %d)", addr, why, r.Op, r.Remote+it.off, it.n, code)
}

func (c *mcConn) readLoop(nc net.Conn) {
	defer c.exit()
	t := c.p.t
	br := bufio.NewReaderSize(nc, readBufSize)
	var sb [wire.MooncakeStatusSize]byte
	idle := t.opt.Timeout
	var armed time.Time
	for {
		if now := time.Now(); now.Sub(armed) > idle/4 {
			nc.SetReadDeadline(now.Add(idle))
			armed = now
		}
		n, err := io.ReadFull(br, sb[:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && n == 0 {
				if !c.busy() {
					armed = time.Time{}
					continue
				}
				c.fail(errs.New(errs.PeerUnreachable, "tcp", "no answer from Mooncake peer %s for %v with requests in flight", c.p.addr, idle))
				return
			}
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "connection to Mooncake peer %s lost", c.p.addr))
			return
		}
		code, err := wire.DecodeMooncakeStatus(sb[:])
		c.mu.Lock()
		if c.head == len(c.flight) {
			c.cutLocked(cutError, errs.New(errs.Protocol, "tcp", "Mooncake peer %s answered with nothing in flight", c.p.addr))
			c.mu.Unlock()
			return
		}
		it := c.flight[c.head]
		switch {
		case err != nil:
			c.cutLocked(cutError, errs.Wrap(errs.Protocol, "tcp", err, "from Mooncake peer %s", c.p.addr))
		case code != wire.MooncakeOK:
			// The target closes after a refusal; what followed the
			// refused slice was never served (exit sends it again). The
			// slice itself is settled by exit, once the writer is no
			// longer sending its payload.
			c.refusal = mooncakeRefusal(c.p.addr, code, it)
			c.cutLocked(cutRefused, errs.New(errs.PeerUnreachable, "tcp", "Mooncake peer %s closed after a refusal", c.p.addr))
		}
		if c.dead {
			c.mu.Unlock()
			return
		}
		if it.op.write {
			// Acknowledged: the target read the whole payload, so the
			// writer is past it.
			c.flight[c.head] = mcItem{}
			c.head++
			c.mu.Unlock()
			it.done(nil)
			continue
		}
		c.mu.Unlock()
		// A READ's payload follows its status. Until it is read the
		// slice stays in flight, so a failure here settles it in exit.
		if err := readProgress(br, nc, mem.Bytes(it.op.req.Local+it.off, it.n), t.opt.Progress); err != nil {
			c.fail(errs.Wrap(errs.PeerUnreachable, "tcp", err, "connection to Mooncake peer %s lost", c.p.addr))
			return
		}
		armed = time.Time{}
		c.mu.Lock()
		c.flight[c.head] = mcItem{}
		c.head++
		c.mu.Unlock()
		it.done(nil)
	}
}
