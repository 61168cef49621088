package session_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/tecache/te/internal/errs"
	"github.com/tecache/te/internal/session"
	"github.com/tecache/te/internal/wire"
)

func TestMain(m *testing.M) {
	// Large payloads' records spread over workers here whatever the cores,
	// so the tests and the race detector cover that path.
	session.SpreadOnAnyMachine()
	goleak.VerifyTestMain(m)
}

var modes = []session.Mode{session.Headers, session.Integrity, session.Encryption}

func params(mode session.Mode, transcript string) session.Params {
	return session.Params{
		Secret:     []byte("correct horse battery staple 1"),
		KeyID:      [session.KeyIDSize]byte{1, 2, 3, 4, 5, 6, 7, 8},
		Transcript: []byte(transcript),
		Channel:    session.Data,
		Mode:       mode,
	}
}

// pairOf returns both ends of one session: what the initiator seals the
// server opens, and the reverse.
func pairOf(t testing.TB, p session.Params) (ini, srv *session.Session) {
	t.Helper()
	ini, err := session.New(p, session.Initiator)
	if err != nil {
		t.Fatal(err)
	}
	srv, err = session.New(p, session.Server)
	if err != nil {
		t.Fatal(err)
	}
	return ini, srv
}

func seal(t testing.TB, s *session.Sealer, p []byte) []byte {
	t.Helper()
	b, err := s.Seal(nil, p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func pattern(n int, salt byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ salt | 0x80 // never zero: tampering shows
	}
	return b
}

func wantCode(t *testing.T, what string, err error, code errs.Code) {
	t.Helper()
	if errs.CodeOf(err) != code {
		t.Fatalf("%s: got %v, want %v", what, err, code)
	}
}

// TestRoundTrip: headers, bodies and payloads of every size class cross in
// both directions and come out as they went in; Encryption hides them on
// the wire, Headers and Integrity leave them readable with a tag per
// record (Headers: none on payloads).
func TestRoundTrip(t *testing.T) {
	sizes := []int{0, 1, 40, session.RecordSize - 1, session.RecordSize, session.RecordSize + 1, 3*session.RecordSize + 5}
	for _, mode := range modes {
		t.Run(mode.String(), func(t *testing.T) {
			ini, srv := pairOf(t, params(mode, "transcript"))
			for _, dir := range []struct {
				name string
				s    *session.Sealer
				o    *session.Opener
			}{{"i2s", ini.Send, srv.Recv}, {"s2i", srv.Send, ini.Recv}} {
				for _, n := range sizes {
					hdr := pattern(40, 1)
					body := pattern(n, 2)
					payload := pattern(n, 3)
					var wire bytes.Buffer
					h := seal(t, dir.s, hdr)
					if uint64(len(h)) != dir.s.Size(40) || len(h) != 40+session.TagSize {
						t.Fatalf("header record of %d bytes", len(h))
					}
					wire.Write(h)
					if err := dir.s.WriteBody(&wire, body, nil); err != nil {
						t.Fatal(err)
					}
					if err := dir.s.WritePayload(&wire, payload, nil); err != nil {
						t.Fatal(err)
					}
					want := dir.s.Size(40) + dir.s.Size(uint64(n)) + dir.s.PayloadSize(uint64(n))
					if uint64(wire.Len()) != want {
						t.Fatalf("%s %d: %d bytes on the wire, sizes say %d", dir.name, n, wire.Len(), want)
					}
					raw := wire.Bytes()
					if got := bytes.Contains(raw, hdr); got != (mode != session.Encryption) {
						t.Fatalf("%s %d: header in clear on the wire: %v", dir.name, n, got)
					}
					if n >= 40 && bytes.Contains(raw, payload[:40]) != (mode != session.Encryption) {
						t.Fatalf("%s %d: payload in clear on the wire in %v", dir.name, n, mode)
					}
					buf := make([]byte, 40+session.TagSize)
					gh, err := dir.o.ReadRecord(&wire, buf, 40)
					if err != nil || !bytes.Equal(gh, hdr) {
						t.Fatalf("%s %d: header %v", dir.name, n, err)
					}
					gb, err := dir.o.ReadBody(&wire, uint64(n), nil)
					if err != nil || !bytes.Equal(gb, body) {
						t.Fatalf("%s %d: body %v", dir.name, n, err)
					}
					gp := make([]byte, n)
					if err := dir.o.ReadPayload(&wire, gp, nil); err != nil || !bytes.Equal(gp, payload) {
						t.Fatalf("%s %d: payload %v", dir.name, n, err)
					}
					if wire.Len() != 0 {
						t.Fatalf("%s %d: %d bytes left", dir.name, n, wire.Len())
					}
				}
			}
		})
	}
}

// TestDiscardKeepsSequence: a body or payload read and dropped (a refused
// call, a canceled READ) still counts, so the next frame opens.
func TestDiscardKeepsSequence(t *testing.T) {
	for _, mode := range modes {
		ini, srv := pairOf(t, params(mode, "t"))
		var wire bytes.Buffer
		n := (session.ReadRecords+1)*session.RecordSize + 7
		ini.Send.WriteBody(&wire, pattern(n, 1), nil)
		ini.Send.WritePayload(&wire, pattern(n, 2), nil)
		wire.Write(seal(t, ini.Send, []byte("next header")))
		var chunks []int
		if err := srv.Recv.DiscardBody(&wire, uint64(n), func(size int) { chunks = append(chunks, size) }); err != nil {
			t.Fatal(err)
		}
		// A body: each record's wire size (the progress bound is per record).
		if len(chunks) != session.ReadRecords+2 || chunks[0] != session.RecordSize+session.TagSize || chunks[len(chunks)-1] != 7+session.TagSize {
			t.Fatalf("%v: body chunks %v", mode, chunks)
		}
		chunks = nil
		if err := srv.Recv.DiscardPayload(&wire, uint64(n), func(size int) { chunks = append(chunks, size) }); err != nil {
			t.Fatal(err)
		}
		// A payload in records: read ReadRecords records at a time.
		if mode.SealsPayload() && (len(chunks) != 2 || chunks[0] != int(session.SealedSize(session.ReadRecords*session.RecordSize)) ||
			chunks[1] != int(session.SealedSize(session.RecordSize+7))) {
			t.Fatalf("%v: payload chunks %v", mode, chunks)
		}
		h, err := srv.Recv.ReadRecord(&wire, make([]byte, 64), len("next header"))
		if err != nil || string(h) != "next header" {
			t.Fatalf("%v: %q %v", mode, h, err)
		}
	}
}

// TestBitFlips: any single bit flipped anywhere in a record (plaintext,
// ciphertext or tag) makes it fail, and the opener stays failed: the record
// after it, intact, fails too.
func TestBitFlips(t *testing.T) {
	for _, mode := range modes {
		hdr := pattern(40, 9)
		for i := 0; i < (40+session.TagSize)*8; i++ {
			ini, srv := pairOf(t, params(mode, "flip"))
			rec := seal(t, ini.Send, hdr)
			next := seal(t, ini.Send, hdr)
			rec[i/8] ^= 1 << (i % 8)
			if _, err := srv.Recv.Open(rec); errs.CodeOf(err) != errs.Unauthenticated {
				t.Fatalf("%v: bit %d flipped: %v", mode, i, err)
			}
			if _, err := srv.Recv.Open(next); errs.CodeOf(err) != errs.Unauthenticated || srv.Recv.Err() == nil {
				t.Fatalf("%v: the opener took a record after a failure: %v", mode, err)
			}
		}
	}
}

// TestDropDuplicateReorder: the implicit sequence number makes a lost,
// repeated or reordered record fail.
func TestDropDuplicateReorder(t *testing.T) {
	for _, mode := range modes {
		cases := map[string]func(recs [][]byte) [][]byte{
			"drop":      func(r [][]byte) [][]byte { return [][]byte{r[0], r[2]} },
			"duplicate": func(r [][]byte) [][]byte { return [][]byte{r[0], r[0]} },
			"reorder":   func(r [][]byte) [][]byte { return [][]byte{r[1], r[0]} },
			"replay":    func(r [][]byte) [][]byte { return [][]byte{r[0], r[1], r[2], r[1]} },
		}
		for name, edit := range cases {
			ini, srv := pairOf(t, params(mode, "seq"))
			var recs [][]byte
			for i := range 3 {
				recs = append(recs, seal(t, ini.Send, []byte(fmt.Sprintf("frame %d", i))))
			}
			got := edit(recs)
			var err error
			for _, r := range got {
				if _, err = srv.Recv.Open(append([]byte(nil), r...)); err != nil {
					break
				}
			}
			wantCode(t, mode.String()+" "+name, err, errs.Unauthenticated)
		}
	}
}

// TestTruncation: a record cut short fails (Protocol below a tag's size),
// and a stream that ends inside a body, payload or header is an error, not
// a short success; where payloads are records nothing of the cut record
// reaches the destination.
func TestTruncation(t *testing.T) {
	for _, mode := range modes {
		ini, srv := pairOf(t, params(mode, "trunc"))
		rec := seal(t, ini.Send, pattern(40, 1))
		if _, err := srv.Recv.Open(rec[:len(rec)-1]); errs.CodeOf(err) != errs.Unauthenticated {
			t.Fatalf("%v: short record: %v", mode, err)
		}
		_, srv = pairOf(t, params(mode, "trunc"))
		if _, err := srv.Recv.Open(make([]byte, session.TagSize-1)); errs.CodeOf(err) != errs.Protocol {
			t.Fatalf("%v: record shorter than a tag: %v", mode, err)
		}
		_, srv = pairOf(t, params(mode, "trunc"))
		if _, err := srv.Recv.Open(make([]byte, session.RecordSize+session.TagSize+1)); errs.CodeOf(err) != errs.Protocol {
			t.Fatalf("%v: record longer than the bound: %v", mode, err)
		}

		n := 2*session.RecordSize + 100
		for _, cut := range []int{1, session.TagSize, session.RecordSize + session.TagSize + 1} {
			ini, srv = pairOf(t, params(mode, "trunc"))
			var wire bytes.Buffer
			ini.Send.WritePayload(&wire, pattern(n, 4), nil)
			b := wire.Bytes()[:wire.Len()-cut]
			dst := make([]byte, n)
			err := srv.Recv.ReadPayload(bytes.NewReader(b), dst, nil)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%v cut %d: %v", mode, cut, err)
			}
			if mode.SealsPayload() && bytes.ContainsFunc(dst[2*session.RecordSize:], func(r rune) bool { return r != 0 }) {
				t.Fatalf("cut %d: bytes of an unchecked record reached the destination", cut)
			}
			ini, srv = pairOf(t, params(mode, "trunc"))
			wire.Reset()
			ini.Send.WriteBody(&wire, pattern(n, 4), nil)
			if _, err := srv.Recv.ReadBody(bytes.NewReader(wire.Bytes()[:wire.Len()-cut]), uint64(n), nil); !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("%v body cut %d: %v", mode, cut, err)
			}
		}
	}
}

