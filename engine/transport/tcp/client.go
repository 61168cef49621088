package tcp

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync/atomic"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/engine/transport"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
)

// op is one transport request, cut into slices (items) that travel on the
// peer's pooled connections (internal/pipe) in te's framing or Mooncake's.
// The op completes with its last slice, so it completes only once no
// goroutine of the transport touches its memory.
type op struct {
	// What the slices need of the request, copied in Submit: the
	// request's slot is the engine's, and is not read after Submit
	// (transport.Request); the op completes through tk.
	local, remote, key uint64
	tk                 transport.Ticket
	p                  *pipe.Peer[item] // nil when the slices go over rails
	rs                 *railSet         // the peer's rails, when it has several (rails.go)
	inst               string           // the instance the request's descriptor names (te's framing)
	write              bool
	window             bool   // key is a window's, not the buffer's
	gpu                devLoc // local memory: zero for host, else its device (staged, gpu.go)
	remaining          atomic.Int32
	err                atomic.Pointer[errBox]
	canceled           atomic.Bool
}

// opcode is the op's direction, for messages.
func (o *op) opcode() transport.Opcode {
	if o.write {
		return transport.Write
	}
	return transport.Read
}

type errBox struct{ err error }

// item is one slice of an op on the wire.
type item struct {
	op     *op
	off, n uint64
	rail   *tcpRail // the rail it is on, when its op goes over rails
	tries  uint8    // rails it failed on
}

func (it item) Canceled() bool { return it.op.canceled.Load() }

// Holds: a WRITE's payload is read from local memory while it is written.
func (it item) Holds() bool { return it.op.write }

