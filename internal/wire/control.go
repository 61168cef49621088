package wire

import (
	"encoding/binary"
	"io"
	"sync"

	"github.com/tecache/te/internal/errs"
)

// Control-plane frame: the framing of Mooncake's peer-to-peer handshake, so one
// listener can tell a Mooncake peer's frame from te's own by its type byte.
//
//	offset 0  u64 LE  length: bytes that follow, type byte included
//	offset 8  u8      kind
//	offset 9  ...     body (length-1 bytes)
const (
	FrameHeaderSize = 9
	OffFrameLength  = 0
	OffFrameKind    = 8
)

// Frame kinds. 0 to 3 are Mooncake's (Connection, Metadata, Notify, Probe) and
// stay reserved for talking to a Mooncake peer. te's kinds start at 0x10;
// transports own the kinds from KindTransportBase up.
const (
	KindMooncakeConnection uint8 = 0
	KindMooncakeMetadata   uint8 = 1
	KindMooncakeNotify     uint8 = 2
	KindMooncakeProbe      uint8 = 3

	KindDescribe uint8 = 0x10 // fetch the segment descriptor (peer-to-peer metadata)
	KindNotify   uint8 = 0x11 // deliver a (name, message) notification
	KindProbe    uint8 = 0x12 // liveness and identity
	KindAuth     uint8 = 0x13 // the authentication exchange opening every connection
	// KindNotifyOnce is Notify with a sender-chosen id the receiver
	// dedups, so a sender may send it again after a lost reply.
	KindNotifyOnce uint8 = 0x14

	KindTransportBase uint8 = 0x40
	KindShm           uint8 = 0x40
	KindRDMA          uint8 = 0x41
	KindCUDA          uint8 = 0x42
	KindFabric        uint8 = 0x46 // the fabric transport's endpoint exchange
	KindCXL           uint8 = 0x48 // shm's messages, for the cxl transport
)

// Frame body limits (spec.md, "Frame").
const (
	// DefaultMaxFrame is the default bound of a descriptor carried in a
	// Describe reply: the largest descriptor a decoder accepts.
	DefaultMaxFrame = 16 << 20
	// MaxSmallPayload bounds the payload of a call whose kind carries no
	// descriptor and has no bound of its own.
	MaxSmallPayload = 64 << 10
	// MaxShmPayload bounds a shm control payload (4096 items of 24 bytes
	// and a few strings).
	MaxShmPayload = 128 << 10
	// MaxNotifyBody is the largest Notify request body: the call header and
	// the largest notify payload.
	MaxNotifyBody = CallHeaderSize + 2 + MaxNotifyName + 4 + MaxNotifyMsg
	// MaxNotifyOnceBody is the largest NotifyOnce request body: the id
	// and the largest Notify body.
	MaxNotifyOnceBody = NotifyIDSize + MaxNotifyBody
	// BodyChunk is the step in which a body is read (its buffer grows by
	// at most this much ahead of the bytes that arrived) and in which
	// progress is measured.
	BodyChunk = 64 << 10
)

// RequestLimit returns the largest body of a request frame of kind.
func RequestLimit(kind uint8) uint64 {
	switch kind {
	case KindAuth:
		return MaxAuthBody
	case KindNotify:
		return MaxNotifyBody
	case KindNotifyOnce:
		return MaxNotifyOnceBody
	case KindShm:
		return CallHeaderSize + MaxShmPayload
	}
	return CallHeaderSize + MaxSmallPayload
}

// ReplyLimit returns the largest body of a reply frame of kind; maxDesc
// bounds the descriptor a Describe reply carries.
func ReplyLimit(kind uint8, maxDesc uint64) uint64 {
	switch kind {
	case KindDescribe:
		return CallHeaderSize + maxDesc
	case KindShm:
		return CallHeaderSize + MaxShmPayload
	}
	return CallHeaderSize + MaxSmallPayload
}

