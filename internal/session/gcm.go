package session

import (
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
)

// gcm computes what crypto/cipher's AES-128-GCM computes for records:
// the tags of Headers and Integrity records (GMAC: the record as
// additional data, nothing encrypted) and Encryption's sealed records.
// Where the CPU has AVX-512 with VAES and VPCLMULQDQ (vectorGCM: Intel Ice
// Lake, AMD Zen 4 and later) records of vectorMin bytes or more go through
// ghash_amd64.s (32 blocks a round) and aesctr_amd64.s (16): crypto/cipher
// hashes additional data one block at a time, which made a record's tag
// cost more than the TCP copy of its bytes, and encrypts four blocks at a
// time. Shorter records, and every record elsewhere, go through
// crypto/cipher. Both give the same bytes, so the wire does not change and
// engines with and without the vector path interoperate.
type gcm struct {
	aead cipher.AEAD
	blk  cipher.Block
	pow  *[32][2]uint64 // H^32..H^1 as ghashBlocks takes them; nil: crypto/cipher only
	rk   *[11][16]byte  // AES-128's round keys, for ctrBlocks
}

// vectorMin is the shortest record the vector path takes: below it the
// setup of a round costs more than it saves.
const vectorMin = 256

func newGCM(key []byte, blk cipher.Block, aead cipher.AEAD) *gcm {
	g := &gcm{aead: aead, blk: blk}
	if vectorGCM && len(key) == 16 {
		g.pow = ghashPowers(blk)
		g.rk = expandKey(key)
	}
	return g
}

// sum writes the GMAC tag of ad under nonce to tag (TagSize bytes).
func (g *gcm) sum(tag []byte, nonce *[NonceSize]byte, ad []byte) {
	if g.pow == nil || len(ad) < vectorMin {
		g.aead.Seal(tag[:0], nonce[:], nil, ad)
		return
	}
	g.mask(tag, nonce)
	g.ghash(tag, ad, uint64(len(ad))*8, 0)
}

// check reports whether tag is the GMAC tag of ad under nonce, in constant
// time; it overwrites scratch (TagSize bytes). Callers pass slices that
// already live on the heap, so a check allocates nothing.
func (g *gcm) check(tag []byte, nonce *[NonceSize]byte, ad, scratch []byte) bool {
	if len(tag) != TagSize {
		return false
	}
	if g.pow == nil || len(ad) < vectorMin {
		_, err := g.aead.Open(scratch[:0], nonce[:], tag, ad)
		return err == nil
	}
	g.mask(scratch, nonce)
	g.ghash(scratch, ad, uint64(len(ad))*8, 0)
	return subtle.ConstantTimeCompare(scratch[:TagSize], tag) == 1
}

// seal appends p encrypted under nonce, then its tag, to dst, as
// cipher.AEAD's Seal with no additional data; p and the appended bytes may
// overlap exactly (sealing in place) or not at all.
func (g *gcm) seal(dst []byte, nonce *[NonceSize]byte, p []byte) []byte {
	if g.pow == nil || len(p) < vectorMin {
		return g.aead.Seal(dst, nonce[:], p, nil)
	}
	at := len(dst)
	n := len(p)
	if cap(dst)-at < n+TagSize {
		grown := make([]byte, at, at+n+TagSize)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:at+n+TagSize]
	ct, tag := dst[at:at+n], dst[at+n:]
	g.ctr(ct, p, nonce)
	g.mask(tag, nonce)
	g.ghash(tag, ct, 0, uint64(n)*8)
	return dst
}

// open checks rec (ciphertext and tag) under nonce and, only if the tag
// holds, decrypts it in place into rec's first len(rec)-TagSize bytes; it
// overwrites scratch (TagSize bytes). Nothing is decrypted under a refused
// tag.
func (g *gcm) open(rec []byte, nonce *[NonceSize]byte, scratch []byte) bool {
	n := len(rec) - TagSize
	if n < 0 {
		return false
	}
	if !g.vector(n) {
		_, err := g.aead.Open(rec[:0], nonce[:], rec, nil)
		return err == nil
	}
	if !g.verify(rec, nonce, scratch) {
		return false
	}
	g.ctr(rec[:n], rec[:n], nonce)
	return true
}

// vector reports whether records of n bytes take the vector path, the only
// one where verify and ctr may be used.
func (g *gcm) vector(n int) bool { return g.pow != nil && n >= vectorMin }

// verify checks the tag of rec (ciphertext and tag, a vector record) under
// nonce, in constant time, and decrypts nothing: ctr does, once it held.
func (g *gcm) verify(rec []byte, nonce *[NonceSize]byte, scratch []byte) bool {
	n := len(rec) - TagSize
	g.mask(scratch, nonce)
	g.ghash(scratch, rec[:n], 0, uint64(n)*8)
	return subtle.ConstantTimeCompare(scratch[:TagSize], rec[n:]) == 1
}

// mask writes E_K(J0) to dst: the first counter block of a 96-bit nonce,
// encrypted, which GCM adds to the GHASH.
func (g *gcm) mask(dst []byte, nonce *[NonceSize]byte) {
	copy(dst, nonce[:])
	dst[12], dst[13], dst[14], dst[15] = 0, 0, 0, 1
	g.blk.Encrypt(dst, dst)
}