// Done releases one slice; the op ends with its last slice, failed if any
// slice failed.
func (it item) Done(err error) {
	o := it.op
	if it.rail != nil && o.rs.settle(it, err) {
		return // sent again on another rail
	}
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

// framing is one of the transport's two wire framings on the initiator side,
// with its pool of peers.
type framing struct {
	pool *pipe.Pool[item]
	// gpu: device memory may be staged through this framing (te's peers
	// stage their own side; a Mooncake peer is not sent device memory).
	gpu bool
}

// route is where a descriptor's peer is reached: te's framing at its tcp
// endpoint, or Mooncake's at its RPC host and data port (mooncake.go).
func (t *Transport) route(d *segment.Desc) (*framing, string, error) {
	if d.IsMooncake() {
		addr, err := mooncakeEndpoint(d)
		return &t.mcf, addr, err
	}
	addr := d.Endpoints[Name]
	if addr == "" {
		return nil, "", errs.New(errs.TransportUnavailable, "tcp", "segment %q publishes no tcp endpoint", d.Name)
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, "", errs.New(errs.TransportUnavailable, "tcp", "segment %q publishes a malformed tcp endpoint %q", d.Name, addr)
	}
	return &t.tef, addr, nil
}

// Submit cuts each request into slices, stripes them over the peer's
// connections and queues them; it does not block on the network.
func (t *Transport) Submit(reqs []transport.Request) {
	var groups map[slot][]item
	var lastD *segment.Desc
	var last *pipe.Peer[item]
	var lastF *framing
	var lastRS *railSet
	ops := make([]op, len(reqs)) // one allocation per submit
	for i := range reqs {
		r := &reqs[i]
		p, f, rs := last, lastF, lastRS
		if r.Peer != lastD || (p == nil && rs == nil) {
			var addr string
			var err error
			p, rs = nil, nil
			if f, addr, err = t.route(r.Peer); err == nil {
				if f == &t.tef {
					rs = t.railsOf(r.Peer)
				}
				if rs == nil {
					p, err = f.pool.Peer(addr)
				}
			}
			if err != nil {
				r.Complete(err)
				continue
			}
			lastD, last, lastF, lastRS = r.Peer, p, f, rs
		}
		if r.Length == 0 {
			r.Complete(errs.New(errs.InvalidArgument, "tcp", "zero length"))
			continue
		}
		o := &ops[i]
		o.local, o.remote, o.key, o.tk = r.Local, r.Remote, r.Key, r.Ticket()
		o.p, o.write, o.inst = p, r.Op == transport.Write, r.Peer.Instance
		o.window = r.Buffer != nil && r.Key != r.Buffer.Key
		if isDevice(r.Region) {
			if !f.gpu {
				r.Complete(errs.New(errs.NotSupported, "tcp", "local %#x is GPU memory: not moved to a Mooncake peer over tcp", r.Local))
				continue
			}
			if _, err := driverFor(r.Region.Location.Kind); err != nil {
				r.Complete(errs.Wrap(errs.NotSupported, "tcp", err, "local %#x is GPU memory", r.Local))
				continue
			}
			o.gpu = devOf(r.Region)
		}
		if groups == nil {
			groups = make(map[slot][]item, 8)
		}
		slice := t.sliceFor(r.Buffer)
		if rs != nil {
			if err := rs.spread(o, r.Length, slice, groups); err != nil {
				r.Complete(err)
				continue
			}
			r.Priv = o
			continue
		}
		r.Priv = o
		n := (r.Length + slice - 1) / slice
		o.remaining.Store(int32(n))
		start, conns := p.Stripe(), p.Conns()
		for s := uint64(0); s < n; s++ {
			off := s * slice
			k := slot{p, (start + int(s)) % conns}
			groups[k] = append(groups[k], item{op: o, off: off, n: min(slice, r.Length-off)})
		}
	}
	for k, items := range groups {
		k.p.Send(k.i, items...)
	}
}

// sliceFor is the slice size of requests to buffer b: tcp.slice, or for a
// peer's registered file the size of the owner's file I/O where that is
// larger (at most 16 MiB), so every slice reaches its disk as one I/O
// instead of several half-size ones.
func (t *Transport) sliceFor(b *segment.BufferDesc) uint64 {
	if b == nil || b.Name != segment.KindFile {
		return t.opt.Slice
	}
	c, err := strconv.ParseUint(b.Extra[segment.ExtraFileChunk], 10, 64)
	if err != nil || c <= t.opt.Slice {
		return t.opt.Slice
	}
	return min(c, maxFileSlice)
}

// maxFileSlice bounds a file slice: the owner holds a staging buffer of it
// per connection.
const maxFileSlice = 16 << 20

// Cancel releases the slices of reqs that no goroutine is moving: queued ones
// and those sent and waiting for their completion (whose late completion is
// then dropped, its payload read into scratch; on a Mooncake connection,
// which has no request ids, by closing it). A slice being written or read
// right now is released when that I/O ends, which the progress timeout
// bounds. The connections stay up for everyone else.
func (t *Transport) Cancel(reqs []*transport.Request) {
	peers := map[*pipe.Peer[item]]bool{}
	for _, r := range reqs {
		o, ok := r.Priv.(*op)
		if !ok || o == nil {
			continue
		}
		o.canceled.Store(true)
		if o.rs != nil {
			o.rs.cancel(peers)
		} else {
			peers[o.p] = true
		}
	}
	for p := range peers {
		p.Cancel()
	}
}

// Warmup opens every striped connection to the peer's data endpoint,
// completes each one's opening exchange (preface, mutual authentication,
// session keys) and, on te's framing, runs one refused WRITE on each
// (ping), so that the first request to the peer dials nothing and finds
// both ends' data paths run once (transport.Warmer). Connections already
// open are kept as they are.
func (t *Transport) Warmup(ctx context.Context, d *segment.Desc) error {
	f, addr, err := t.route(d)
	if err != nil {
		return err
	}
	if f == &t.tef {
		if rs := t.railsOf(d); rs != nil {
			return rs.warm(ctx, d.Instance)
		}
	}
	p, err := f.pool.Peer(addr)
	if err != nil {
		return err
	}
	if err := p.Warm(ctx); err != nil || f != &t.tef {
		return err
	}
	return t.ping(ctx, p, d.Instance)
}

// ping sends each connection of p (te's framing) a WRITE of 4 KiB under
// key 0, which the target refuses (AccessDenied) without touching memory,
// reading the payload into scratch and dropping it (spec.md, "What the
// target checks"): one round trip through both ends' data paths (request
// writer with a payload, the target's reader and completion writer, the
// completion reader), so that the first transfer does not pay for their
// first run (measured: the first 4 KiB write after warmup took 0.4-2 ms
// against 25-50 us once each connection had carried a request, and a
// connection's first payload cost 30-90 us more than a header alone). It
// returns the first error that is not that answer: the connection went
// down, or ctx ended.
func (t *Transport) ping(ctx context.Context, p *pipe.Peer[item], inst string) error {
	n := p.Conns()
	done := make(chan error, n) // Done never blocks, also after ctx ended
	ops := make([]op, n)
	for i := range ops {
		o := &ops[i]
		o.p, o.inst = p, inst
		o.write, o.local = true, mem.Addr(pingPayload[:])
		o.tk = transport.Ticket{Owner: transport.DoneFunc(func(err error) { done <- err })}
		o.remaining.Store(1)
		p.Send(i, item{op: o, n: uint64(len(pingPayload))})
	}
	for range n {
		select {
		case err := <-done:
			if err != nil && errs.CodeOf(err) != errs.AccessDenied {
				return err
			}
		case <-ctx.Done():
			code := errs.Canceled
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				code = errs.Timeout
			}
			return errs.Wrap(code, "tcp", ctx.Err(), "warming the connections to %s", p.Addr())
		}
	}
	return nil
}

// pingPayload is the payload of ping's WRITEs: never written anywhere, and
// read only by the socket (Go's heap does not move it).
var pingPayload [4096]byte

// dial connects to addr for the transport (what names the peer in errors,
// e.g. "Mooncake peer "): Closed once the transport closes, PeerUnreachable
// otherwise.
func (t *Transport) dial(ctx context.Context, addr, what string) (net.Conn, error) {
	// A connect that hangs with requests waiting is a silent peer: the
	// silence bound (the progress timeout) applies where it is the shorter,
	// so a rail whose NIC died gives its slices back within it.
	d := net.Dialer{Timeout: min(t.opt.DialTimeout, t.opt.Timeout)}
	remote, local, rail := splitVia(addr)
	if local != "" {
		// A rail's connection leaves from its NIC's address, so the
		// route (and the NIC) is the rail's, not the default one.
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	t.dialed.Add(1)
	nc, err := d.DialContext(ctx, "tcp", remote)
	if err != nil {
		if ctx.Err() != nil {
			return nil, errs.New(errs.Closed, "tcp", "transport closed")
		}
		return nil, errs.Wrap(errs.PeerUnreachable, "tcp", err, "connect to %s%s", what, addr)
	}
	tune(nc)
	if tc, ok := nc.(*net.TCPConn); ok && rail {
		// A rail's slices go to another rail when its connection is cut:
		// closing then drops what the kernel still holds to send (a
		// reset, not a FIN after it), so no byte of a slice sent again
		// elsewhere reaches the target late, when the link comes back.
		tc.SetLinger(0)
	}
	return nc, nil
}
