package session_test

import (
	"bytes"
	"testing"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/session"
)

// FuzzOpen: whatever a peer sends as a record, Open answers Unauthenticated
// or Protocol and returns nothing, never a panic; and any plaintext sealed
// and opened comes back unchanged, in both modes.
func FuzzOpen(f *testing.F) {
	f.Add([]byte{}, byte(0))
	f.Add(bytes.Repeat([]byte{0xa5}, 40+session.TagSize), byte(1))
	f.Add(make([]byte, session.TagSize), byte(2))
	f.Fuzz(func(t *testing.T, data []byte, m byte) {
		mode := modes[int(m)%len(modes)]
		ini, srv := pairOf(t, params(mode, "fuzz"))
		if p, err := srv.Recv.Open(append([]byte(nil), data...)); err == nil || p != nil {
			t.Fatalf("forged record of %d bytes opened", len(data))
		} else if c := errs.CodeOf(err); c != errs.Unauthenticated && c != errs.Protocol {
			t.Fatalf("code %v", c)
		}
		if len(data) > session.RecordSize {
			return
		}
		_, srv = pairOf(t, params(mode, "fuzz"))
		rec := seal(t, ini.Send, data)
		if len(data) == 0 {
			if len(rec) != 0 {
				t.Fatal("an empty plaintext made a record")
			}
			return
		}
		got, err := srv.Recv.Open(rec)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round trip: %v", err)
		}
	})
}

// FuzzReadBody: a body sealed as records reads back whole whatever its
// size; a byte changed anywhere in it (fuzzer's choice) fails the read,
// and a body claimed longer than what was sent is an error, not a short
// success.
func FuzzReadBody(f *testing.F) {
	f.Add(uint32(0), uint32(0), byte(1), byte(0))
	f.Add(uint32(session.RecordSize+3), uint32(session.RecordSize), byte(0x80), byte(1))
	f.Fuzz(func(t *testing.T, n, at uint32, flip, m byte) {
		n %= 3*session.RecordSize + 1
		mode := modes[int(m)%len(modes)]
		body := pattern(int(n), byte(at))
		ini, srv := pairOf(t, params(mode, "fuzz body"))
		var w bytes.Buffer
		if err := ini.Send.WriteBody(&w, body, nil); err != nil {
			t.Fatal(err)
		}
		wire := w.Bytes()
		if uint64(len(wire)) != session.SealedSize(uint64(n)) {
			t.Fatalf("%d bytes for %d", len(wire), n)
		}
		got, err := srv.Recv.ReadBody(bytes.NewReader(wire), uint64(n), nil)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("round trip of %d: %v", n, err)
		}
		if n == 0 {
			return
		}
		_, srv = pairOf(t, params(mode, "fuzz body"))
		if _, err := srv.Recv.ReadBody(bytes.NewReader(wire), uint64(n)+1, nil); err == nil {
			t.Fatal("read more than was sent")
		}
		if flip == 0 {
			return
		}
		_, srv = pairOf(t, params(mode, "fuzz body"))
		wire[int(at)%len(wire)] ^= flip
		if _, err := srv.Recv.ReadBody(bytes.NewReader(wire), uint64(n), nil); errs.CodeOf(err) != errs.Unauthenticated {
			t.Fatalf("changed byte %d: %v", int(at)%len(wire), err)
		}
	})
}

// pieces cuts n bytes into pieces whose sizes come from cuts (each byte
// times 1031 plus one, so pieces straddle record boundaries), the last
// piece taking the rest.
func pieces(n int, cuts []byte) []int {
	var out []int
	for _, c := range cuts {
		if n == 0 {
			break
		}
		k := min(n, int(c)*1031+1)
		out = append(out, k)
		n -= k
	}
	if n > 0 {
		out = append(out, n)
	}
	return out
}

// FuzzPieces: a payload written and read in pieces of any sizes (a device
// payload staged through host chunks) makes exactly the bytes on the wire
// that WritePayload makes for the whole, and reads back whole; writing or
// reading past its end is refused.
func FuzzPieces(f *testing.F) {
	f.Add(uint32(3*session.RecordSize+17), []byte{63, 1, 200}, []byte{7, 255}, byte(1))
	f.Add(uint32(4096), []byte{0}, []byte{}, byte(0))
	f.Fuzz(func(t *testing.T, n uint32, wcuts, rcuts []byte, m byte) {
		n %= 4*session.RecordSize + 1
		mode := modes[int(m)%len(modes)]
		payload := pattern(int(n), byte(len(wcuts)))
		whole, _ := pairOf(t, params(mode, "pieces"))
		var want bytes.Buffer
		if err := whole.Send.WritePayload(&want, payload, nil); err != nil {
			t.Fatal(err)
		}
		ini, srv := pairOf(t, params(mode, "pieces"))
		var got bytes.Buffer
		ini.Send.StartPayload(uint64(n))
		off := 0
		for _, k := range pieces(int(n), wcuts) {
			if err := ini.Send.WritePiece(&got, payload[off:off+k], nil); err != nil {
				t.Fatal(err)
			}
			off += k
		}
		if !bytes.Equal(got.Bytes(), want.Bytes()) {
			t.Fatalf("%v: %d bytes in pieces differ from the whole payload's %d", mode, got.Len(), want.Len())
		}
		if err := ini.Send.WritePiece(&got, []byte{1}, nil); errs.CodeOf(err) != errs.InvalidArgument {
			t.Fatalf("wrote past the payload: %v", err)
		}
		dst := make([]byte, n)
		srv.Recv.StartPayload(uint64(n))
		off = 0
		r := bytes.NewReader(want.Bytes())
		for _, k := range pieces(int(n), rcuts) {
			if err := srv.Recv.ReadPiece(r, dst[off:off+k], nil); err != nil {
				t.Fatal(err)
			}
			off += k
		}
		if !bytes.Equal(dst, payload) || r.Len() != 0 {
			t.Fatalf("%v: read back differs (%d bytes left)", mode, r.Len())
		}
		if err := srv.Recv.ReadPiece(r, make([]byte, 1), nil); errs.CodeOf(err) != errs.InvalidArgument {
			t.Fatalf("read past the payload: %v", err)
		}
	})
}
