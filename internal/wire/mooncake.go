package wire

import (
	"encoding/binary"
	"encoding/json"
	"io"

	"github.com/tecache/te/internal/errs"
)

// Mooncake Transfer Engine interop (spec.md, "Mooncake interop"). Two wire
// formats of Mooncake are spoken here: its peer-to-peer handshake on the
// control plane (the frame of control.go with kinds 0 to 3 and a JSON body,
// one exchange per connection) and its tcp transport's data framing, version
// 2 (acknowledged). Facts are taken from Mooncake at commit 3b5a594.

// MooncakeMaxHandshake bounds a Mooncake handshake frame: the frame's length
// field (kind byte included) may not exceed it, as in Mooncake
// (kDefaultHandshakeMaxLength, 1 MiB).
const MooncakeMaxHandshake = 1 << 20

// IsMooncakeKind reports whether a control frame of this kind is Mooncake's
// handshake (no call header, JSON body) rather than a te call.
func IsMooncakeKind(kind uint8) bool { return kind <= KindMooncakeProbe }

// ReadMooncakeFrame reads one handshake frame whose length field is at most
// max (MooncakeMaxHandshake on the serving side) and whose kind is one of
// Mooncake's. Oversize frames are refused before anything is allocated.
func ReadMooncakeFrame(r io.Reader, max uint64) (kind uint8, body []byte, err error) {
	if max == 0 {
		return 0, nil, errs.New(errs.InvalidArgument, "wire", "zero frame limit")
	}
	kind, body, err = ReadFrame(r, max-1)
	if err != nil {
		return 0, nil, err
	}
	if !IsMooncakeKind(kind) {
		return 0, nil, errs.New(errs.Protocol, "wire", "frame kind %#x is not a Mooncake handshake kind", kind)
	}
	return kind, body, nil
}

// MooncakeNotify is the JSON body of a kind 2 (Notify) frame.
type MooncakeNotify struct {
	Name string `json:"name"`
	Msg  string `json:"notify_msg"`
}

// MooncakeNotifyReply is what a Mooncake engine answers to a notify it queued.
var MooncakeNotifyReply = []byte(`{"name":"","notify_msg":"success"}`)

// MooncakeProbeReply is what a Mooncake engine answers to a probe.
var MooncakeProbeReply = []byte(`{"status":"success"}`)

// DecodeMooncakeNotify decodes a notify body. Missing fields are empty, as in
// Mooncake; a name over MaxNotifyName or a message over MaxNotifyMsg bytes is
// TooLarge, a body that is not a JSON object Protocol.
func DecodeMooncakeNotify(b []byte) (MooncakeNotify, error) {
	if len(b) > MooncakeMaxHandshake {
		return MooncakeNotify{}, errs.New(errs.TooLarge, "wire", "notify of %d bytes exceeds %d", len(b), MooncakeMaxHandshake)
	}
	var n MooncakeNotify
	if err := json.Unmarshal(b, &n); err != nil {
		return MooncakeNotify{}, errs.Wrap(errs.Protocol, "wire", err, "malformed Mooncake notify")
	}
	if len(n.Name) > MaxNotifyName || len(n.Msg) > MaxNotifyMsg {
		return MooncakeNotify{}, errs.New(errs.TooLarge, "wire", "notify name of %d or message of %d bytes exceeds %d/%d",
			len(n.Name), len(n.Msg), MaxNotifyName, MaxNotifyMsg)
	}
	return n, nil
}

// Mooncake's tcp data request header (its SessionHeader, 24 bytes with the
// compiler's padding), sent by the initiator on the target's tcp_data_port.
// A WRITE header is followed by size payload bytes; there is no request id:
// a connection carries one request at a time, answered in order.
//
//	offset 0   u64     size: payload bytes
//	offset 8   u64     addr: the target's virtual address
//	offset 16  u8      opcode: 0 READ, 1 WRITE; | 0x80 for version 2
//	offset 17  7 bytes padding (not initialised by Mooncake: never checked)
const (
	MooncakeHeaderSize = 24
	OffMcSize          = 0
	OffMcAddr          = 8
	OffMcOpcode        = 16

	MooncakeRead    uint8 = 0
	MooncakeWrite   uint8 = 1
	MooncakeV2Flag  uint8 = 0x80
	MooncakeVersion       = 2 // the tcp_proto_version te speaks and publishes
)

