package session

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"fmt"
	"testing"
)

// gmacLengths: every length up to three rounds of sixteen blocks, then
// lengths around round and record boundaries.
func gmacLengths() []int {
	var ns []int
	for n := 0; n <= 3*256+17; n++ {
		ns = append(ns, n)
	}
	return append(ns, 4095, 4096, 4097, RecordSize-1, RecordSize-16, RecordSize)
}

func newTestGMAC(t testing.TB, vector bool) *gmac {
	key := make([]byte, KeySize)
	rand.Read(key)
	blk, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	g, err := cipher.NewGCM(blk)
	if err != nil {
		t.Fatal(err)
	}
	m := &gmac{aead: g, blk: blk}
	if vector {
		m.pow = ghashPowers(blk)
	}
	return m
}

// TestGHASHModel: the Go model of the vector GHASH (the multiplication,
// the pre-multiplied key, the reduction) gives crypto/cipher's GMAC tags.
func TestGHASHModel(t *testing.T) {
	m := newTestGMAC(t, true)
	var nonce [NonceSize]byte
	for _, n := range []int{0, 1, 15, 16, 17, 255, 256, 1000} {
		ad := make([]byte, n)
		rand.Read(ad)
		rand.Read(nonce[:])
		want := m.aead.Seal(nil, nonce[:], nil, ad)
		got := make([]byte, TagSize)
		m.mask(got, &nonce)
		var y [2]uint64
		var tail [32]byte
		full := n &^ 15
		ghashBlocksGo(m.pow, &y, ad[:full])
		k := 0
		if copy(tail[:], ad[full:]) > 0 {
			k = 16
		}
		tail[k+6], tail[k+7] = byte(n*8>>8), byte(n*8)
		ghashBlocksGo(m.pow, &y, tail[:k+16])
		for i := range 8 {
			got[i] ^= byte(y[1] >> (56 - 8*i))
			got[8+i] ^= byte(y[0] >> (56 - 8*i))
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes: model %x, crypto/cipher %x", n, got, want)
		}
	}
}

// TestGMACMatchesGCM: the vector path's tag is crypto/cipher's GMAC tag
// for every length (so engines with and without it interoperate), and a
// check refuses a tag or record with any one bit changed.
func TestGMACMatchesGCM(t *testing.T) {
	if !vectorGHASH {
		t.Skip("this CPU has no 512-bit carry-less multiply (AVX-512 VPCLMULQDQ): crypto/cipher computes every tag")
	}
	m := newTestGMAC(t, true)
	var nonce [NonceSize]byte
	ad := make([]byte, RecordSize)
	got := make([]byte, TagSize)
	scratch := make([]byte, TagSize)
	for _, n := range gmacLengths() {
		rand.Read(nonce[:])
		rand.Read(ad[:n])
		want := m.aead.Seal(nil, nonce[:], nil, ad[:n])
		m.sum(got, &nonce, ad[:n])
		if !bytes.Equal(got, want) {
			t.Fatalf("%d bytes: vector %x, crypto/cipher %x", n, got, want)
		}
		if !m.check(want, &nonce, ad[:n], scratch) {
			t.Fatalf("%d bytes: right tag refused", n)
		}
		bad := bytes.Clone(want)
		bad[n%TagSize] ^= 1 << (n % 8)
		if m.check(bad, &nonce, ad[:n], scratch) {
			t.Fatalf("%d bytes: altered tag accepted", n)
		}
		if n > 0 {
			ad[n/2] ^= 0x80
			if m.check(want, &nonce, ad[:n], scratch) {
				t.Fatalf("%d bytes: altered record accepted", n)
			}
		}
	}
}

// TestGMACSessionsInteroperate: an engine whose CPU computes tags with the
// vector path and one that uses crypto/cipher open each other's Integrity
// payloads, and refuse each other's altered ones.
func TestGMACSessionsInteroperate(t *testing.T) {
	if !vectorGHASH {
		t.Skip("this CPU has no 512-bit carry-less multiply (AVX-512 VPCLMULQDQ)")
	}
	for _, vectorSends := range []bool{true, false} {
		t.Run(fmt.Sprintf("vector sends %v", vectorSends), func(t *testing.T) {
			p := Params{Secret: []byte("0123456789abcdef"), Transcript: []byte("gmac interop"), Channel: Data, Mode: Integrity}
			vectorGHASH = vectorSends
			ini, err := New(p, Initiator)
			vectorGHASH = !vectorSends
			srv, err2 := New(p, Server)
			vectorGHASH = true
			if err != nil || err2 != nil {
				t.Fatal(err, err2)
			}
			if (ini.Send.d.mac.pow != nil) != vectorSends || (srv.Recv.d.mac.pow != nil) == vectorSends {
				t.Fatal("the two ends did not take the paths meant")
			}
			payload := make([]byte, 3*RecordSize+4099)
			rand.Read(payload)
			var w bytes.Buffer
			if err := ini.Send.WritePayload(&w, payload, nil); err != nil {
				t.Fatal(err)
			}
			wire := bytes.Clone(w.Bytes())
			dst := make([]byte, len(payload))
			if err := srv.Recv.ReadPayload(bytes.NewReader(wire), dst, nil); err != nil || !bytes.Equal(dst, payload) {
				t.Fatalf("payload did not open: %v", err)
			}
			// The next payload, altered in its second record.
			w.Reset()
			if err := ini.Send.WritePayload(&w, payload, nil); err != nil {
				t.Fatal(err)
			}
			wire = w.Bytes()
			wire[RecordSize+TagSize+100] ^= 4
			clear(dst)
			if err := srv.Recv.ReadPayload(bytes.NewReader(wire), dst, nil); err == nil {
				t.Fatal("altered payload opened")
			}
			if bytes.Equal(dst[RecordSize:2*RecordSize], payload[RecordSize:2*RecordSize]) {
				t.Fatal("the altered record reached the destination")
			}
		})
	}
}

func BenchmarkGMAC(b *testing.B) {
	for _, vector := range []bool{false, true} {
		if vector && !vectorGHASH {
			continue
		}
		m := newTestGMAC(b, vector)
		var nonce [NonceSize]byte
		tag := make([]byte, TagSize)
		for _, n := range []int{4 << 10, RecordSize} {
			ad := make([]byte, n)
			name := "crypto-cipher"
			if vector {
				name = "vector"
			}
			b.Run(fmt.Sprintf("%s/%d", name, n), func(b *testing.B) {
				b.SetBytes(int64(n))
				for b.Loop() {
					m.sum(tag, &nonce, ad)
				}
			})
		}
	}
}
