package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/tecache/te/internal/errs"
)

// TestMooncakeHeaderLayout pins Mooncake's SessionHeader: u64 size, u64 addr,
// u8 opcode with 0x80 for version 2, 7 bytes of padding.
func TestMooncakeHeaderLayout(t *testing.T) {
	var b [MooncakeHeaderSize]byte
	PutMooncakeRequest(b[:], MooncakeRequest{Size: 0x10000, Addr: 0x7f0000001000, Op: MooncakeWrite, V2: true})
	want := []byte{0, 0, 1, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0x7f, 0, 0, 0x81, 0, 0, 0, 0, 0, 0, 0}
	if !bytes.Equal(b[:], want) {
		t.Fatalf("% x", b)
	}
	// Padding is not initialised by Mooncake: it must not matter.
	for i := OffMcOpcode + 1; i < MooncakeHeaderSize; i++ {
		b[i] = 0xEE
	}
	r, err := DecodeMooncakeRequest(b[:])
	if err != nil || r != (MooncakeRequest{Size: 0x10000, Addr: 0x7f0000001000, Op: MooncakeWrite, V2: true}) {
		t.Fatalf("%+v %v", r, err)
	}
	b[OffMcOpcode] = 0 // a version 1 READ
	if r, err := DecodeMooncakeRequest(b[:]); err != nil || r.V2 || r.Op != MooncakeRead {
		t.Fatalf("%+v %v", r, err)
	}
	for _, op := range []byte{2, 0x82, 0x7f, 0xff} {
		b[OffMcOpcode] = op
		if _, err := DecodeMooncakeRequest(b[:]); errs.CodeOf(err) != errs.Protocol {
			t.Fatalf("opcode %#x: %v", op, err)
		}
	}
	if _, err := DecodeMooncakeRequest(b[:20]); errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("short header: %v", err)
	}
}

// TestMooncakeStatus pins the status frame: "MCTV" << 32 | code, and refuses
// a frame without the magic (a version 1 peer's payload).
func TestMooncakeStatus(t *testing.T) {
	var b [8]byte
	PutMooncakeStatus(b[:], MooncakeAddrRejected)
	if v := binary.LittleEndian.Uint64(b[:]); v != 0x4D43545600000001 {
		t.Fatalf("%#x", v)
	}
	if c, err := DecodeMooncakeStatus(b[:]); err != nil || c != MooncakeAddrRejected {
		t.Fatal(c, err)
	}
	if _, err := DecodeMooncakeStatus([]byte{0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab}); errs.CodeOf(err) != errs.Protocol {
		t.Fatal(err)
	}
	if _, err := DecodeMooncakeStatus(b[:4]); errs.CodeOf(err) != errs.Protocol {
		t.Fatal(err)
	}
}

// TestLooksLikeMooncake: te's preface is never taken for a Mooncake header,
// any header of a size below 2^48 is.
func TestLooksLikeMooncake(t *testing.T) {
	if LooksLikeMooncake([]byte(DataPreface)) {
		t.Fatal("te's preface taken for Mooncake")
	}
	var b [MooncakeHeaderSize]byte
	for _, n := range []uint64{0, 1, 4096, 1 << 30, 1<<48 - 1} {
		PutMooncakeRequest(b[:], MooncakeRequest{Size: n, Op: MooncakeWrite, V2: true})
		if !LooksLikeMooncake(b[:8]) {
			t.Fatalf("size %d not taken for Mooncake", n)
		}
	}
	if LooksLikeMooncake(b[:7]) {
		t.Fatal("short prefix")
	}
}

func TestMooncakeNotify(t *testing.T) {
	n, err := DecodeMooncakeNotify([]byte(`{"name":"mc","notify_msg":"hello"}`))
	if err != nil || n != (MooncakeNotify{"mc", "hello"}) {
		t.Fatal(n, err)
	}
	if n, err := DecodeMooncakeNotify([]byte(`{}`)); err != nil || n != (MooncakeNotify{}) {
		t.Fatal(n, err)
	}
	if _, err := DecodeMooncakeNotify([]byte(`{"name":`)); errs.CodeOf(err) != errs.Protocol {
		t.Fatal(err)
	}
	long, _ := json.Marshal(MooncakeNotify{Name: strings.Repeat("n", MaxNotifyName+1)})
	if _, err := DecodeMooncakeNotify(long); errs.CodeOf(err) != errs.TooLarge {
		t.Fatal(err)
	}
	var reply MooncakeNotify
	if err := json.Unmarshal(MooncakeNotifyReply, &reply); err != nil || reply.Msg != "success" || reply.Name != "" {
		t.Fatal(reply, err)
	}
}

