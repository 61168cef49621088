#include "textflag.h"

// GHASH over whole 16-byte blocks with AVX-512 carry-less multiplies:
// sixteen blocks (four ZMM registers) per round, multiplied by H^16..H^1,
// summed unreduced and reduced once, then any blocks left one at a time.
// Values are GCM's blocks byte-reflected (PSHUFB), keys pre-multiplied as
// gmac.go's ghashPowers makes them, and the reduction is the two folds by
// x^63 + x^62 + x^57 (0xc2 << 56) that keep GCM's bit order: the same
// arithmetic as gmac.go's mulModel, which the tests hold against
// crypto/cipher's GCM.

DATA bswapMask<>+0x00(SB)/8, $0x08090a0b0c0d0e0f
DATA bswapMask<>+0x08(SB)/8, $0x0001020304050607
GLOBL bswapMask<>(SB), RODATA|NOPTR, $16

DATA gfPoly<>+0x00(SB)/8, $0x0000000000000001
DATA gfPoly<>+0x08(SB)/8, $0xc200000000000000
GLOBL gfPoly<>(SB), RODATA|NOPTR, $16

// func ghashBlocks(pow *[16][2]uint64, y *[2]uint64, p *byte, n int)
TEXT ·ghashBlocks(SB), NOSPLIT, $0-32
	MOVQ pow+0(FP), AX
	MOVQ y+8(FP), BX
	MOVQ p+16(FP), SI
	MOVQ n+24(FP), CX

	VBROADCASTI32X4 bswapMask<>(SB), Z15
	VBROADCASTI32X4 gfPoly<>(SB), Z14
	VMOVDQU (BX), X0

	CMPQ CX, $16
	JB   singles
	VMOVDQU64 0(AX), Z10
	VMOVDQU64 64(AX), Z11
	VMOVDQU64 128(AX), Z12
	VMOVDQU64 192(AX), Z13

rounds:
	CMPQ CX, $16
	JB   singles
	VMOVDQU64 0(SI), Z1
	VMOVDQU64 64(SI), Z2
	VMOVDQU64 128(SI), Z3
	VMOVDQU64 192(SI), Z4
	VPSHUFB   Z15, Z1, Z1
	VPSHUFB   Z15, Z2, Z2
	VPSHUFB   Z15, Z3, Z3
	VPSHUFB   Z15, Z4, Z4

	// LO in Z5, HI in Z6, MI in Z7. The blocks the previous round's sum
	// went into (Z1) are multiplied last: the other products do not wait
	// for that sum.
	VPCLMULQDQ $0x00, Z11, Z2, Z5
	VPCLMULQDQ $0x11, Z11, Z2, Z6
	VPCLMULQDQ $0x01, Z11, Z2, Z7
	VPCLMULQDQ $0x10, Z11, Z2, Z16
	VPXORQ     Z16, Z7, Z7

	VPCLMULQDQ $0x00, Z12, Z3, Z16
	VPCLMULQDQ $0x11, Z12, Z3, Z17
	VPCLMULQDQ $0x01, Z12, Z3, Z18
	VPCLMULQDQ $0x10, Z12, Z3, Z19
	VPXORQ     Z16, Z5, Z5
	VPXORQ     Z17, Z6, Z6
	VPTERNLOGQ $0x96, Z18, Z19, Z7

	VPCLMULQDQ $0x00, Z13, Z4, Z16
	VPCLMULQDQ $0x11, Z13, Z4, Z17
	VPCLMULQDQ $0x01, Z13, Z4, Z18
	VPCLMULQDQ $0x10, Z13, Z4, Z19
	VPXORQ     Z16, Z5, Z5
	VPXORQ     Z17, Z6, Z6
	VPTERNLOGQ $0x96, Z18, Z19, Z7

	VPXORQ     Z0, Z1, Z1
	VPCLMULQDQ $0x00, Z10, Z1, Z16
	VPCLMULQDQ $0x11, Z10, Z1, Z17
	VPCLMULQDQ $0x01, Z10, Z1, Z18
	VPCLMULQDQ $0x10, Z10, Z1, Z19
	VPXORQ     Z16, Z5, Z5
	VPXORQ     Z17, Z6, Z6
	VPTERNLOGQ $0x96, Z18, Z19, Z7

	// Reduce each lane: fold LO into MI, then MI into HI.
	VPCLMULQDQ $0x01, Z5, Z14, Z16
	VPSHUFD    $0x4e, Z5, Z5
	VPTERNLOGQ $0x96, Z5, Z16, Z7
	VPCLMULQDQ $0x01, Z7, Z14, Z16
	VPSHUFD    $0x4e, Z7, Z7
	VPTERNLOGQ $0x96, Z7, Z16, Z6

	// Sum the four lanes into X0 (its upper lanes zeroed by the VEX XOR).
	VEXTRACTI64X4 $1, Z6, Y7
	VPXOR         Y7, Y6, Y6
	VEXTRACTI128  $1, Y6, X7
	VPXOR         X7, X6, X0

	ADDQ $256, SI
	SUBQ $16, CX
	JMP  rounds

singles:
	TESTQ CX, CX
	JZ    done
	VMOVDQU 240(AX), X9

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