// ReadFrameHeader reads a frame header and returns its kind and body length.
// A length of zero (no room for the type byte) is a protocol error.
func ReadFrameHeader(r io.Reader) (kind uint8, n uint64, err error) {
	var h [FrameHeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, 0, err
	}
	return ParseFrameHeader(h[:])
}

// ParseFrameHeader decodes the first FrameHeaderSize bytes of b.
func ParseFrameHeader(b []byte) (kind uint8, n uint64, err error) {
	l := binary.LittleEndian.Uint64(b[OffFrameLength:])
	if l == 0 {
		return 0, 0, errs.New(errs.Protocol, "wire", "frame length 0 lacks its type byte")
	}
	return b[OffFrameKind], l - 1, nil
}

// ReadBody reads an n-byte body as it arrives: the buffer grows in steps of
// at most BodyChunk ahead of the bytes received (doubling, so the copies
// cost at most twice the body), never to the claimed length up front.
// beforeChunk, if not nil, is called with the chunk's size before each
// chunk is read (a caller sets its progress deadline there).
func ReadBody(r io.Reader, n uint64, beforeChunk func(size int)) ([]byte, error) {
	buf := make([]byte, 0, min(n, BodyChunk))
	for uint64(len(buf)) < n {
		want := int(min(n-uint64(len(buf)), BodyChunk))
		if cap(buf)-len(buf) < want {
			nc := uint64(max(2*cap(buf), len(buf)+want))
			nb := make([]byte, len(buf), min(nc, n))
			copy(nb, buf)
			buf = nb
		}
		if beforeChunk != nil {
			beforeChunk(want)
		}
		if _, err := io.ReadFull(r, buf[len(buf):len(buf)+want]); err != nil {
			return nil, err
		}
		buf = buf[:len(buf)+want]
	}
	return buf, nil
}

// DiscardBody reads and drops n bytes through a pooled BodyChunk buffer,
// calling beforeChunk like ReadBody.
func DiscardBody(r io.Reader, n uint64, beforeChunk func(size int)) error {
	bp := scratch.Get().(*[BodyChunk]byte)
	defer scratch.Put(bp)
	for n > 0 {
		want := min(n, BodyChunk)
		if beforeChunk != nil {
			beforeChunk(int(want))
		}
		if _, err := io.ReadFull(r, bp[:want]); err != nil {
			return err
		}
		n -= want
	}
	return nil
}

var scratch = sync.Pool{New: func() any { return new([BodyChunk]byte) }}

// ReadFrame reads one frame. A length above max (or zero: the type byte is
// always there) is refused before anything is allocated; the body is read
// as it arrives (ReadBody).
func ReadFrame(r io.Reader, max uint64) (kind uint8, body []byte, err error) {
	kind, n, err := ReadFrameHeader(r)
	if err != nil {
		return 0, nil, err
	}
	if n > max {
		return 0, nil, errs.New(errs.TooLarge, "wire", "frame of %d bytes exceeds the limit of %d", n, max)
	}
	body, err = ReadBody(r, n, nil)
	if err != nil {
		return 0, nil, err
	}
	return kind, body, nil
}

// AppendFrame appends a frame of kind with body to dst.
func AppendFrame(dst []byte, kind uint8, body []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, uint64(len(body))+1)
	dst = append(dst, kind)
	return append(dst, body...)
}

// te's control messages (kinds 0x10 and up) carry a call header in the body:
//
//	offset 0  u64 LE  call id (chosen by the caller, echoed in the reply)
//	offset 8  u8      flags: 0 request, 1 reply ok, 2 reply error
//	offset 9  ...     payload; an error reply's payload is i32 LE code + UTF-8 message
const (
	CallHeaderSize = 9
	OffCallID      = 0
	OffCallFlags   = 8

	FlagRequest  uint8 = 0
	FlagReplyOK  uint8 = 1
	FlagReplyErr uint8 = 2
)

// Call is a decoded control message.
type Call struct {
	ID      uint64
	Flags   uint8
	Payload []byte
}

// AppendCall appends a call body (header and payload).
func AppendCall(dst []byte, id uint64, flags uint8, payload []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id)
	dst = append(dst, flags)
	return append(dst, payload...)
}

