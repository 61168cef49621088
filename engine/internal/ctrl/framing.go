package ctrl

import (
	"bufio"
	"encoding/binary"
	"time"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

// The control framing (internal/wire/spec.md, "Frame" and "Call"): a frame
// header (length, kind) and a call header (id, flags) before each payload,
// requests and replies alike. Calls and replies are put on the wire with
// putCallHeader and writeCall, and read with readFrameHeader and
// readPayload, on both sides. In an authenticated session ("Frames in a
// session") the two headers travel as one record, opened before any field
// of it is used, and the payload as records; a nil Sealer or Opener (no
// session) passes bytes through. Mooncake's handshake frames (mooncake.go)
// have the frame header only and never a session.

// callFrameHeader is the size of the headers before a call's payload.
const callFrameHeader = wire.FrameHeaderSize + wire.CallHeaderSize

// sealedHeader is the headers' record in a session.
const sealedHeader = callFrameHeader + session.TagSize

// putCallHeader writes into h the headers of a call of kind with id, flags
// and a payload of n bytes.
func putCallHeader(h []byte, kind uint8, id uint64, flags uint8, n int) {
	_ = h[callFrameHeader-1]
	binary.LittleEndian.PutUint64(h[wire.OffFrameLength:], uint64(1+wire.CallHeaderSize+n))
	h[wire.OffFrameKind] = kind
	binary.LittleEndian.PutUint64(h[wire.FrameHeaderSize+wire.OffCallID:], id)
	h[wire.FrameHeaderSize+wire.OffCallFlags] = flags
}

// appendCall appends a call frame (headers and payload), sealed in a
// session, to dst.
func appendCall(dst []byte, seal *session.Sealer, kind uint8, id uint64, flags uint8, payload []byte) ([]byte, error) {
	var h [callFrameHeader]byte
	putCallHeader(h[:], kind, id, flags, len(payload))
	dst, err := seal.Seal(dst, h[:])
	if err != nil {
		return dst, err
	}
	return seal.Seal(dst, payload)
}

// head is a frame's headers as read.
type head struct {
	kind uint8
	n    uint64 // the call header and the payload: the frame length less its kind byte
	// call says id and flags are known: in a session they come with the
	// frame header, in one record; otherwise they are the body's first
	// bytes, read by readPayload.
	call  bool
	id    uint64
	flags uint8
}

// readFrameHeader reads a frame's headers; once their first byte came, the
// rest must follow within d (bytes already buffered need no deadline). In a
// session the record is opened before any field is looked at; a record
// that does not open is errs.Unauthenticated, and the connection must close.
func readFrameHeader(br *bufio.Reader, op *session.Opener, dl deadliner, d time.Duration) (head, error) {
	if op == nil {
		if br.Buffered() < wire.FrameHeaderSize {
			dl.SetReadDeadline(time.Now().Add(d))
		}
		kind, n, err := wire.ReadFrameHeader(br)
		return head{kind: kind, n: n}, err
	}
	if br.Buffered() < sealedHeader {
		dl.SetReadDeadline(time.Now().Add(d))
	}
	var buf [sealedHeader]byte
	p, err := op.ReadRecord(br, buf[:], callFrameHeader)
	if err != nil {
		return head{}, err
	}
	kind, n, err := wire.ParseFrameHeader(p)
	if err != nil {
		return head{}, err
	}
	if n < wire.CallHeaderSize {
		return head{}, errs.New(errs.Protocol, "rpc", "a frame of %d bytes is shorter than its call header", n)
	}
	c := p[wire.FrameHeaderSize:]
	return head{kind: kind, n: n, call: true, id: binary.LittleEndian.Uint64(c[wire.OffCallID:]), flags: c[wire.OffCallFlags]}, nil
}

// readPayload reads the rest of a call frame whose headers h were read
// (each 64 KiB within d) and returns the call.
func readPayload(br *bufio.Reader, op *session.Opener, dl deadliner, h head, d time.Duration) (wire.Call, error) {
	progress := func(size int) {
		if br.Buffered() < size {
			dl.SetReadDeadline(time.Now().Add(d))
		}
	}
	if !h.call {
		body, err := wire.ReadBody(br, h.n, progress)
		if err != nil {
			return wire.Call{}, err
		}
		return wire.DecodeCall(body)
	}
	if h.flags > wire.FlagReplyErr {
		return wire.Call{}, errs.New(errs.Protocol, "wire", "unknown call flags %d", h.flags)
	}
	p, err := op.ReadBody(br, h.n-wire.CallHeaderSize, progress)
	if err != nil {
		return wire.Call{}, err
	}
	return wire.Call{ID: h.id, Flags: h.flags, Payload: p}, nil
}

type deadliner interface{ SetReadDeadline(time.Time) error }