// TestMooncakeFrameLimit: Mooncake's 1 MiB handshake limit counts the kind
// byte; a longer frame, or a te kind, is refused before its body is read.
func TestMooncakeFrameLimit(t *testing.T) {
	ok := AppendFrame(nil, KindMooncakeMetadata, bytes.Repeat([]byte{' '}, MooncakeMaxHandshake-1))
	if k, b, err := ReadMooncakeFrame(bytes.NewReader(ok), MooncakeMaxHandshake); err != nil || k != 1 || len(b) != MooncakeMaxHandshake-1 {
		t.Fatal(k, len(b), err)
	}
	var h [FrameHeaderSize]byte
	binary.LittleEndian.PutUint64(h[:], MooncakeMaxHandshake+1)
	h[OffFrameKind] = KindMooncakeMetadata
	if _, _, err := ReadMooncakeFrame(bytes.NewReader(h[:]), MooncakeMaxHandshake); errs.CodeOf(err) != errs.TooLarge {
		t.Fatal(err)
	}
	te := AppendFrame(nil, KindDescribe, nil)
	if _, _, err := ReadMooncakeFrame(bytes.NewReader(te), MooncakeMaxHandshake); errs.CodeOf(err) != errs.Protocol {
		t.Fatal(err)
	}
}

func FuzzDecodeMooncakeRequest(f *testing.F) {
	var b [MooncakeHeaderSize]byte
	PutMooncakeRequest(b[:], MooncakeRequest{Size: 4096, Addr: 1 << 40, Op: MooncakeRead, V2: true})
	f.Add(b[:])
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := DecodeMooncakeRequest(in)
		if err != nil {
			return
		}
		var out [MooncakeHeaderSize]byte
		PutMooncakeRequest(out[:], r)
		r2, err := DecodeMooncakeRequest(out[:])
		if err != nil || r2 != r || !bytes.Equal(out[:OffMcOpcode+1], in[:OffMcOpcode+1]) {
			t.Fatalf("round trip: %+v -> %+v (%v)", r, r2, err)
		}
	})
}

func FuzzDecodeMooncakeStatus(f *testing.F) {
	var b [8]byte
	PutMooncakeStatus(b[:], 0)
	f.Add(b[:])
	f.Add([]byte("MCTV\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := DecodeMooncakeStatus(in)
		if err != nil {
			return
		}
		var out [8]byte
		PutMooncakeStatus(out[:], c)
		if !bytes.Equal(out[:], in[:8]) {
			t.Fatalf("round trip: % x -> % x", in[:8], out)
		}
	})
}

func FuzzDecodeMooncakeNotify(f *testing.F) {
	f.Add([]byte(`{"name":"a","notify_msg":"b"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, in []byte) {
		n, err := DecodeMooncakeNotify(in)
		if err != nil {
			return
		}
		b, err := json.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		n2, err := DecodeMooncakeNotify(b)
		if err != nil || n2 != n {
			t.Fatalf("round trip: %+v -> %+v (%v)", n, n2, err)
		}
	})
}

func FuzzReadMooncakeFrame(f *testing.F) {
	f.Add(AppendFrame(nil, KindMooncakeProbe, []byte("{}")))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, in []byte) {
		k, body, err := ReadMooncakeFrame(bytes.NewReader(in), 1<<12)
		if err != nil {
			return
		}
		if !IsMooncakeKind(k) || len(body)+1 > 1<<12 {
			t.Fatalf("kind %d, %d bytes accepted", k, len(body))
		}
		out := AppendFrame(nil, k, body)
		if !bytes.Equal(out, in[:len(out)]) {
			t.Fatal("round trip")
		}
	})
}

func ExampleDecodeMooncakeRequest() {
	var h [MooncakeHeaderSize]byte
	PutMooncakeRequest(h[:], MooncakeRequest{Size: 4096, Addr: 0x7f0000001000, Op: MooncakeWrite, V2: true})
	r, err := DecodeMooncakeRequest(h[:])
	fmt.Println(r.Size, r.Op == MooncakeWrite, r.V2, err, LooksLikeMooncake(h[:8]), LooksLikeMooncake([]byte(DataPreface)))
	var st [MooncakeStatusSize]byte
	PutMooncakeStatus(st[:], MooncakeAddrRejected)
	code, err := DecodeMooncakeStatus(st[:])
	fmt.Printf("%#x %d %v\n", binary.LittleEndian.Uint64(st[:]), code, err)
	// Output:
	// 4096 true true <nil> true false
	// 0x4d43545600000001 1 <nil>
}
