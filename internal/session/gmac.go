package session

import (
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
)

// gmac computes and checks the tags of Headers and Integrity records:
// AES-GCM's tag over the record as additional data with nothing to
// encrypt. Where the CPU multiplies 512 bits carry-less at a time
// (vectorGHASH) the GHASH of a record runs on those instructions
// (ghash_amd64.s), sixteen blocks a round, and AES only encrypts the
// counter block: crypto/cipher's GCM hashes additional data a block at a
// time, which made the tag cost more than the TCP copy of the same bytes.
// Short records, and every record elsewhere, go through crypto/cipher.
// Both give the same tag: the wire does not change.
type gmac struct {
	aead cipher.AEAD
	blk  cipher.Block
	pow  *[16][2]uint64 // H^16..H^1 as ghashBlocks takes them; nil: crypto/cipher only
}

// vectorMin is the shortest record the vector path takes: below it the
// setup of a round costs more than it saves.
const vectorMin = 256

func newGMAC(blk cipher.Block, aead cipher.AEAD) *gmac {
	g := &gmac{aead: aead, blk: blk}
	if vectorGHASH {
		g.pow = ghashPowers(blk)
	}
	return g
}

// sum writes the tag of ad under nonce to tag (TagSize bytes).
func (g *gmac) sum(tag []byte, nonce *[NonceSize]byte, ad []byte) {
	if g.pow == nil || len(ad) < vectorMin {
		g.aead.Seal(tag[:0], nonce[:], nil, ad)
		return
	}
	g.mask(tag, nonce)
	g.ghash(tag, ad)
}

// check reports whether tag is the tag of ad under nonce, in constant
// time; it overwrites scratch (TagSize bytes). Callers pass slices that
// already live on the heap, so a check allocates nothing.
func (g *gmac) check(tag []byte, nonce *[NonceSize]byte, ad, scratch []byte) bool {
	if len(tag) != TagSize {
		return false
	}
	if g.pow == nil || len(ad) < vectorMin {
		_, err := g.aead.Open(scratch[:0], nonce[:], tag, ad)
		return err == nil
	}
	g.mask(scratch, nonce)
	g.ghash(scratch, ad)
	return subtle.ConstantTimeCompare(scratch[:TagSize], tag) == 1
}

// mask writes E_K(J0) to dst: the first counter block of a 96-bit nonce,
// encrypted, which GCM adds to the GHASH.
func (g *gmac) mask(dst []byte, nonce *[NonceSize]byte) {
	copy(dst, nonce[:])
	dst[12], dst[13], dst[14], dst[15] = 0, 0, 0, 1
	g.blk.Encrypt(dst, dst)
}

// ghash adds to dst GHASH(ad, no ciphertext): ad's blocks, the last one
// zero-padded, then the lengths block.
func (g *gmac) ghash(dst, ad []byte) {
	var y [2]uint64
	full := len(ad) &^ 15
	if full > 0 {
		ghashBlocks(g.pow, &y, &ad[0], full/16)
	}
	var tail [32]byte
	n := 0
	if copy(tail[:], ad[full:]) > 0 {
		n = 16
	}
	binary.BigEndian.PutUint64(tail[n:], uint64(len(ad))*8)
	ghashBlocks(g.pow, &y, &tail[0], n/16+1)
	binary.BigEndian.PutUint64(dst[0:], binary.BigEndian.Uint64(dst[0:])^y[1])
	binary.BigEndian.PutUint64(dst[8:], binary.BigEndian.Uint64(dst[8:])^y[0])
}

// ghashPowers returns H^16..H^1 for ghashBlocks: H = E_K(0), byte-reflected
// and multiplied by x (a one-bit left shift, reduced), the form in which
// a plain carry-less product followed by the two folds of the reduction
// is GCM's multiplication; each power is the previous one times H in that
// arithmetic (ghashMul).
func ghashPowers(blk cipher.Block) *[16][2]uint64 {
	h := make([]byte, 16)
	blk.Encrypt(h, h)
	hi, lo := binary.BigEndian.Uint64(h[0:]), binary.BigEndian.Uint64(h[8:])
	carry := hi >> 63
	hi, lo = hi<<1|lo>>63, lo<<1
	if carry == 1 {
		hi ^= ghashPoly
		lo ^= 1
	}
	var pow [16][2]uint64
	pow[15] = [2]uint64{lo, hi}
	for i := 14; i >= 0; i-- {
		pow[i] = ghashMul(pow[i+1], pow[15])
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
func ghashBlocksGo(pow *[16][2]uint64, y *[2]uint64, p []byte) {
	for ; len(p) >= 16; p = p[16:] {
		x := [2]uint64{y[0] ^ binary.BigEndian.Uint64(p[8:]), y[1] ^ binary.BigEndian.Uint64(p[0:])}
		*y = ghashMul(x, pow[15])
	}
}
