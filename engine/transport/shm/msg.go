package shm

import (
	"encoding/binary"

	"github.com/tecache/te/internal/errs"
)

// Control messages of the shm transport travel as wire.KindShm calls. Each
// payload (request and reply) starts with an op byte; the layouts are in
// internal/wire/spec.md, section "shm control messages".
const (
	opAttach   uint8 = 1 // peer -> owner: start a session, learn the probe
	opValidate uint8 = 2 // peer -> owner: check buffer keys, renew the lease
	opRevoke   uint8 = 3 // owner -> peer: stop using these buffers, then reply
	opDetach   uint8 = 4 // peer -> owner: end a session
)

// Bounds checked by the decoders before anything is allocated.
const (
	maxStr   = 256  // boot id, pid namespace, instance, rpc address
	maxItems = 4096 // buffers in one validate or revoke
	tokenLen = 16   // probe token
)

// item names one buffer registration: its capability key and a range.
type item struct {
	Key, Addr, Len uint64
}

// grant is the owner's answer for one validated item: Code 0 and the whole
// registered span, or the code of the refusal.
type grant struct {
	Code      errs.Code
	Addr, Len uint64
}

type attachReq struct {
	Pid      uint32
	BootID   string
	PidNS    string
	Instance string
	RPC      string
}

type attachRep struct {
	Session uint64
	LeaseNS uint64
	Probe   uint64 // address of the owner's probe token
	Token   [tokenLen]byte
}

type validateReq struct {
	Session uint64
	Items   []item
}

type validateRep struct {
	LeaseNS uint64
	Grants  []grant
}

type revokeReq struct {
	Owner   string // the owner's engine instance
	Session uint64
	Items   []item
}

type detachReq struct {
	Session uint64
}

// dec reads a payload front to back; the first short read sticks as an error.
type dec struct {
	b   []byte
	bad bool
}

func (d *dec) take(n int) []byte {
	if d.bad || n > len(d.b) {
		d.bad = true
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *dec) u8() uint8 {
	if p := d.take(1); p != nil {
		return p[0]
	}
	return 0
}

func (d *dec) u32() uint32 {
	if p := d.take(4); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *dec) u64() uint64 {
	if p := d.take(8); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *dec) str() string {
	n := 0
	if p := d.take(2); p != nil {
		n = int(binary.LittleEndian.Uint16(p))
	}
	if n > maxStr {
		d.bad = true
		return ""
	}
	return string(d.take(n))
}

// count reads an item count and checks that size bytes per item remain, so a
// lying count never allocates.
func (d *dec) count(size int) int {
	n := int(d.u32())
	if n > maxItems || n*size > len(d.b) {
		d.bad = true
		return 0
	}
	return n
}

func (d *dec) items() []item {
	n := d.count(24)
	if d.bad {
		return nil
	}
	out := make([]item, n)
	for i := range out {
		out[i] = item{d.u64(), d.u64(), d.u64()}
	}
	return out
}

// end reports a malformed payload: short, too long, or over a bound.
func (d *dec) end(what string) error {
	if d.bad || len(d.b) != 0 {
		return errs.New(errs.Protocol, "shm", "malformed %s message", what)
	}
	return nil
}

func open(p []byte, op uint8, what string) (*dec, error) {
	d := &dec{b: p}
	if d.u8() != op || d.bad {
		return nil, errs.New(errs.Protocol, "shm", "malformed %s message", what)
	}
	return d, nil
}

func appendStr(b []byte, s string) []byte {
	if len(s) > maxStr {
		s = s[:maxStr]
	}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

func appendItems(b []byte, items []item) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(items)))
	for _, it := range items {
		b = binary.LittleEndian.AppendUint64(b, it.Key)
		b = binary.LittleEndian.AppendUint64(b, it.Addr)
		b = binary.LittleEndian.AppendUint64(b, it.Len)
	}
	return b
}

// Op returns the op byte of a request payload (0 if empty).
func opOf(p []byte) uint8 {
	if len(p) == 0 {
		return 0
	}
	return p[0]
}