// TestTamperedPayloadNeverLands: in Integrity and Encryption modes a
// payload record altered on the path fails, and the destination keeps what
// it held for that record: no unauthenticated byte is written to it. In
// Headers mode (the opt-out) the altered byte arrives.
func TestTamperedPayloadNeverLands(t *testing.T) {
	for _, mode := range []session.Mode{session.Integrity, session.Encryption} {
		t.Run(mode.String(), func(t *testing.T) { tamperedPayload(t, mode) })
	}
	ini, srv := pairOf(t, params(session.Headers, "land"))
	var wire bytes.Buffer
	ini.Send.WritePayload(&wire, pattern(1000, 5), nil)
	wire.Bytes()[10] ^= 4
	dst := make([]byte, 1000)
	if err := srv.Recv.ReadPayload(&wire, dst, nil); err != nil || dst[10] == pattern(1000, 5)[10] {
		t.Fatalf("headers only: %v; the altered byte should have arrived unnoticed", err)
	}
}

func tamperedPayload(t *testing.T, mode session.Mode) {
	ini, srv := pairOf(t, params(mode, "land"))
	var wire bytes.Buffer
	n := 3 * session.RecordSize
	ini.Send.WritePayload(&wire, pattern(n, 5), nil)
	b := wire.Bytes()
	b[session.RecordSize+session.TagSize+10] ^= 4 // second record
	dst := make([]byte, n)
	err := srv.Recv.ReadPayload(bytes.NewReader(b), dst, nil)
	wantCode(t, "tampered payload", err, errs.Unauthenticated)
	if !bytes.Equal(dst[:session.RecordSize], pattern(n, 5)[:session.RecordSize]) {
		t.Fatal("the first, intact record did not land")
	}
	if bytes.ContainsFunc(dst[session.RecordSize:], func(r rune) bool { return r != 0 }) {
		t.Fatal("bytes of the tampered record reached the destination")
	}
	// The same read in pieces (a device payload's staging chunks).
	_, srv = pairOf(t, params(mode, "land"))
	clear(dst)
	srv.Recv.StartPayload(uint64(n))
	rd := bytes.NewReader(b)
	err = nil
	for off := 0; off < n && err == nil; off += 4096 {
		err = srv.Recv.ReadPiece(rd, dst[off:off+4096], nil)
	}
	wantCode(t, "tampered payload read in pieces", err, errs.Unauthenticated)
	if !bytes.Equal(dst[:session.RecordSize], pattern(n, 5)[:session.RecordSize]) ||
		bytes.ContainsFunc(dst[session.RecordSize:], func(r rune) bool { return r != 0 }) {
		t.Fatal("read in pieces: the tampered record reached the destination, or the intact one did not")
	}
}

