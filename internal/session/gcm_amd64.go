package session

import (
	"crypto/fips140"

	"github.com/klauspost/cpuid/v2"
)

// vectorGCM: the CPU (and the OS, which must save ZMM registers) has what
// ghash_amd64.s and aesctr_amd64.s use, and Go's FIPS 140 mode is off (in
// it, only the validated module computes records).
var vectorGCM = !fips140.Enabled() && cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.VPCLMULQDQ, cpuid.VAES, cpuid.CLMUL, cpuid.AESNI, cpuid.AVX2, cpuid.SSE4)

// ghashBlocks folds n 16-byte blocks at p into the GHASH state y with the
// powers of H in pow (ghashPowers).
//
//go:noescape
func ghashBlocks(pow *[32][2]uint64, y *[2]uint64, p *byte, n int)

// ctrBlocks XORs n 16-byte blocks at src with AES-128's encryptions of the
// counter blocks from *ctr on (GCM's 32-bit increment) into dst, and
// leaves in *ctr the counter block after the last one used.
//
//go:noescape
func ctrBlocks(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int)

// subWord applies AES's S-box to each byte of w.
func subWord(w uint32) uint32
