package wire

import (
	"bytes"
	"encoding/binary"
	"runtime"
	"testing"

	"github.com/tecache/te/internal/errs"
)

func TestFrameRoundTrip(t *testing.T) {
	for _, body := range [][]byte{nil, {1}, bytes.Repeat([]byte{9}, 70000)} {
		f := AppendFrame(nil, KindNotify, body)
		if len(f) != FrameHeaderSize+len(body) {
			t.Fatalf("frame length %d", len(f))
		}
		k, b, err := ReadFrame(bytes.NewReader(f), 1<<20)
		if err != nil || k != KindNotify || !bytes.Equal(b, body) {
			t.Fatalf("%v %d %d", err, k, len(b))
		}
	}
}

// TestFrameOversizeRefusedBeforeAllocation sends a header claiming 2^63
// bytes: the reader must refuse it without trying to allocate.
func TestFrameOversizeRefusedBeforeAllocation(t *testing.T) {
	var h [FrameHeaderSize]byte
	binary.LittleEndian.PutUint64(h[:], 1<<63)
	h[OffFrameKind] = KindDescribe
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := ReadFrame(bytes.NewReader(h[:]), DefaultMaxFrame)
	runtime.ReadMemStats(&after)
	if errs.CodeOf(err) != errs.TooLarge {
		t.Fatalf("got %v", err)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 64<<10 {
		t.Fatalf("refusing an oversize frame allocated %d bytes", d)
	}
	binary.LittleEndian.PutUint64(h[:], 0)
	if _, _, err := ReadFrame(bytes.NewReader(h[:]), DefaultMaxFrame); errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("zero length: %v", err)
	}
	// Truncated: header promises more than arrives.
	f := AppendFrame(nil, KindProbe, []byte("abcdef"))
	if _, _, err := ReadFrame(bytes.NewReader(f[:len(f)-2]), DefaultMaxFrame); err == nil {
		t.Fatal("truncated frame accepted")
	}
}

// TestMooncakeFraming pins the layout shared with Mooncake's peer-to-peer
// handshake: u64 little-endian length including the type byte, then the type.
func TestMooncakeFraming(t *testing.T) {
	f := AppendFrame(nil, KindMooncakeProbe, []byte("{}"))
	want := []byte{3, 0, 0, 0, 0, 0, 0, 0, 3, '{', '}'}
	if !bytes.Equal(f, want) {
		t.Fatalf("% x", f)
	}
}

func TestCallAndErrors(t *testing.T) {
	b := AppendCall(nil, 42, FlagReplyErr, AppendError(nil, errs.StaleDescriptor, "old key"))
	c, err := DecodeCall(b)
	if err != nil || c.ID != 42 || c.Flags != FlagReplyErr {
		t.Fatal(c, err)
	}
	e := DecodeError(c.Payload)
	if e.Code != errs.StaleDescriptor || e.Msg != "old key" {
		t.Fatal(e)
	}
	if _, err := DecodeCall([]byte{1, 2}); errs.CodeOf(err) != errs.Protocol {
		t.Fatal(err)
	}
	if e := DecodeError([]byte{0, 0, 0, 0}); e.Code != errs.Internal {
		t.Fatal(e)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add(AppendFrame(nil, KindNotify, AppendCall(nil, 1, FlagRequest, AppendNotify(nil, []byte("a"), []byte("b")))))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		k, body, err := ReadFrame(bytes.NewReader(data), 1<<16)
		if err != nil {
			return
		}
		// Re-encoding gives back the bytes consumed.
		again := AppendFrame(nil, k, body)
		if !bytes.Equal(again, data[:len(again)]) {
			t.Fatalf("round trip differs")
		}
	})
}

func FuzzDecodeCall(f *testing.F) {
	f.Add(AppendCall(nil, 7, FlagReplyOK, []byte("payload")))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCall(data)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendCall(nil, c.ID, c.Flags, c.Payload), data) {
			t.Fatal("round trip differs")
		}
		if c.Flags == FlagReplyErr {
			_ = DecodeError(c.Payload).Error()
		}
	})
}

func FuzzDecodeNotify(f *testing.F) {
	f.Add(AppendNotify(nil, []byte("name"), []byte("message")))
	f.Add([]byte{0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, m, err := DecodeNotify(data)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendNotify(nil, n, m), data) {
			t.Fatal("round trip differs")
		}
	})
}

func FuzzDecodeNotifyOnce(f *testing.F) {
	f.Add(AppendNotifyOnce(nil, 1<<63|7, []byte("name"), []byte("message")))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		id, n, m, err := ParseNotifyOnce(data)
		if err != nil {
			return
		}
		if !bytes.Equal(AppendNotifyOnce(nil, id, n, m), data) {
			t.Fatal("round trip differs")
		}
	})
}

// TestReadBodyGrowsAsBytesArrive announces a 16 MiB body and sends 100 KiB:
// the reader must fail having allocated about what arrived, not the claim.
func TestReadBodyGrowsAsBytesArrive(t *testing.T) {
	sent := bytes.Repeat([]byte{7}, 100<<10)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := ReadBody(bytes.NewReader(sent), 16<<20, nil)
	runtime.ReadMemStats(&after)
	if err == nil {
		t.Fatal("a short body was accepted")
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 512<<10 {
		t.Fatalf("reading 100 KiB of a claimed 16 MiB allocated %d bytes", d)
	}
	// A complete body comes back intact, and the chunk hook runs per chunk.
	full := bytes.Repeat([]byte{1, 2, 3}, 100000)
	chunks := 0
	got, err := ReadBody(bytes.NewReader(full), uint64(len(full)), func(int) { chunks++ })
	if err != nil || !bytes.Equal(got, full) {
		t.Fatal(err)
	}
	if want := (len(full) + BodyChunk - 1) / BodyChunk; chunks != want {
		t.Fatalf("%d chunks, want %d", chunks, want)
	}
	if err := DiscardBody(bytes.NewReader(full), uint64(len(full)), nil); err != nil {
		t.Fatal(err)
	}
	if err := DiscardBody(bytes.NewReader(full), uint64(len(full))+1, nil); err == nil {
		t.Fatal("discarding past the end succeeded")
	}
}

func TestFrameLimitsPerKind(t *testing.T) {
	if RequestLimit(KindDescribe) != CallHeaderSize+64<<10 || RequestLimit(KindAuth) != MaxAuthBody {
		t.Fatal("small kinds")
	}
	if RequestLimit(KindNotify) < CallHeaderSize+uint64(len(AppendNotify(nil, make([]byte, MaxNotifyName), make([]byte, MaxNotifyMsg)))) {
		t.Fatal("the largest notify does not fit its limit")
	}
	if RequestLimit(KindNotifyOnce) != CallHeaderSize+uint64(len(AppendNotifyOnce(nil, 1, make([]byte, MaxNotifyName), make([]byte, MaxNotifyMsg)))) {
		t.Fatal("the largest NotifyOnce does not fit its limit exactly")
	}
	if _, _, _, err := ParseNotifyOnce(AppendNotify(nil, []byte("n"), nil)[:7]); errs.CodeOf(err) != errs.Protocol {
		t.Fatalf("a NotifyOnce without its id: %v", err)
	}
	if ReplyLimit(KindDescribe, 1<<20) != CallHeaderSize+1<<20 || ReplyLimit(KindProbe, 1<<30) != CallHeaderSize+64<<10 {
		t.Fatal("reply limits")
	}
}