// TestNoCrossing: a record is bound to its direction, its connection (the
// transcript), its channel and its mode: moved anywhere else it fails.
func TestNoCrossing(t *testing.T) {
	for _, mode := range modes {
		ini, srv := pairOf(t, params(mode, "connection A"))
		msg := []byte("READ 0x7f0000001000 64 key")
		// Reflected back to its sender (the other direction).
		if _, err := ini.Recv.Open(seal(t, ini.Send, msg)); errs.CodeOf(err) != errs.Unauthenticated {
			t.Fatalf("%v: reflected to the initiator: %v", mode, err)
		}
		if _, err := srv.Recv.Open(seal(t, srv.Send, msg)); errs.CodeOf(err) != errs.Unauthenticated {
			t.Fatalf("%v: reflected to the server: %v", mode, err)
		}
		others := map[string]session.Params{}
		p := params(mode, "connection B")
		others["another connection"] = p
		p = params(mode, "connection A")
		p.Channel = session.Control
		others["another channel"] = p
		p = params(mode, "connection A")
		p.Mode = map[session.Mode]session.Mode{session.Headers: session.Integrity, session.Integrity: session.Encryption, session.Encryption: session.Headers}[mode]
		others["another mode"] = p
		p = params(mode, "connection A")
		p.Secret = []byte("another cluster's secret value")
		others["another secret"] = p
		p = params(mode, "connection A")
		p.KeyID[0]++
		others["another key id"] = p
		for what, op := range others {
			a, _ := pairOf(t, params(mode, "connection A"))
			_, b := pairOf(t, op)
			if _, err := b.Recv.Open(seal(t, a.Send, msg)); errs.CodeOf(err) != errs.Unauthenticated {
				t.Fatalf("%v: %s took the record: %v", mode, what, err)
			}
		}
	}
}

