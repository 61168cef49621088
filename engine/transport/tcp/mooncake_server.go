package tcp

import (
	"bufio"
	"io"
	"net"
	"time"

	"github.com/tecache/te/engine/segment"
	"github.com/tecache/te/internal/sys/mem"
	"github.com/tecache/te/internal/wire"
)

// ParamAcceptMooncake is the transport parameter that makes the data listener
// serve Mooncake peers ("1" or "true"). The engine sets it from
// Config.AcceptMooncakePeers and the cluster secret; a user's Params cannot.
const ParamAcceptMooncake = "mooncake.accept"

// refuseLinger bounds how long a refused Mooncake connection is read and
// dropped after the refusal was sent: closing with its WRITE payload unread
// would reset the connection, and the initiator could lose the refusal.
const (
	refuseLinger   = time.Second
	refuseMaxDrain = 64 << 20
)

// serveMooncake serves a Mooncake initiator (spec.md, "Mooncake interop"):
// first holds the first 8 bytes of its first request header. Requests are
// served one at a time, in order, as Mooncake's own target does, with the
// same owner-side checks as te's requests except the key, which Mooncake does
// not have: the range must lie in one registered, remote-accessible buffer
// that is not being unregistered, and it is held (cur) while its bytes move,
// so Quiesce sees and can cut it. Only version 2 (acknowledged) requests are
// served, and only when AcceptMooncake is set; anything refused gets a status
// and the connection closes, as Mooncake's target does.
func (s *serverConn) serveMooncake(br *bufio.Reader, first []byte) {
	var h [wire.MooncakeHeaderSize]byte
	n := copy(h[:], first)
	// readLoop's handshake deadline still covers the rest of the header.
	if _, err := io.ReadFull(br, h[n:]); err != nil {
		return
	}
	t := s.t
	var st [wire.MooncakeStatusSize]byte
	var bufs, chunk net.Buffers
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
		region, err := t.reg.Acquire(req.Addr, req.Size, 0, true)
		if err != nil {
			s.refuseMooncake(br, wire.MooncakeAddrRejected)
			return
		}
		if isDevice(region) || segment.StorageOf(region) != nil {
			region.Release()
			s.refuseMooncake(br, wire.MooncakeNotServed)
			return
		}
		s.cur.Store(region)
		buf := mem.Bytes(req.Addr, req.Size)
		wire.PutMooncakeStatus(st[:], wire.MooncakeOK)
		if req.Op == wire.MooncakeWrite {
			err = readProgress(br, s.nc, buf, t.opt.Progress)
			s.cur.Store(nil)
			region.Release()
			if err != nil {
				return
			}
			// Acknowledged only now that the payload is in memory.
			bufs = append(bufs[:0], st[:])
			chunk, err = writeProgress(s.nc, bufs, chunk, t.opt.Progress)
		} else {
			bufs = append(bufs[:0], st[:], buf)
			chunk, err = writeProgress(s.nc, bufs, chunk, t.opt.Progress)
			s.cur.Store(nil)
			region.Release()
		}
		if err != nil {
			return
		}
		t.mc.served.Add(1)
		if err := s.readHeader(br, h[:]); err != nil {
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
