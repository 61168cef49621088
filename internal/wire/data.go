package wire

import (
	"encoding/binary"

	"github.com/tecache/te/internal/errs"
)

// Data path of the tcp transport (spec.md, "Data path (tcp)"). An initiator
// opens a connection to the target's data listener, sends the preface, then
// any number of requests; the target answers each with one completion frame.
// All integers are little-endian.
//
// Preface, sent once by the initiator:
//
//	offset 0  8 bytes  "TEDATA" 0x00 0x02 (magic, version 2: the peer
//	                   authentication exchange follows the preface)
const (
	DataPreface     = "TEDATA\x00\x02"
	DataPrefaceSize = len(DataPreface)
)

// Request header, followed by Length bytes of payload for a WRITE:
//
//	offset 0   u8      kind: DataRead or DataWrite
//	offset 1   7 bytes reserved, zero
//	offset 8   u64     request id, chosen by the initiator, echoed in the completion
//	offset 16  u64     target address
//	offset 24  u64     length
//	offset 32  u64     buffer key (the te_key of the target buffer)
const (
	ReqHeaderSize  = 40
	OffReqKind     = 0
	OffReqReserved = 1
	OffReqID       = 8
	OffReqAddr     = 16
	OffReqLength   = 24
	OffReqKey      = 32
)

// Completion header, followed by Length bytes of payload for a READ that
// succeeded (Length is then the request's length; otherwise 0):
//
//	offset 0   u8      kind: DataCompletion
//	offset 1   3 bytes reserved, zero
//	offset 4   i32     status: an errs.Code, 0 for success
//	offset 8   u64     request id
//	offset 16  u64     payload length
const (
	CompHeaderSize  = 24
	OffCompKind     = 0
	OffCompReserved = 1
	OffCompStatus   = 4
	OffCompID       = 8
	OffCompLength   = 16
)

// Frame kinds of the data path.
const (
	DataRead       uint8 = 1
	DataWrite      uint8 = 2
	DataCompletion uint8 = 3
)

// MaxDataLength bounds one request's length. Initiators cut larger transfers
// into slices; a target refuses a longer header before it reads or allocates
// anything for it, and closes the connection (the payload that follows a
// WRITE header of that length cannot be trusted).
const MaxDataLength = 64 << 20

// DataRequest is a decoded request header.
type DataRequest struct {
	Kind   uint8
	ID     uint64
	Addr   uint64
	Length uint64
	Key    uint64
}

// PutDataRequest writes r's header into b, which must hold ReqHeaderSize bytes.
func PutDataRequest(b []byte, r DataRequest) {
	_ = b[ReqHeaderSize-1]
	b[OffReqKind] = r.Kind
	clear(b[OffReqReserved:OffReqID])
	binary.LittleEndian.PutUint64(b[OffReqID:], r.ID)
	binary.LittleEndian.PutUint64(b[OffReqAddr:], r.Addr)
	binary.LittleEndian.PutUint64(b[OffReqLength:], r.Length)
	binary.LittleEndian.PutUint64(b[OffReqKey:], r.Key)
}

// AppendDataRequest appends r's header to dst.
func AppendDataRequest(dst []byte, r DataRequest) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, ReqHeaderSize)...)
	PutDataRequest(dst[n:], r)
	return dst
}