// TestNilPassesThrough: without a session the same calls move bytes
// unchanged.
func TestNilPassesThrough(t *testing.T) {
	s, o := (*session.Session)(nil).Split()
	if s.Mode() != 0 || o.Size(100) != 100 || s.PayloadSize(100) != 100 || o.Err() != nil {
		t.Fatal("nil sizes")
	}
	var wire bytes.Buffer
	h, _ := s.Seal(nil, []byte("hdr"))
	wire.Write(h)
	s.WriteBody(&wire, []byte("body"), nil)
	s.WritePayload(&wire, []byte("payload"), nil)
	if wire.String() != "hdrbodypayload" {
		t.Fatalf("%q", wire.String())
	}
	if g, err := o.ReadRecord(&wire, make([]byte, 3), 3); err != nil || string(g) != "hdr" {
		t.Fatal(g, err)
	}
	if g, err := o.ReadBody(&wire, 4, nil); err != nil || string(g) != "body" {
		t.Fatal(g, err)
	}
	p := make([]byte, 7)
	if err := o.ReadPayload(&wire, p, nil); err != nil || string(p) != "payload" {
		t.Fatal(p, err)
	}
	if g, err := o.Open([]byte("x")); err != nil || string(g) != "x" {
		t.Fatal(g, err)
	}
}

