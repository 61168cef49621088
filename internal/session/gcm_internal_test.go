package session

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"testing"
)

// gcmLengths: every length up to three rounds of sixteen blocks and a
// little more, then lengths around round and record boundaries.
func gcmLengths() []int {
	var ns []int
	for n := 0; n <= 3*256+17; n++ {
		ns = append(ns, n)
	}
	return append(ns, 4095, 4096, 4097, RecordSize-1, RecordSize-16, RecordSize)
}

func newTestGCM(t testing.TB, vector bool) *gcm {
	key := make([]byte, KeySize)
	rand.Read(key)
	blk, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	a, err := cipher.NewGCM(blk)
	if err != nil {
		t.Fatal(err)
	}
	g := &gcm{aead: a, blk: blk}
	if vector {
		g.pow = ghashPowers(blk)
		g.rk = expandKey(key)
	}
	return g
}

func needVector(t testing.TB) {
	if !vectorGCM {
		t.Skip("no vector path here (the CPU lacks AVX-512 VAES/VPCLMULQDQ, or Go's FIPS 140 mode is on): crypto/cipher computes every record")
	}
}

// TestGHASHModel: the Go model of the vector GHASH (the multiplication,
// the pre-multiplied key, the reduction) gives crypto/cipher's GMAC tags.
func TestGHASHModel(t *testing.T) {
	g := newTestGCM(t, false)
	g.pow = ghashPowers(g.blk)
	var nonce [NonceSize]byte
	for _, n := range []int{0, 1, 15, 16, 17, 255, 256, 1000} {
		ad := make([]byte, n)
		rand.Read(ad)
		rand.Read(nonce[:])
		want := g.aead.Seal(nil, nonce[:], nil, ad)
		got := make([]byte, TagSize)
		g.mask(got, &nonce)
		var y [2]uint64
		full := n &^ 15
		ghashBlocksGo(g.pow, &y, ad[:full])
		var tail [32]byte
		k := 0
		if copy(tail[:], ad[full:]) > 0 {
			k = 16
		}
		binary.BigEndian.PutUint64(tail[k:], uint64(n)*8)
		ghashBlocksGo(g.pow, &y, tail[:k+16])
		binary.BigEndian.PutUint64(got[0:], binary.BigEndian.Uint64(got[0:])^y[1])
		binary.BigEndian.PutUint64(got[8:], binary.BigEndian.Uint64(got[8:])^y[0])
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes: model %x, crypto/cipher %x", n, got, want)
		}
	}
}

// TestCounterBlocks: ctrBlocks' key stream is AES of successive counter
// blocks (crypto/aes as the reference), the counter stepping by GCM's
// inc32 (the last four bytes, big-endian, wrapping), through rounds of
// sixteen and single blocks, and *ctr ends at the next counter.
func TestCounterBlocks(t *testing.T) {
	needVector(t)
	g := newTestGCM(t, true)
	for _, start := range []uint32{2, 0xfffffff8, 0xffffffff} {
		for _, n := range []int{1, 15, 16, 17, 33, 40} {
			var c [16]byte
			rand.Read(c[:12])
			binary.BigEndian.PutUint32(c[12:], start)
			want := make([]byte, 16*n)
			ref := c
			for i := range n {
				g.blk.Encrypt(want[16*i:], ref[:])
				binary.BigEndian.PutUint32(ref[12:], binary.BigEndian.Uint32(ref[12:])+1)
			}
			got := make([]byte, 16*n)
			ctrBlocks(g.rk, &c, &got[0], &got[0], n)
			if !bytes.Equal(got, want) {
				t.Fatalf("counter from %#x, %d blocks: key stream differs from crypto/aes", start, n)
			}
			if c != ref {
				t.Fatalf("counter from %#x, %d blocks: next counter %x, want %x", start, n, c, ref)
			}
		}
	}
}