// DecodeDataRequest decodes a request header. On a TooLarge error the
// returned header is filled in, so a target can name the request it refuses;
// on any other error it is the zero value. A zero length or key is not a
// decoding error: the target answers it with a status.
func DecodeDataRequest(b []byte) (DataRequest, error) {
	if len(b) < ReqHeaderSize {
		return DataRequest{}, errs.New(errs.Protocol, "wire", "request header of %d bytes is shorter than %d", len(b), ReqHeaderSize)
	}
	r := DataRequest{
		Kind:   b[OffReqKind],
		ID:     binary.LittleEndian.Uint64(b[OffReqID:]),
		Addr:   binary.LittleEndian.Uint64(b[OffReqAddr:]),
		Length: binary.LittleEndian.Uint64(b[OffReqLength:]),
		Key:    binary.LittleEndian.Uint64(b[OffReqKey:]),
	}
	if r.Kind != DataRead && r.Kind != DataWrite {
		return DataRequest{}, errs.New(errs.Protocol, "wire", "unknown data request kind %d", r.Kind)
	}
	for _, x := range b[OffReqReserved:OffReqID] {
		if x != 0 {
			return DataRequest{}, errs.New(errs.Protocol, "wire", "reserved bytes of a data request are not zero")
		}
	}
	if r.Length > MaxDataLength {
		return r, errs.New(errs.TooLarge, "wire", "request length %d exceeds %d", r.Length, MaxDataLength)
	}
	return r, nil
}

// Completion is a decoded completion header.
type Completion struct {
	Status errs.Code
	ID     uint64
	Length uint64
}

// PutCompletion writes c's header into b, which must hold CompHeaderSize bytes.
func PutCompletion(b []byte, c Completion) {
	_ = b[CompHeaderSize-1]
	b[OffCompKind] = DataCompletion
	clear(b[OffCompReserved:OffCompStatus])
	binary.LittleEndian.PutUint32(b[OffCompStatus:], uint32(c.Status))
	binary.LittleEndian.PutUint64(b[OffCompID:], c.ID)
	binary.LittleEndian.PutUint64(b[OffCompLength:], c.Length)
}

// AppendCompletion appends c's header to dst.
func AppendCompletion(dst []byte, c Completion) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, CompHeaderSize)...)
	PutCompletion(dst[n:], c)
	return dst
}

// DecodeCompletion decodes a completion header. A negative status, a payload
// on a failed request and a length above MaxDataLength are protocol errors.
func DecodeCompletion(b []byte) (Completion, error) {
	if len(b) < CompHeaderSize {
		return Completion{}, errs.New(errs.Protocol, "wire", "completion of %d bytes is shorter than %d", len(b), CompHeaderSize)
	}
	if b[OffCompKind] != DataCompletion {
		return Completion{}, errs.New(errs.Protocol, "wire", "unknown completion kind %d", b[OffCompKind])
	}
	for _, x := range b[OffCompReserved:OffCompStatus] {
		if x != 0 {
			return Completion{}, errs.New(errs.Protocol, "wire", "reserved bytes of a completion are not zero")
		}
	}
	c := Completion{
		Status: errs.Code(int32(binary.LittleEndian.Uint32(b[OffCompStatus:]))),
		ID:     binary.LittleEndian.Uint64(b[OffCompID:]),
		Length: binary.LittleEndian.Uint64(b[OffCompLength:]),
	}
	if c.Status < 0 {
		return Completion{}, errs.New(errs.Protocol, "wire", "negative completion status %d", int32(c.Status))
	}
	if c.Length > MaxDataLength {
		return Completion{}, errs.New(errs.Protocol, "wire", "completion length %d exceeds %d", c.Length, MaxDataLength)
	}
	if c.Status != errs.OK && c.Length != 0 {
		return Completion{}, errs.New(errs.Protocol, "wire", "failed completion carries %d payload bytes", c.Length)
	}
	return c, nil
}

// CheckDataPreface checks the initiator's preface.
func CheckDataPreface(b []byte) error {
	if len(b) < DataPrefaceSize || string(b[:DataPrefaceSize-1]) != DataPreface[:DataPrefaceSize-1] {
		return errs.New(errs.Protocol, "wire", "not a te data connection")
	}
	if b[DataPrefaceSize-1] != DataPreface[DataPrefaceSize-1] {
		return errs.New(errs.NotSupported, "wire", "data protocol version %d, this side speaks %d",
			b[DataPrefaceSize-1], DataPreface[DataPrefaceSize-1])
	}
	return nil
}