func (m *attachReq) encode() []byte {
	b := []byte{opAttach}
	b = binary.LittleEndian.AppendUint32(b, m.Pid)
	b = appendStr(b, m.BootID)
	b = appendStr(b, m.PidNS)
	b = appendStr(b, m.Instance)
	return appendStr(b, m.RPC)
}

func decodeAttachReq(p []byte) (attachReq, error) {
	d, err := open(p, opAttach, "attach")
	if err != nil {
		return attachReq{}, err
	}
	m := attachReq{Pid: d.u32(), BootID: d.str(), PidNS: d.str(), Instance: d.str(), RPC: d.str()}
	return m, d.end("attach")
}

func (m *attachRep) encode() []byte {
	b := []byte{opAttach}
	b = binary.LittleEndian.AppendUint64(b, m.Session)
	b = binary.LittleEndian.AppendUint64(b, m.LeaseNS)
	b = binary.LittleEndian.AppendUint64(b, m.Probe)
	return append(b, m.Token[:]...)
}

func decodeAttachRep(p []byte) (attachRep, error) {
	d, err := open(p, opAttach, "attach reply")
	if err != nil {
		return attachRep{}, err
	}
	m := attachRep{Session: d.u64(), LeaseNS: d.u64(), Probe: d.u64()}
	copy(m.Token[:], d.take(tokenLen))
	return m, d.end("attach reply")
}

func (m *validateReq) encode() []byte {
	b := []byte{opValidate}
	b = binary.LittleEndian.AppendUint64(b, m.Session)
	return appendItems(b, m.Items)
}

func decodeValidateReq(p []byte) (validateReq, error) {
	d, err := open(p, opValidate, "validate")
	if err != nil {
		return validateReq{}, err
	}
	m := validateReq{Session: d.u64()}
	m.Items = d.items()
	return m, d.end("validate")
}

func (m *validateRep) encode() []byte {
	b := []byte{opValidate}
	b = binary.LittleEndian.AppendUint64(b, m.LeaseNS)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(m.Grants)))
	for _, g := range m.Grants {
		b = binary.LittleEndian.AppendUint32(b, uint32(g.Code))
		b = binary.LittleEndian.AppendUint64(b, g.Addr)
		b = binary.LittleEndian.AppendUint64(b, g.Len)
	}
	return b
}

func decodeValidateRep(p []byte) (validateRep, error) {
	d, err := open(p, opValidate, "validate reply")
	if err != nil {
		return validateRep{}, err
	}
	m := validateRep{LeaseNS: d.u64()}
	n := d.count(20)
	if !d.bad {
		m.Grants = make([]grant, n)
		for i := range m.Grants {
			m.Grants[i] = grant{errs.Code(int32(d.u32())), d.u64(), d.u64()}
		}
	}
	return m, d.end("validate reply")
}

func (m *revokeReq) encode() []byte {
	b := []byte{opRevoke}
	b = appendStr(b, m.Owner)
	b = binary.LittleEndian.AppendUint64(b, m.Session)
	return appendItems(b, m.Items)
}

func decodeRevokeReq(p []byte) (revokeReq, error) {
	d, err := open(p, opRevoke, "revoke")
	if err != nil {
		return revokeReq{}, err
	}
	m := revokeReq{Owner: d.str(), Session: d.u64()}
	m.Items = d.items()
	return m, d.end("revoke")
}

func (m *detachReq) encode() []byte {
	return binary.LittleEndian.AppendUint64([]byte{opDetach}, m.Session)
}

func decodeDetachReq(p []byte) (detachReq, error) {
	d, err := open(p, opDetach, "detach")
	if err != nil {
		return detachReq{}, err
	}
	m := detachReq{Session: d.u64()}
	return m, d.end("detach")
}

// ackReply is the reply to revoke and detach: the op byte alone.
func ackReply(op uint8) []byte { return []byte{op} }

func checkAck(p []byte, op uint8) error {
	if len(p) != 1 || p[0] != op {
		return errs.New(errs.Protocol, "shm", "malformed acknowledgement")
	}
	return nil
}