// DecodeCall decodes a call body; the payload aliases body.
func DecodeCall(body []byte) (Call, error) {
	if len(body) < CallHeaderSize {
		return Call{}, errs.New(errs.Protocol, "wire", "call body of %d bytes is shorter than its %d-byte header", len(body), CallHeaderSize)
	}
	c := Call{ID: binary.LittleEndian.Uint64(body[OffCallID:]), Flags: body[OffCallFlags], Payload: body[CallHeaderSize:]}
	if c.Flags > FlagReplyErr {
		return Call{}, errs.New(errs.Protocol, "wire", "unknown call flags %d", c.Flags)
	}
	return c, nil
}

// AppendError appends an error reply payload.
func AppendError(dst []byte, code errs.Code, msg string) []byte {
	dst = binary.LittleEndian.AppendUint32(dst, uint32(code))
	return append(dst, msg...)
}

// DecodeError decodes an error reply payload into an *errs.Error.
func DecodeError(p []byte) *errs.Error {
	if len(p) < 4 {
		return errs.New(errs.Protocol, "wire", "short error reply")
	}
	code := errs.Code(int32(binary.LittleEndian.Uint32(p)))
	if code <= 0 {
		code = errs.Internal
	}
	return &errs.Error{Code: code, Op: "remote", Msg: string(p[4:])}
}

// Notify payload:
//
//	offset 0  u16 LE  name length N
//	offset 2  N       name
//	offset 2+N u32 LE message length M
//	offset 6+N M      message
const (
	MaxNotifyName = 1 << 12
	MaxNotifyMsg  = 16 << 20
)

// AppendNotify appends a notify payload.
func AppendNotify(dst []byte, name, msg []byte) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(name)))
	dst = append(dst, name...)
	dst = binary.LittleEndian.AppendUint32(dst, uint32(len(msg)))
	return append(dst, msg...)
}

// DecodeNotify decodes a notify payload; name and msg are copies.
func DecodeNotify(p []byte) (name, msg []byte, err error) {
	name, msg, err = ParseNotify(p)
	if err != nil {
		return nil, nil, err
	}
	return append([]byte(nil), name...), append([]byte(nil), msg...), nil
}

// NotifyOnce payload: a notify payload after the sender's id for it.
//
//	offset 0  u64 LE  id, chosen by the sender, the same in every attempt
//	offset 8  ...     notify payload
const NotifyIDSize = 8

// AppendNotifyOnce appends a NotifyOnce payload.
func AppendNotifyOnce(dst []byte, id uint64, name, msg []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id)
	return AppendNotify(dst, name, msg)
}

// ParseNotifyOnce decodes a NotifyOnce payload; name and msg alias p.
func ParseNotifyOnce(p []byte) (id uint64, name, msg []byte, err error) {
	if len(p) < NotifyIDSize {
		return 0, nil, nil, errs.New(errs.Protocol, "wire", "notify of %d bytes lacks its id", len(p))
	}
	name, msg, err = ParseNotify(p[NotifyIDSize:])
	if err != nil {
		return 0, nil, nil, err
	}
	return binary.LittleEndian.Uint64(p), name, msg, nil
}

// ParseNotify decodes a notify payload; name and msg alias p.
func ParseNotify(p []byte) (name, msg []byte, err error) {
	if len(p) < 2 {
		return nil, nil, errs.New(errs.Protocol, "wire", "short notify")
	}
	n := int(binary.LittleEndian.Uint16(p))
	if n > MaxNotifyName || len(p) < 2+n+4 {
		return nil, nil, errs.New(errs.Protocol, "wire", "notify name length %d out of bounds", n)
	}
	name = p[2 : 2+n]
	m := uint64(binary.LittleEndian.Uint32(p[2+n:]))
	rest := p[6+n:]
	if m > MaxNotifyMsg || uint64(len(rest)) != m {
		return nil, nil, errs.New(errs.Protocol, "wire", "notify message length %d does not match the %d bytes sent", m, len(rest))
	}
	return name, rest, nil
}