// Version 2 status frame: u64 little-endian, the magic "MCTV" in the high 32
// bits and a code in the low 32. A target sends one after applying a WRITE's
// payload, and one before a READ's payload; a refusal is a status with a
// non-zero code, after which the target closes the connection.
const (
	MooncakeStatusSize  = 8
	MooncakeStatusMagic = uint64(0x4D435456) << 32
	// Codes. 1 is Mooncake's own (kStatusAddrRejected); Mooncake logs any
	// other non-zero code and fails the request the same way.
	MooncakeOK           uint32 = 0
	MooncakeAddrRejected uint32 = 1 // not inside one registered, remote-accessible buffer
	MooncakeRefused      uint32 = 2 // this engine does not accept Mooncake peers
	MooncakeNotServed    uint32 = 3 // memory te cannot serve to a Mooncake peer (device memory)
)

// MooncakeRequest is a decoded data request header.
type MooncakeRequest struct {
	Size uint64
	Addr uint64
	Op   uint8 // MooncakeRead or MooncakeWrite
	V2   bool
}

// PutMooncakeRequest writes r's header into b (MooncakeHeaderSize bytes),
// padding zeroed.
func PutMooncakeRequest(b []byte, r MooncakeRequest) {
	_ = b[MooncakeHeaderSize-1]
	binary.LittleEndian.PutUint64(b[OffMcSize:], r.Size)
	binary.LittleEndian.PutUint64(b[OffMcAddr:], r.Addr)
	op := r.Op
	if r.V2 {
		op |= MooncakeV2Flag
	}
	b[OffMcOpcode] = op
	clear(b[OffMcOpcode+1 : MooncakeHeaderSize])
}

// DecodeMooncakeRequest decodes a request header. An opcode other than READ
// or WRITE (with or without the version 2 flag) is a Protocol error: Mooncake
// would serve it as a READ, te does not guess.
func DecodeMooncakeRequest(b []byte) (MooncakeRequest, error) {
	if len(b) < MooncakeHeaderSize {
		return MooncakeRequest{}, errs.New(errs.Protocol, "wire", "Mooncake header of %d bytes is shorter than %d", len(b), MooncakeHeaderSize)
	}
	op := b[OffMcOpcode]
	r := MooncakeRequest{
		Size: binary.LittleEndian.Uint64(b[OffMcSize:]),
		Addr: binary.LittleEndian.Uint64(b[OffMcAddr:]),
		Op:   op &^ MooncakeV2Flag,
		V2:   op&MooncakeV2Flag != 0,
	}
	if r.Op != MooncakeRead && r.Op != MooncakeWrite {
		return MooncakeRequest{}, errs.New(errs.Protocol, "wire", "Mooncake opcode %#x is neither READ nor WRITE", op)
	}
	return r, nil
}

// LooksLikeMooncake tells a Mooncake data connection from a te one by its
// first 8 bytes: Mooncake's start with a u64 payload size, which is below
// 2^48 for any memory that can be registered, so bytes 6 and 7 are zero;
// every te preface has a non-zero byte there ("TEDATA" 0x00 0x01 ends in 1).
func LooksLikeMooncake(first []byte) bool {
	return len(first) >= 8 && first[6] == 0 && first[7] == 0
}

// PutMooncakeStatus writes a status frame with code into b (8 bytes).
func PutMooncakeStatus(b []byte, code uint32) {
	binary.LittleEndian.PutUint64(b, MooncakeStatusMagic|uint64(code))
}

// DecodeMooncakeStatus decodes a status frame and returns its code; a frame
// without the magic (a peer that speaks version 1, or a stream out of step)
// is a Protocol error.
func DecodeMooncakeStatus(b []byte) (uint32, error) {
	if len(b) < MooncakeStatusSize {
		return 0, errs.New(errs.Protocol, "wire", "Mooncake status of %d bytes is shorter than %d", len(b), MooncakeStatusSize)
	}
	v := binary.LittleEndian.Uint64(b)
	if v&^0xFFFFFFFF != MooncakeStatusMagic {
		return 0, errs.New(errs.Protocol, "wire", "Mooncake status frame %#016x lacks its magic", v)
	}
	return uint32(v), nil
}
