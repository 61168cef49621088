package tcp

import (
	"bufio"
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tecache/te/engine/internal/pipe"
	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// Mooncake Transfer Engine's tcp data framing, version 2 (acknowledged;
// internal/wire/spec.md, "Mooncake interop"): a request header (and a WRITE's
// payload) per request, answered one at a time, in order, by a status (and a
// READ's payload). As an initiator te pipelines slices on pooled connections
// (internal/pipe, Ordered); as a target it serves a Mooncake initiator on the
// data listener when the engine accepts Mooncake peers.

// ParamAcceptMooncake is the transport parameter that makes the data listener
// serve Mooncake peers ("1" or "true"). The engine sets it from
// Config.AcceptMooncakePeers and the cluster secret; a user's Params cannot.
const ParamAcceptMooncake = "mooncake.accept"

const (
	// maxMcTries bounds how often a slice is sent again after the
	// connection it was on was cut for another request's sake (a refusal,
	// a cancellation).
	maxMcTries = 4
	// refuseLinger bounds how long a refused Mooncake connection is read
	// and dropped after the refusal was sent: closing with its WRITE
	// payload unread would reset the connection, and the initiator could
	// lose the refusal.
	refuseLinger   = time.Second
	refuseMaxDrain = 64 << 20
)

// mcState is the transport's Mooncake interop state.
type mcState struct {
	served atomic.Uint64 // Mooncake requests this target served
	noted  sync.Map      // refusal reason -> *atomic.Uint64, for rate-limited logs
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

// mcDialect is Mooncake's framing on the initiator side: no preface, no
// authentication (a Mooncake peer has neither).
type mcDialect struct{ t *Transport }

func (d mcDialect) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return d.t.dial(ctx, addr, "Mooncake peer ")
}

func (d mcDialect) Open(net.Conn, string) (pipe.Encoder[item], pipe.Decoder[item], error) {
	return &requests{t: d.t, size: wire.MooncakeHeaderSize, put: putMcRequest}, &mcStatuses{t: d.t}, nil
}

func putMcRequest(h []byte, _ uint64, it item) {
	op := wire.MooncakeRead
	if it.op.write {
		op = wire.MooncakeWrite
	}
	wire.PutMooncakeRequest(h, wire.MooncakeRequest{Size: it.n, Addr: it.op.remote + it.off, Op: op, V2: true})
}

// mcStatuses reads statuses, each OK READ's followed by its payload, and
// matches each to the oldest slice in flight.
type mcStatuses struct {
	t  *Transport
	sb [wire.MooncakeStatusSize]byte
}

func (d *mcStatuses) Decode(r *pipe.Reader[item]) error {
	// A Mooncake peer never has a session: nil Opener.
	if _, err := readFrame(r.Buf(), nil, d.sb[:], len(d.sb)); err != nil {
		return r.Lost(err)
	}
	s, err := r.Oldest()
	if err != nil {
		return err
	}
	code, err := wire.DecodeMooncakeStatus(d.sb[:])
	if err != nil {
		return errs.Wrap(errs.Protocol, "tcp", err, "from Mooncake peer %s", r.Addr())
	}
	it := s.Item
	if code != wire.MooncakeOK {
		// The target closes after a refusal; what followed the refused
		// slice was never served and goes to another connection. The
		// slice itself ends with the refusal once the writer is past it.
		r.Done(s, mooncakeRefusal(r.Addr(), code, it))
		return pipe.Requeue(errs.New(errs.PeerUnreachable, "tcp", "Mooncake peer %s closed after a refusal", r.Addr()))
	}
	if !it.op.write {
		// A READ's payload follows its status.
		r.Moved()
		if err := readPayload(r.Buf(), r.Conn(), nil, mem.Bytes(it.op.local+it.off, it.n), d.t.opt.Progress); err != nil {
			return r.Lost(err)
		}
	}
	r.Done(s, nil)
	return nil
}

func (d *mcStatuses) Close() {}

// mooncakeRefusal turns a target's refusal status into an error.
func mooncakeRefusal(addr string, code uint32, it item) error {
	c := errs.AccessDenied
	why := "refused"
	switch code {
	case wire.MooncakeAddrRejected:
		c, why = errs.AddressNotRegistered, "rejected the address of"
	case wire.MooncakeNotServed:
		c = errs.NotSupported
	}
	return errs.New(c, "tcp", "Mooncake peer %s %s %v of [%#x,+%d) (status %d)", addr, why, it.op.opcode(), it.op.remote+it.off, it.n, code)
}

// serveMooncake serves a Mooncake initiator: first holds the first 8 bytes
// of its first request header. Requests are served one at a time, in order,
// as Mooncake's own target does, with the same owner-side checks as te's
// requests except the key, which Mooncake does not have: the range must lie
// in one registered, remote-accessible buffer that is not being
// unregistered, and it is held (cur) while its bytes move, so Quiesce sees
// and can cut it. Only version 2 (acknowledged) requests are served, and only
// when AcceptMooncake is set; anything refused gets a status and the
// connection closes, as Mooncake's target does.
func (s *serverConn) serveMooncake(sv *server, first []byte) {
	br := sv.first
	var h [wire.MooncakeHeaderSize]byte
	n := copy(h[:], first)
	// The handshake deadline still covers the rest of the header.
	if _, err := readFrame(br, nil, h[n:], len(h)-n); err != nil {
		return
	}
	t := s.t
	w := &sv.w
	w.seal = nil // Mooncake's framing: no session
	for {
		req, err := wire.DecodeMooncakeRequest(h[:])
		if err != nil {
			return
		}
		if !req.V2 {
			// Version 1 has no acknowledgement and no refusal: all te can
			// do is close. te publishes tcp_proto_version 2, so only a
			// Mooncake older than that framing (or MC_TCP_PROTO=1) gets here.
			t.mc.note(t, "v1", "te: refused a Mooncake peer speaking unacknowledged tcp framing (version 1) from %s", s.nc.RemoteAddr())
			return
		}
		if !t.opt.AcceptMooncake {
			t.mc.note(t, "refused", "te: refused a Mooncake peer's request from %s: this engine does not accept Mooncake peers (Config.AcceptMooncakePeers, TE_ACCEPT_MOONCAKE_PEERS=1)", s.nc.RemoteAddr())
			s.refuseMooncake(br, wire.MooncakeRefused)
			return
		}
		// Key 0 skips the key check: reachable only here, with
		// AcceptMooncake on.
		region, err := t.reg.Acquire(req.Addr, req.Size, 0, true, segment.Anyone)
		if err != nil {
			s.refuseMooncake(br, wire.MooncakeAddrRejected)
			return
		}
		if isDevice(region) || segment.StorageOf(region) != nil {
			// Device memory and registered files are te's to serve
			// (staged), not a Mooncake peer's.
			region.Release()
			s.refuseMooncake(br, wire.MooncakeNotServed)
			return
		}
		s.cur.Store(region)
		buf := mem.Bytes(req.Addr, req.Size)
		w.begin(1, wire.MooncakeStatusSize)
		wire.PutMooncakeStatus(w.header(0), wire.MooncakeOK)
		if req.Op == wire.MooncakeWrite {
			err = readPayload(br, s.nc, nil, buf, t.opt.Progress)
			s.cur.Store(nil)
			region.Release()
			if err != nil {
				return
			}
			// Acknowledged only now that the payload is in memory.
			w.frame(0, nil)
			_, err = w.send(s.nc, nil, t.opt.Progress)
		} else {
			w.frame(0, buf)
			_, err = w.send(s.nc, nil, t.opt.Progress)
			s.cur.Store(nil)
			region.Release()
		}
		if err != nil {
			return
		}
		t.mc.served.Add(1)
		if _, err := s.readHeader(br, nil, h[:], len(h)); err != nil {
			return
		}
	}
}

// refuseMooncake sends a refusal status, then reads and drops what the
// initiator still sends (a WRITE's payload) until it closes, for a bounded
// time and amount, so the refusal is not lost to a reset. The caller closes.
func (s *serverConn) refuseMooncake(br *bufio.Reader, code uint32) {
	var st [wire.MooncakeStatusSize]byte
	wire.PutMooncakeStatus(st[:], code)
	s.nc.SetWriteDeadline(time.Now().Add(s.t.opt.Header))
	if _, err := s.nc.Write(st[:]); err != nil {
		return
	}
	if tc, ok := s.nc.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	s.nc.SetReadDeadline(time.Now().Add(min(refuseLinger, s.t.opt.Header)))
	io.Copy(io.Discard, io.LimitReader(br, refuseMaxDrain))
}