// ctr XORs src with GCM's key stream for nonce (counter blocks from J0+1)
// into dst, which is src or does not overlap it.
func (g *gcm) ctr(dst, src []byte, nonce *[NonceSize]byte) {
	var c [16]byte
	copy(c[:], nonce[:])
	c[15] = 2
	full := len(src) &^ 15
	if full > 0 {
		ctrBlocks(g.rk, &c, &dst[0], &src[0], full/16)
	}
	if rem := len(src) - full; rem > 0 {
		var t [16]byte
		copy(t[:], src[full:])
		ctrBlocks(g.rk, &c, &t[0], &t[0], 1)
		copy(dst[full:], t[:rem])
	}
}

// ghash adds to dst the GHASH of data followed by the lengths block (the
// bit lengths of the additional data and of the ciphertext: one of them
// is data, the other empty), data's last block zero-padded.
func (g *gcm) ghash(dst, data []byte, adBits, ctBits uint64) {
	var y [2]uint64
	full := len(data) &^ 15
	if full > 0 {
		ghashBlocks(g.pow, &y, &data[0], full/16)
	}
	var tail [32]byte
	n := 0
	if copy(tail[:], data[full:]) > 0 {
		n = 16
	}
	binary.BigEndian.PutUint64(tail[n:], adBits)
	binary.BigEndian.PutUint64(tail[n+8:], ctBits)
	ghashBlocks(g.pow, &y, &tail[0], n/16+1)
	binary.BigEndian.PutUint64(dst[0:], binary.BigEndian.Uint64(dst[0:])^y[1])
	binary.BigEndian.PutUint64(dst[8:], binary.BigEndian.Uint64(dst[8:])^y[0])
}

// expandKey is AES-128's key schedule (FIPS 197, 5.2): the eleven round
// keys ctrBlocks uses, SubWord computed by the CPU (subWord).
func expandKey(key []byte) *[11][16]byte {
	var w [44]uint32
	for i := range 4 {
		w[i] = binary.BigEndian.Uint32(key[4*i:])
	}
	rcon := uint32(1)
	for i := 4; i < 44; i++ {
		t := w[i-1]
		if i%4 == 0 {
			t = subWord(t<<8|t>>24) ^ rcon<<24
			rcon <<= 1
			if rcon&0x100 != 0 {
				rcon ^= 0x11b
			}
		}
		w[i] = w[i-4] ^ t
	}
	var rk [11][16]byte
	for i := range 44 {
		binary.BigEndian.PutUint32(rk[i/4][4*(i%4):], w[i])
	}
	return &rk
}

// ghashPowers returns H^32..H^1 for ghashBlocks: H = E_K(0), byte-reflected
// and multiplied by x (a one-bit left shift, reduced), the form in which
// a plain carry-less product followed by the two folds of the reduction
// is GCM's multiplication; each power is the previous one times H in that
// arithmetic (ghashMul).
func ghashPowers(blk cipher.Block) *[32][2]uint64 {
	h := make([]byte, 16)
	blk.Encrypt(h, h)
	hi, lo := binary.BigEndian.Uint64(h[0:]), binary.BigEndian.Uint64(h[8:])
	carry := hi >> 63
	hi, lo = hi<<1|lo>>63, lo<<1
	if carry == 1 {
		hi ^= ghashPoly
		lo ^= 1
	}
	var pow [32][2]uint64
	pow[31] = [2]uint64{lo, hi}
	for i := 30; i >= 0; i-- {
		pow[i] = ghashMul(pow[i+1], pow[31])
	}
	return &pow
}

// ghashPoly is the fold constant: x^63 + x^62 + x^57 in the reflected
// order, the low terms of GCM's polynomial.
const ghashPoly = 0xc200000000000000

// ghashMul is ghashBlocks' multiplication, in Go: a and b as {low, high}
// 64-bit halves of byte-reflected blocks, b (or a) pre-multiplied by x.
// It is slow (a bit at a time) and used only for the key's powers and as
// the model the assembly is tested against.
func ghashMul(a, b [2]uint64) [2]uint64 {
	lo := clmul(a[0], b[0])
	hi := clmul(a[1], b[1])
	m1, m2 := clmul(a[0], b[1]), clmul(a[1], b[0])
	mi := [2]uint64{m1[0] ^ m2[0], m1[1] ^ m2[1]}
	t := clmul(lo[0], ghashPoly)
	mi = [2]uint64{mi[0] ^ lo[1] ^ t[0], mi[1] ^ lo[0] ^ t[1]}
	t = clmul(mi[0], ghashPoly)
	return [2]uint64{hi[0] ^ mi[1] ^ t[0], hi[1] ^ mi[0] ^ t[1]}
}

// clmul is the carry-less product of a and b as {low, high}.
func clmul(a, b uint64) [2]uint64 {
	var r [2]uint64
	for i := range 64 {
		if b>>i&1 == 1 {
			r[0] ^= a << i
			if i > 0 {
				r[1] ^= a >> (64 - i)
			}
		}
	}
	return r
}

// ghashBlocksGo is ghashBlocks in Go, block by block: the reference for
// the tests, and the path of CPUs without the vector instructions (which
// use crypto/cipher instead; see newGMAC).
func ghashBlocksGo(pow *[32][2]uint64, y *[2]uint64, p []byte) {
	for ; len(p) >= 16; p = p[16:] {
		x := [2]uint64{y[0] ^ binary.BigEndian.Uint64(p[8:]), y[1] ^ binary.BigEndian.Uint64(p[0:])}
		*y = ghashMul(x, pow[31])
	}
}