func TestNewRefusesBadParams(t *testing.T) {
	good := params(session.Integrity, "t")
	bad := map[string]func(p *session.Params){
		"no secret":     func(p *session.Params) { p.Secret = nil },
		"no transcript": func(p *session.Params) { p.Transcript = nil },
		"channel":       func(p *session.Params) { p.Channel = "rdma" },
		"mode":          func(p *session.Params) { p.Mode = 0 },
	}
	for what, f := range bad {
		p := good
		f(&p)
		if _, err := session.New(p, session.Initiator); errs.CodeOf(err) != errs.InvalidArgument {
			t.Errorf("%s: %v", what, err)
		}
	}
	if _, err := session.New(good, 3); errs.CodeOf(err) != errs.InvalidArgument {
		t.Errorf("role: %v", err)
	}
}

// TestReadRecordBounds: a caller's wrong size is its error, not the peer's.
func TestReadRecordBounds(t *testing.T) {
	_, srv := pairOf(t, params(session.Integrity, "t"))
	if _, err := srv.Recv.ReadRecord(bytes.NewReader(nil), make([]byte, 10), 10); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatal(err)
	}
	if srv.Recv.Err() != nil {
		t.Fatal("a caller's mistake broke the opener")
	}
	var none *session.Opener
	if _, err := none.ReadRecord(bytes.NewReader(nil), make([]byte, 4), 10); errs.CodeOf(err) != errs.InvalidArgument {
		t.Fatal(err)
	}
}

// TestZeroAllocs: steady-state sealing and opening of headers, bodies and
// payloads allocates nothing, except the few goroutine starts of a payload
// spread over cores (two records or more at once), however large it is.
func TestZeroAllocs(t *testing.T) {
	for _, mode := range modes {
		allocs(t, mode, session.RecordSize+3, 0)
		allocs(t, mode, 2*session.RecordSize+3, 12)
		allocs(t, mode, 16*session.RecordSize, 12)
	}
}

