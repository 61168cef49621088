package session

import "github.com/klauspost/cpuid/v2"

// vectorGHASH: the CPU (and the OS, which must save ZMM registers) has
// what ghash_amd64.s uses.
var vectorGHASH = cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512BW, cpuid.VPCLMULQDQ, cpuid.CLMUL, cpuid.AVX2)

// ghashBlocks folds n 16-byte blocks at p into the GHASH state y with the
// powers of H in pow (ghashPowers).
//
//go:noescape
func ghashBlocks(pow *[16][2]uint64, y *[2]uint64, p *byte, n int)
