package cudaipc

import (
	"encoding/binary"

	"github.com/tecache/te/internal/errs"
)

// Control messages of kind wire.KindCUDA (see internal/wire/spec.md, "cuda
// control messages"). Every body starts with an op byte; integers are
// little-endian; strings are u16 length + bytes.
const (
	opOpen    = 1 // peer -> owner: I am about to open the handle of buffer key
	opClose   = 2 // owner -> peer: close your mappings of buffer key, then reply
	opRelease = 3 // peer -> owner: I closed my mapping of buffer key on my own
)

// maxStr bounds the strings in a message (instance ids, control addresses).
const maxStr = 1024

// msg is any of the three messages; fields an op does not use are zero.
type msg struct {
	Op       uint8
	Key      uint64 // the buffer's capability key
	Addr     uint64 // open: the buffer's address in the owner
	Length   uint64 // open: its length
	Pid      uint32 // open: the peer's pid (same pid namespace)
	Instance string // open, release: the peer's instance; close: the owner's
	RPC      string // open: the peer's control address
}

func putStr(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func (m *msg) encode() []byte {
	b := []byte{m.Op}
	b = binary.LittleEndian.AppendUint64(b, m.Key)
	switch m.Op {
	case opOpen:
		b = binary.LittleEndian.AppendUint64(b, m.Addr)
		b = binary.LittleEndian.AppendUint64(b, m.Length)
		b = binary.LittleEndian.AppendUint32(b, m.Pid)
		b = putStr(b, m.Instance)
		b = putStr(b, m.RPC)
	case opClose, opRelease:
		b = putStr(b, m.Instance)
	}
	return b
}

type reader struct {
	b   []byte
	bad bool
}

func (r *reader) n(k int) []byte {
	if r.bad || len(r.b) < k {
		r.bad = true
		return make([]byte, k)
	}
	v := r.b[:k]
	r.b = r.b[k:]
	return v
}
func (r *reader) u32() uint32 { return binary.LittleEndian.Uint32(r.n(4)) }
func (r *reader) u64() uint64 { return binary.LittleEndian.Uint64(r.n(8)) }
func (r *reader) str() string {
	k := int(binary.LittleEndian.Uint16(r.n(2)))
	if k > maxStr {
		r.bad = true
		return ""
	}
	return string(r.n(k))
}

// decode parses a message; anything malformed is a Protocol error.
func decode(b []byte) (*msg, error) {
	if len(b) < 9 {
		return nil, errs.New(errs.Protocol, "cudaipc", "message of %d bytes is too short", len(b))
	}
	m := &msg{Op: b[0]}
	r := &reader{b: b[1:]}
	m.Key = r.u64()
	switch m.Op {
	case opOpen:
		m.Addr, m.Length, m.Pid = r.u64(), r.u64(), r.u32()
		m.Instance, m.RPC = r.str(), r.str()
	case opClose, opRelease:
		m.Instance = r.str()
	default:
		return nil, errs.New(errs.Protocol, "cudaipc", "unknown op %d", m.Op)
	}
	if r.bad || len(r.b) != 0 {
		return nil, errs.New(errs.Protocol, "cudaipc", "malformed op %d message of %d bytes", m.Op, len(b))
	}
	return m, nil
}

// ack is the reply to every message: the op, and for close the number of
// mappings closed.
func ack(op uint8, n uint32) []byte {
	return binary.LittleEndian.AppendUint32([]byte{op}, n)
}

func checkAck(b []byte, op uint8) (uint32, error) {
	if len(b) != 5 || b[0] != op {
		return 0, errs.New(errs.Protocol, "cudaipc", "bad reply to op %d", op)
	}
	return binary.LittleEndian.Uint32(b[1:]), nil
}