func allocs(t *testing.T, mode session.Mode, n int, most float64) {
	{
		ini, srv := pairOf(t, params(mode, "allocs"))
		hdr := pattern(40, 1)
		payload := pattern(n, 2)
		dst := make([]byte, len(payload))
		buf := make([]byte, 0, 128)
		var wire bytes.Buffer
		wire.Grow(4 * len(payload))
		rd := bytes.NewReader(nil)
		round := func() {
			wire.Reset()
			b, err := ini.Send.Seal(buf[:0], hdr)
			if err != nil {
				t.Fatal(err)
			}
			wire.Write(b)
			if err := ini.Send.WritePayload(&wire, payload, nil); err != nil {
				t.Fatal(err)
			}
			rd.Reset(wire.Bytes())
			if _, err := srv.Recv.ReadRecord(rd, buf[:cap(buf)], len(hdr)); err != nil {
				t.Fatal(err)
			}
			if err := srv.Recv.ReadPayload(rd, dst, nil); err != nil {
				t.Fatal(err)
			}
			// And in pieces.
			wire.Reset()
			ini.Send.StartPayload(uint64(len(payload)))
			srv.Recv.StartPayload(uint64(len(payload)))
			for off := 0; off < len(payload); off += 5000 {
				if err := ini.Send.WritePiece(&wire, payload[off:min(len(payload), off+5000)], nil); err != nil {
					t.Fatal(err)
				}
			}
			rd.Reset(wire.Bytes())
			for off := 0; off < len(dst); off += 7000 {
				if err := srv.Recv.ReadPiece(rd, dst[off:min(len(dst), off+7000)], nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		round() // scratch buffers
		if a := testing.AllocsPerRun(50, round); a > most {
			t.Fatalf("%v, %d bytes: %.1f allocations per frame", mode, n, a)
		}
	}
}

// TestModesMatchWire: the modes are the exchange's mode bytes.
func TestModesMatchWire(t *testing.T) {
	if session.Headers != session.Mode(wire.SessionHeaders) || session.Integrity != session.Mode(wire.SessionIntegrity) ||
		session.Encryption != session.Mode(wire.SessionEncryption) ||
		session.KeyIDSize != wire.AuthKeyIDSize || session.RecordSize != wire.BodyChunk {
		t.Fatal("session constants drifted from the wire's")
	}
}

// TestCPUFeatures: the features are read from the CPU, and the hardware
// AES answer agrees with them.
func TestCPUFeatures(t *testing.T) {
	f := session.CPUFeatures()
	if f == "" {
		t.Fatal("no answer")
	}
	hw := (strings.Contains(f, "AESNI") && strings.Contains(f, "CLMUL")) || (strings.Contains(f, "AESARM") && strings.Contains(f, "PMULL"))
	if session.HardwareAES() != hw {
		t.Fatalf("HardwareAES %v with features %s", session.HardwareAES(), f)
	}
	t.Logf("crypto features: %s", f)
}

// TestTags: a payload sent as its records from where they lie, each
// followed by its tag from Tags (given a record at a time, or many at once,
// computed on several cores), is byte for byte what WritePayload sends, and
// reads back with ReadPayload; a record moved, a byte flipped or a tag taken
// out of turn fails. Other modes have no such tags.
func TestTags(t *testing.T) {
	n := 9*session.RecordSize + 123
	p := pattern(n, 9)
	ini, _ := pairOf(t, params(session.Integrity, "tag"))
	var want bytes.Buffer
	if err := ini.Send.WritePayload(&want, p, nil); err != nil {
		t.Fatal(err)
	}
	// tagged sends p in runs of per records.
	tagged := func(per int) []byte {
		ini, _ := pairOf(t, params(session.Integrity, "tag"))
		var b []byte
		for rest := p; len(rest) > 0; {
			k := min(len(rest), per*session.RecordSize)
			tags, err := ini.Send.Tags(nil, rest[:k])
			if err != nil || len(tags) != int(session.Records(uint64(k)))*session.TagSize {
				t.Fatalf("tags %d: %v", len(tags), err)
			}
			for run := rest[:k]; len(run) > 0; {
				r := min(len(run), session.RecordSize)
				b = append(append(b, run[:r]...), tags[:session.TagSize]...)
				run, tags = run[r:], tags[session.TagSize:]
			}
			rest = rest[k:]
		}
		return b
	}
	for _, per := range []int{1, 3, 16} {
		got := tagged(per)
		if !bytes.Equal(got, want.Bytes()) {
			t.Fatalf("records sent with Tags (%d at a time) differ from WritePayload's", per)
		}
		_, srv := pairOf(t, params(session.Integrity, "tag"))
		dst := make([]byte, n)
		if err := srv.Recv.ReadPayload(bytes.NewReader(got), dst, nil); err != nil || !bytes.Equal(dst, p) {
			t.Fatalf("read back: %v", err)
		}
	}
	rec := session.RecordSize + session.TagSize
	for name, alter := range map[string]func(b []byte) []byte{
		"flip in record 7": func(b []byte) []byte { b[6*rec+7] ^= 1; return b },
		"flip in a tag":    func(b []byte) []byte { b[2*rec-1] ^= 0x80; return b },
		"swap records":     func(b []byte) []byte { return slices.Concat(b[rec:2*rec], b[:rec], b[2*rec:]) },
		"drop a record":    func(b []byte) []byte { return append(b[:rec:rec], b[2*rec:]...) },
	} {
		_, srv := pairOf(t, params(session.Integrity, "tag"))
		dst := make([]byte, n)
		err := srv.Recv.ReadPayload(bytes.NewReader(alter(tagged(16))), dst, nil)
		if c := errs.CodeOf(err); c != errs.Unauthenticated && !(name == "drop a record" && errors.Is(err, io.ErrUnexpectedEOF)) {
			t.Fatalf("%s: %v", name, err)
		}
		if name != "drop a record" && bytes.Equal(dst, p) {
			t.Fatalf("%s: the payload landed whole", name)
		}
	}
	for _, mode := range []session.Mode{session.Headers, session.Encryption} {
		ini, _ := pairOf(t, params(mode, "tag"))
		_, err := ini.Send.Tags(nil, p[:10])
		wantCode(t, mode.String()+": tags", err, errs.InvalidArgument)
	}
	var none *session.Sealer
	_, err := none.Tags(nil, p[:10])
	wantCode(t, "no session: tags", err, errs.InvalidArgument)
	_, err = ini.Send.Tags(nil, nil)
	wantCode(t, "empty payload", err, errs.InvalidArgument)
}
