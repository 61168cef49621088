package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/tecache/te/internal/errs"
)

func TestDataRequestLayout(t *testing.T) {
	r := DataRequest{Kind: DataWrite, ID: 0x0102030405060708, Addr: 0x1000, Length: 4096, Key: 0xdeadbeef}
	b := AppendDataRequest([]byte{0xff}, r)[1:]
	if len(b) != ReqHeaderSize {
		t.Fatalf("header is %d bytes, want %d", len(b), ReqHeaderSize)
	}
	// The named offsets are the contract with other implementations.
	if b[OffReqKind] != DataWrite ||
		binary.LittleEndian.Uint64(b[OffReqID:]) != r.ID ||
		binary.LittleEndian.Uint64(b[OffReqAddr:]) != r.Addr ||
		binary.LittleEndian.Uint64(b[OffReqLength:]) != r.Length ||
		binary.LittleEndian.Uint64(b[OffReqKey:]) != r.Key {
		t.Fatalf("fields not at their offsets: % x", b)
	}
	got, err := DecodeDataRequest(b)
	if err != nil || got != r {
		t.Fatalf("decode = %+v, %v", got, err)
	}
}

func TestDataRequestErrors(t *testing.T) {
	good := AppendDataRequest(nil, DataRequest{Kind: DataRead, ID: 9, Addr: 1, Length: 1, Key: 1})
	cases := []struct {
		name string
		mod  func(b []byte) []byte
		code errs.Code
	}{
		{"short", func(b []byte) []byte { return b[:ReqHeaderSize-1] }, errs.Protocol},
		{"kind0", func(b []byte) []byte { b[OffReqKind] = 0; return b }, errs.Protocol},
		{"kind completion", func(b []byte) []byte { b[OffReqKind] = DataCompletion; return b }, errs.Protocol},
		{"reserved", func(b []byte) []byte { b[OffReqReserved+3] = 1; return b }, errs.Protocol},
		{"oversize", func(b []byte) []byte {
			binary.LittleEndian.PutUint64(b[OffReqLength:], MaxDataLength+1)
			return b
		}, errs.TooLarge},
		{"huge", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[OffReqLength:], ^uint64(0)); return b }, errs.TooLarge},
	}
	for _, c := range cases {
		b := c.mod(append([]byte(nil), good...))
		r, err := DecodeDataRequest(b)
		if errs.CodeOf(err) != c.code {
			t.Errorf("%s: err %v, want code %v", c.name, err, c.code)
		}
		if c.code == errs.TooLarge && r.ID != 9 {
			t.Errorf("%s: a too-large request must still name its id, got %+v", c.name, r)
		}
	}
	// Zero length and zero key decode: the target answers them with a status.
	z := AppendDataRequest(nil, DataRequest{Kind: DataWrite})
	if _, err := DecodeDataRequest(z); err != nil {
		t.Fatalf("zero request: %v", err)
	}
}

func TestCompletion(t *testing.T) {
	c := Completion{Status: errs.StaleDescriptor, ID: 77}
	b := AppendCompletion(nil, c)
	if len(b) != CompHeaderSize || b[OffCompKind] != DataCompletion ||
		int32(binary.LittleEndian.Uint32(b[OffCompStatus:])) != int32(errs.StaleDescriptor) ||
		binary.LittleEndian.Uint64(b[OffCompID:]) != 77 {
		t.Fatalf("layout: % x", b)
	}
	if got, err := DecodeCompletion(b); err != nil || got != c {
		t.Fatalf("decode = %+v, %v", got, err)
	}
	bad := map[string]func(b []byte){
		"kind":     func(b []byte) { b[OffCompKind] = DataRead },
		"reserved": func(b []byte) { b[OffCompReserved] = 1 },
		"negative": func(b []byte) { binary.LittleEndian.PutUint32(b[OffCompStatus:], 0xffffffff) },
		"err+data": func(b []byte) { binary.LittleEndian.PutUint64(b[OffCompLength:], 1) },
		"oversize": func(b []byte) {
			b[OffCompStatus] = 0
			binary.LittleEndian.PutUint64(b[OffCompLength:], MaxDataLength+1)
		},
		"truncated": nil,
	}
	for name, mod := range bad {
		x := append([]byte(nil), b...)
		if mod == nil {
			x = x[:CompHeaderSize-1]
		} else {
			mod(x)
		}
		if _, err := DecodeCompletion(x); !errors.Is(err, errs.ErrProtocol) {
			t.Errorf("%s: err %v, want a protocol error", name, err)
		}
	}
}

func TestDataPreface(t *testing.T) {
	if err := CheckDataPreface([]byte(DataPreface)); err != nil {
		t.Fatal(err)
	}
	if err := CheckDataPreface([]byte("GET / HT")); !errors.Is(err, errs.ErrProtocol) {
		t.Fatalf("http: %v", err)
	}
	v1 := []byte(DataPreface)
	v1[DataPrefaceSize-1] = 1 // before the authentication exchange
	if err := CheckDataPreface(v1); !errors.Is(err, errs.ErrNotSupported) {
		t.Fatalf("version 1: %v", err)
	}
	if err := CheckDataPreface(nil); err == nil {
		t.Fatal("empty preface accepted")
	}
}

func FuzzDecodeDataRequest(f *testing.F) {
	f.Add(AppendDataRequest(nil, DataRequest{Kind: DataRead, ID: 1, Addr: 4096, Length: 4096, Key: 5}))
	f.Add(AppendDataRequest(nil, DataRequest{Kind: DataWrite, Length: MaxDataLength + 1}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeDataRequest(b)
		if err != nil {
			if errs.CodeOf(err) != errs.Protocol && errs.CodeOf(err) != errs.TooLarge {
				t.Fatalf("unexpected code: %v", err)
			}
			return
		}
		if r.Length > MaxDataLength {
			t.Fatalf("accepted length %d", r.Length)
		}
		// Round trip: a header that decodes encodes back to the same bytes.
		if enc := AppendDataRequest(nil, r); !bytes.Equal(enc, b[:ReqHeaderSize]) {
			t.Fatalf("round trip: % x != % x", enc, b[:ReqHeaderSize])
		}
	})
}

func FuzzDecodeCompletion(f *testing.F) {
	f.Add(AppendCompletion(nil, Completion{ID: 3, Length: 4096}))
	f.Add(AppendCompletion(nil, Completion{Status: errs.AccessDenied, ID: 4}))
	f.Add([]byte{3})
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeCompletion(b)
		if err != nil {
			if errs.CodeOf(err) != errs.Protocol {
				t.Fatalf("unexpected code: %v", err)
			}
			return
		}
		if c.Length > MaxDataLength || (c.Status != errs.OK && c.Length != 0) || c.Status < 0 {
			t.Fatalf("accepted %+v", c)
		}
		if enc := AppendCompletion(nil, c); !bytes.Equal(enc, b[:CompHeaderSize]) {
			t.Fatalf("round trip: % x != % x", enc, b[:CompHeaderSize])
		}
	})
}

func FuzzCheckDataPreface(f *testing.F) {
	f.Add([]byte(DataPreface))
	f.Add([]byte("TEDATA\x00\x02"))
	f.Fuzz(func(t *testing.T, b []byte) {
		err := CheckDataPreface(b)
		if (err == nil) != (len(b) >= DataPrefaceSize && string(b[:DataPrefaceSize]) == DataPreface) {
			t.Fatalf("preface % x: %v", b, err)
		}
	})
}
