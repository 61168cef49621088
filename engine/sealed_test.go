package engine_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/tecache/te/internal/peerauth"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

// Helpers for tests that speak the control plane's sealed framing by hand
// (internal/wire/spec.md, "Frames in a session"), as a peer that holds the
// secret but misbehaves would.

// rawSessionPeer dials addr from src and runs the version 2 exchange as
// instance inst with secret s: the session it returns seals what the caller
// writes and opens what it reads.
func rawSessionPeer(t testing.TB, addr, src string, s *peerauth.Secret, inst string) (net.Conn, *session.Session) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	o, err := peerauth.ClientSession(c, s, inst, time.Now().Add(5*time.Second), peerauth.SessionOptions{Channel: session.Control})
	if err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c, o.Session
}

// writeSealedCall writes a request of kind with id whose payload is parts,
// concatenated: the frame and call headers as one record, the payload as
// records of 64 KiB (the last shorter), sealed through two small buffers.
func writeSealedCall(w io.Writer, s *session.Sealer, kind uint8, id uint64, parts ...[]byte) error {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	var h [wire.FrameHeaderSize + wire.CallHeaderSize]byte
	binary.LittleEndian.PutUint64(h[wire.OffFrameLength:], uint64(1+wire.CallHeaderSize+n))
	h[wire.OffFrameKind] = kind
	binary.LittleEndian.PutUint64(h[wire.FrameHeaderSize+wire.OffCallID:], id)
	h[wire.FrameHeaderSize+wire.OffCallFlags] = wire.FlagRequest
	rec, err := s.Seal(nil, h[:])
	if err != nil {
		return err
	}
	if _, err := w.Write(rec); err != nil {
		return err
	}
	plain := make([]byte, 0, session.RecordSize)
	out := make([]byte, 0, session.RecordSize+session.TagSize)
	flush := func() error {
		var err error
		if out, err = s.Seal(out[:0], plain); err != nil {
			return err
		}
		plain = plain[:0]
		_, err = w.Write(out)
		return err
	}
	for _, p := range parts {
		for len(p) > 0 {
			k := min(len(p), session.RecordSize-len(plain))
			plain, p = append(plain, p[:k]...), p[k:]
			if len(plain) == session.RecordSize {
				if err := flush(); err != nil {
					return err
				}
			}
		}
	}
	if len(plain) > 0 {
		return flush()
	}
	return nil
}

// readSealedReply reads one reply frame sealed in the session.
func readSealedReply(r *bufio.Reader, o *session.Opener) (wire.Call, error) {
	var b [wire.FrameHeaderSize + wire.CallHeaderSize + session.TagSize]byte
	p, err := o.ReadRecord(r, b[:], wire.FrameHeaderSize+wire.CallHeaderSize)
	if err != nil {
		return wire.Call{}, err
	}
	_, n, err := wire.ParseFrameHeader(p)
	if err != nil {
		return wire.Call{}, err
	}
	c := wire.Call{ID: binary.LittleEndian.Uint64(p[wire.FrameHeaderSize+wire.OffCallID:]), Flags: p[wire.FrameHeaderSize+wire.OffCallFlags]}
	if c.Payload, err = o.ReadBody(r, n-wire.CallHeaderSize, nil); err != nil {
		return wire.Call{}, err
	}
	return c, nil
}