// TestGCMMatchesCryptoCipher: for every length, the vector path's GMAC tags
// and sealed records are crypto/cipher's bytes (so engines with and
// without it interoperate), sealing in place gives the same, and a check
// or open refuses a tag or record with a bit changed and decrypts
// nothing.
func TestGCMMatchesCryptoCipher(t *testing.T) {
	needVector(t)
	g := newTestGCM(t, true)
	var nonce [NonceSize]byte
	p := make([]byte, RecordSize)
	tag := make([]byte, TagSize)
	scratch := make([]byte, TagSize)
	for _, n := range gcmLengths() {
		rand.Read(nonce[:])
		rand.Read(p[:n])
		want := g.aead.Seal(nil, nonce[:], nil, p[:n])
		g.sum(tag, &nonce, p[:n])
		if !bytes.Equal(tag, want) {
			t.Fatalf("GMAC of %d bytes: vector %x, crypto/cipher %x", n, tag, want)
		}
		if !g.check(want, &nonce, p[:n], scratch) {
			t.Fatalf("GMAC of %d bytes: right tag refused", n)
		}
		bad := bytes.Clone(want)
		bad[n%TagSize] ^= 1 << (n % 8)
		if g.check(bad, &nonce, p[:n], scratch) {
			t.Fatalf("GMAC of %d bytes: altered tag accepted", n)
		}
		if n > 0 {
			p[n/2] ^= 0x80
			if g.check(want, &nonce, p[:n], scratch) {
				t.Fatalf("GMAC of %d bytes: altered record accepted", n)
			}
			p[n/2] ^= 0x80
		}

		sealed := g.aead.Seal(nil, nonce[:], p[:n], nil)
		if got := g.seal([]byte{9}, &nonce, p[:n]); got[0] != 9 || !bytes.Equal(got[1:], sealed) {
			t.Fatalf("seal of %d bytes differs from crypto/cipher", n)
		}
		inPlace := make([]byte, n, n+TagSize)
		copy(inPlace, p[:n])
		if got := g.seal(inPlace[:0], &nonce, inPlace); !bytes.Equal(got, sealed) {
			t.Fatalf("seal of %d bytes in place differs from crypto/cipher", n)
		}
		rec := bytes.Clone(sealed)
		if !g.open(rec, &nonce, scratch) || !bytes.Equal(rec[:n], p[:n]) {
			t.Fatalf("open of %d bytes failed or differs", n)
		}
		for _, at := range []int{0, n / 2, n + n%TagSize} {
			if at >= len(sealed) {
				continue
			}
			rec := bytes.Clone(sealed)
			rec[at] ^= 0x10
			kept := bytes.Clone(rec)
			if g.open(rec, &nonce, scratch) {
				t.Fatalf("open of %d bytes: byte %d altered, accepted", n, at)
			}
			// crypto/cipher clears what it would have decrypted; the
			// vector path leaves the record as it was. Neither releases
			// plaintext.
			if (n >= vectorMin && !bytes.Equal(rec, kept)) || (n >= 16 && bytes.Equal(rec[:n], p[:n])) {
				t.Fatalf("open of %d bytes: a refused record was decrypted", n)
			}
		}
	}
	if g.open(make([]byte, TagSize-1), &nonce, scratch) {
		t.Fatal("a record shorter than a tag opened")
	}
	// A tag of the wrong length is refused on both paths, not compared
	// over its prefix.
	for _, n := range []int{16, vectorMin, 4096} {
		want := g.aead.Seal(nil, nonce[:], nil, p[:n])
		for _, l := range []int{0, 1, TagSize - 1, TagSize + 1} {
			tag := make([]byte, l)
			copy(tag, want)
			if g.check(tag, &nonce, p[:n], scratch) {
				t.Fatalf("GMAC of %d bytes: a tag of %d bytes accepted", n, l)
			}
		}
	}
}

// TestGCMSessionsInteroperate: an engine whose CPU takes the vector path
// and one that uses crypto/cipher open each other's Integrity and
// Encryption payloads, and refuse each other's altered ones.
func TestGCMSessionsInteroperate(t *testing.T) {
	needVector(t)
	defer func() { vectorGCM = true }()
	for _, mode := range []Mode{Integrity, Encryption} {
		for _, vectorSends := range []bool{true, false} {
			t.Run(fmt.Sprintf("%v, vector sends %v", mode, vectorSends), func(t *testing.T) {
				p := Params{Secret: []byte("0123456789abcdef"), Transcript: []byte("gcm interop"), Channel: Data, Mode: mode}
				vectorGCM = vectorSends
				ini, err := New(p, Initiator)
				vectorGCM = !vectorSends
				srv, err2 := New(p, Server)
				vectorGCM = true
				if err != nil || err2 != nil {
					t.Fatal(err, err2)
				}
				if (ini.Send.d.gcm.pow != nil) != vectorSends || (srv.Recv.d.gcm.pow != nil) == vectorSends {
					t.Fatal("the two ends did not take the paths meant")
				}
				payload := make([]byte, 3*RecordSize+4099)
				rand.Read(payload)
				var w bytes.Buffer
				if err := ini.Send.WritePayload(&w, payload, nil); err != nil {
					t.Fatal(err)
				}
				dst := make([]byte, len(payload))
				if err := srv.Recv.ReadPayload(bytes.NewReader(w.Bytes()), dst, nil); err != nil || !bytes.Equal(dst, payload) {
					t.Fatalf("payload did not open: %v", err)
				}
				// The next payload, altered in its second record.
				w.Reset()
				if err := ini.Send.WritePayload(&w, payload, nil); err != nil {
					t.Fatal(err)
				}
				wire := w.Bytes()
				wire[RecordSize+TagSize+100] ^= 4
				clear(dst)
				if err := srv.Recv.ReadPayload(bytes.NewReader(wire), dst, nil); err == nil {
					t.Fatal("altered payload opened")
				}
				if bytes.Equal(dst[RecordSize:2*RecordSize], payload[RecordSize:2*RecordSize]) {
					t.Fatal("the altered record reached the destination")
				}
				if !bytes.Equal(dst[:RecordSize], payload[:RecordSize]) || bytes.ContainsFunc(dst[RecordSize:], func(r rune) bool { return r != 0 }) {
					t.Fatal("want the first record in place and nothing from the altered one on")
				}
			})
		}
	}
}

// BenchmarkGCM: one record's GMAC tag and sealing, crypto/cipher against
// the vector path.
func BenchmarkGCM(b *testing.B) {
	for _, vector := range []bool{false, true} {
		if vector && !vectorGCM {
			continue
		}
		g := newTestGCM(b, vector)
		var nonce [NonceSize]byte
		tag := make([]byte, TagSize)
		name := "crypto-cipher"
		if vector {
			name = "vector"
		}
		for _, n := range []int{4 << 10, RecordSize} {
			p := make([]byte, n)
			out := make([]byte, 0, n+TagSize)
			b.Run(fmt.Sprintf("gmac/%s/%d", name, n), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					g.sum(tag, &nonce, p)
				}
			})
			b.Run(fmt.Sprintf("seal/%s/%d", name, n), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					g.seal(out[:0], &nonce, p)
				}
			})
		}
	}
}
