#include "textflag.h"

// GHASH over whole 16-byte blocks with AVX-512 carry-less multiplies:
// thirty-two blocks a round (eight ZMM registers) multiplied by
// H^32..H^1, or sixteen by H^16..H^1, summed unreduced and reduced once a
// round, then any blocks left one at a time. Values are GCM's blocks
// byte-reflected (PSHUFB), keys pre-multiplied as gcm.go's ghashPowers
// makes them, and the reduction is the two folds by x^63 + x^62 + x^57
// (0xc2 << 56) that keep GCM's bit order: the arithmetic of gcm.go's
// ghashMul, which the tests hold against crypto/cipher's GCM. Each
// block-by-power product takes Karatsuba's three carry-less multiplies, not
// four (the multiplies bound the loop: 25 % faster on AMD Zen 5), and a
// round's chain of dependent steps (the previous sum into the first
// blocks, the reduction, the lanes' sum) is why rounds are as long as the
// registers allow.

// Reverses a 16-byte block; aesctr_amd64.s uses it too.
DATA ·bswapMask+0x00(SB)/8, $0x08090a0b0c0d0e0f
DATA ·bswapMask+0x08(SB)/8, $0x0001020304050607
GLOBL ·bswapMask(SB), RODATA|NOPTR, $16

DATA gfPoly<>+0x00(SB)/8, $0x0000000000000001
DATA gfPoly<>+0x08(SB)/8, $0xc200000000000000
GLOBL gfPoly<>(SB), RODATA|NOPTR, $16

// MULACC adds the product of four blocks d and four powers h, unreduced,
// to LO (Z5), HI (Z6) and MI (Z7), with Karatsuba's three multiplies in
// place of four: MI gets (d.hi ^ d.lo)(h.hi ^ h.lo), and REDUCE adds LO and
// HI into it once a round to make it the middle term. hk holds h.hi ^ h.lo
// of each lane in its low (sel 0x00) or high (sel 0x10) quadword.
#define MULACC(d, h, hk, sel) \
	VPCLMULQDQ $0x00, h, d, Z16 \
	VPCLMULQDQ $0x11, h, d, Z17 \
	VPSHUFD    $0x4e, d, Z18 \
	VPXORQ     d, Z18, Z18 \
	VPCLMULQDQ sel, hk, Z18, Z19 \
	VPXORQ     Z16, Z5, Z5 \
	VPXORQ     Z17, Z6, Z6 \
	VPXORQ     Z19, Z7, Z7

// FOLDKEYS puts h1.hi ^ h1.lo in the low and h2.hi ^ h2.lo in the high
// quadword of each lane of hk (MULACC's hk).
#define FOLDKEYS(h1, h2, hk) \
	VPSHUFD     $0x4e, h1, Z16 \
	VPXORQ      h1, Z16, Z16 \
	VPSHUFD     $0x4e, h2, Z17 \
	VPXORQ      h2, Z17, Z17 \
	VPUNPCKLQDQ Z17, Z16, hk

// REDUCE makes MI the middle term (MI ^= LO ^ HI), folds LO into MI and MI
// into HI in each lane, then sums the four lanes of HI into X0 (the VEX
// XOR zeroes X0's upper lanes).
#define REDUCE \
	VPTERNLOGQ    $0x96, Z5, Z6, Z7 \
	VPCLMULQDQ    $0x01, Z5, Z14, Z16 \
	VPSHUFD       $0x4e, Z5, Z5 \
	VPTERNLOGQ    $0x96, Z5, Z16, Z7 \
	VPCLMULQDQ    $0x01, Z7, Z14, Z16 \
	VPSHUFD       $0x4e, Z7, Z7 \
	VPTERNLOGQ    $0x96, Z7, Z16, Z6 \
	VEXTRACTI64X4 $1, Z6, Y7 \
	VPXOR         Y7, Y6, Y6 \
	VEXTRACTI128  $1, Y6, X7 \
	VPXOR         X7, X6, X0

#define CLEARACC \
	VPXORQ Z5, Z5, Z5 \
	VPXORQ Z6, Z6, Z6 \
	VPXORQ Z7, Z7, Z7

// func ghashBlocks(pow *[32][2]uint64, y *[2]uint64, p *byte, n int)
TEXT ·ghashBlocks(SB), NOSPLIT, $0-32
	MOVQ pow+0(FP), AX
	MOVQ y+8(FP), BX
	MOVQ p+16(FP), SI
	MOVQ n+24(FP), CX

	VBROADCASTI32X4 ·bswapMask(SB), Z15
	VBROADCASTI32X4 gfPoly<>(SB), Z14
	VMOVDQU         (BX), X0

	CMPQ CX, $16
	JB   singles
	// H^16..H^1 in Z10..Z13, H^32..H^17 in Z20..Z23.
	VMOVDQU64 256(AX), Z10
	VMOVDQU64 320(AX), Z11
	VMOVDQU64 384(AX), Z12
	VMOVDQU64 448(AX), Z13
	FOLDKEYS(Z10, Z11, Z28)
	FOLDKEYS(Z12, Z13, Z29)
	CMPQ      CX, $32
	JB        rounds16
	VMOVDQU64 0(AX), Z20
	VMOVDQU64 64(AX), Z21
	VMOVDQU64 128(AX), Z22
	VMOVDQU64 192(AX), Z23
	FOLDKEYS(Z20, Z21, Z30)
	FOLDKEYS(Z22, Z23, Z31)

rounds32:
	CMPQ      CX, $32
	JB        rounds16
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VMOVDQU64 256(SI), Z24
	VMOVDQU64 320(SI), Z25
	VMOVDQU64 384(SI), Z26
	VMOVDQU64 448(SI), Z27
	VPSHUFB   Z15, Z1, Z1
	VPSHUFB   Z15, Z2, Z2
	VPSHUFB   Z15, Z3, Z3
	VPSHUFB   Z15, Z4, Z4
	VPSHUFB   Z15, Z24, Z24
	VPSHUFB   Z15, Z25, Z25
	VPSHUFB   Z15, Z26, Z26
	VPSHUFB   Z15, Z27, Z27
	CLEARACC
	// The first blocks, which the previous sum goes into, come last.
	MULACC(Z27, Z13, Z29, $0x10)
	MULACC(Z26, Z12, Z29, $0x00)
	MULACC(Z25, Z11, Z28, $0x10)
	MULACC(Z24, Z10, Z28, $0x00)
	MULACC(Z4, Z23, Z31, $0x10)
	MULACC(Z3, Z22, Z31, $0x00)
	MULACC(Z2, Z21, Z30, $0x10)
	VPXORQ    Z0, Z1, Z1
	MULACC(Z1, Z20, Z30, $0x00)
	REDUCE
	ADDQ      $512, SI
	SUBQ      $32, CX
	JMP       rounds32

rounds16:
	CMPQ      CX, $16
	JB        singles
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPSHUFB   Z15, Z1, Z1
	VPSHUFB   Z15, Z2, Z2
	VPSHUFB   Z15, Z3, Z3
	VPSHUFB   Z15, Z4, Z4
	CLEARACC
	MULACC(Z4, Z13, Z29, $0x10)
	MULACC(Z3, Z12, Z29, $0x00)
	MULACC(Z2, Z11, Z28, $0x10)
	VPXORQ    Z0, Z1, Z1
	MULACC(Z1, Z10, Z28, $0x00)
	REDUCE
	ADDQ      $256, SI
	SUBQ      $16, CX
	JMP       rounds16

singles:
	TESTQ CX, CX
	JZ    done
	VMOVDQU 496(AX), X9

single:
	VMOVDQU    (SI), X1
	VPSHUFB    X15, X1, X1
	VPXOR      X0, X1, X1
	VPCLMULQDQ $0x00, X9, X1, X5
	VPCLMULQDQ $0x11, X9, X1, X6
	VPCLMULQDQ $0x01, X9, X1, X7
	VPCLMULQDQ $0x10, X9, X1, X8
	VPXOR      X8, X7, X7
	VPCLMULQDQ $0x01, X5, X14, X8
	VPSHUFD    $0x4e, X5, X5
	VPXOR      X5, X7, X7
	VPXOR      X8, X7, X7
	VPCLMULQDQ $0x01, X7, X14, X8
	VPSHUFD    $0x4e, X7, X7
	VPXOR      X7, X6, X6
	VPXOR      X8, X6, X0
	ADDQ       $16, SI
	DECQ       CX
	JNZ        single

done:
	VMOVDQU X0, (BX)
	VZEROUPPER
	RET
