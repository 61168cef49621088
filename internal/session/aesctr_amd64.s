#include "textflag.h"

// AES-128 in counter mode, GCM's way (a 32-bit big-endian counter in the
// last four bytes of the block), sixteen blocks a round with VAES on four
// ZMM registers, then any blocks left one at a time with AES-NI. The
// round keys are gcm.go's expandKey; the counter block is kept
// byte-reversed (by ghash_amd64.s's bswapMask) so that VPADDD steps its
// low dword, which wraps modulo 2^32 as GCM's inc32 does.

// Lane i of a ZMM register gets +i; then every round adds 4 per register.
DATA ctrLanes<>+0x00(SB)/8, $0
DATA ctrLanes<>+0x08(SB)/8, $0
DATA ctrLanes<>+0x10(SB)/8, $1
DATA ctrLanes<>+0x18(SB)/8, $0
DATA ctrLanes<>+0x20(SB)/8, $2
DATA ctrLanes<>+0x28(SB)/8, $0
DATA ctrLanes<>+0x30(SB)/8, $3
DATA ctrLanes<>+0x38(SB)/8, $0
GLOBL ctrLanes<>(SB), RODATA|NOPTR, $64

DATA ctrFour<>+0x00(SB)/8, $4
DATA ctrFour<>+0x08(SB)/8, $0
GLOBL ctrFour<>(SB), RODATA|NOPTR, $16

DATA ctrOne<>+0x00(SB)/8, $1
DATA ctrOne<>+0x08(SB)/8, $0
GLOBL ctrOne<>(SB), RODATA|NOPTR, $16

#define AESROUNDS(k) \
	VAESENC k, Z1, Z1 \
	VAESENC k, Z2, Z2 \
	VAESENC k, Z3, Z3 \
	VAESENC k, Z4, Z4

// func ctrBlocks(rk *[11][16]byte, ctr *[16]byte, dst, src *byte, n int)
TEXT ·ctrBlocks(SB), NOSPLIT, $0-40
	MOVQ rk+0(FP), AX
	MOVQ ctr+8(FP), BX
	MOVQ dst+16(FP), DI
	MOVQ src+24(FP), SI
	MOVQ n+32(FP), CX

	VBROADCASTI32X4 ·bswapMask(SB), Z15
	VMOVDQU         (BX), X0
	VPSHUFB         X15, X0, X0

	CMPQ CX, $16
	JB   singles
	VBROADCASTI32X4 0(AX), Z20
	VBROADCASTI32X4 16(AX), Z21
	VBROADCASTI32X4 32(AX), Z22
	VBROADCASTI32X4 48(AX), Z23
	VBROADCASTI32X4 64(AX), Z24
	VBROADCASTI32X4 80(AX), Z25
	VBROADCASTI32X4 96(AX), Z26
	VBROADCASTI32X4 112(AX), Z27
	VBROADCASTI32X4 128(AX), Z28
	VBROADCASTI32X4 144(AX), Z29
	VBROADCASTI32X4 160(AX), Z30
	VBROADCASTI32X4 ctrFour<>(SB), Z14
	// Z10..Z13: the (byte-reversed) counters of this round's sixteen blocks.
	VSHUFI64X2      $0, Z0, Z0, Z10
	VPADDD          ctrLanes<>(SB), Z10, Z10
	VPADDD          Z14, Z10, Z11
	VPADDD          Z14, Z11, Z12
	VPADDD          Z14, Z12, Z13
	VPSLLQ          $2, Z14, Z16

rounds:
	CMPQ CX, $16
	JB   tail
	VPSHUFB Z15, Z10, Z1
	VPSHUFB Z15, Z11, Z2
	VPSHUFB Z15, Z12, Z3
	VPSHUFB Z15, Z13, Z4
	VPXORQ  Z20, Z1, Z1
	VPXORQ  Z20, Z2, Z2
	VPXORQ  Z20, Z3, Z3
	VPXORQ  Z20, Z4, Z4
	AESROUNDS(Z21)
	AESROUNDS(Z22)
	AESROUNDS(Z23)
	AESROUNDS(Z24)
	AESROUNDS(Z25)
	AESROUNDS(Z26)
	AESROUNDS(Z27)
	AESROUNDS(Z28)
	AESROUNDS(Z29)
	VAESENCLAST Z30, Z1, Z1
	VAESENCLAST Z30, Z2, Z2
	VAESENCLAST Z30, Z3, Z3
	VAESENCLAST Z30, Z4, Z4
	VPXORQ      0(SI), Z1, Z1
	VPXORQ      64(SI), Z2, Z2
	VPXORQ      128(SI), Z3, Z3
	VPXORQ      192(SI), Z4, Z4
	VMOVDQU64   Z1, 0(DI)
	VMOVDQU64   Z2, 64(DI)
	VMOVDQU64   Z3, 128(DI)
	VMOVDQU64   Z4, 192(DI)
	// Every counter moves on by sixteen.
	VPADDD      Z16, Z10, Z10
	VPADDD      Z16, Z11, Z11
	VPADDD      Z16, Z12, Z12
	VPADDD      Z16, Z13, Z13
	ADDQ        $256, SI
	ADDQ        $256, DI
	SUBQ        $16, CX
	JMP         rounds

tail:
	// The next counter is lane 0 of Z10.
	VMOVDQU64 Z10, Z0
	VZEROUPPER

singles:
	TESTQ   CX, CX
	JZ      done
	VMOVDQU ctrOne<>(SB), X9

single:
	VPSHUFB      X15, X0, X1
	VPXOR        0(AX), X1, X1
	VAESENC      16(AX), X1, X1
	VAESENC      32(AX), X1, X1
	VAESENC      48(AX), X1, X1
	VAESENC      64(AX), X1, X1
	VAESENC      80(AX), X1, X1
	VAESENC      96(AX), X1, X1
	VAESENC      112(AX), X1, X1
	VAESENC      128(AX), X1, X1
	VAESENC      144(AX), X1, X1
	VAESENCLAST  160(AX), X1, X1
	VMOVDQU      (SI), X2
	VPXOR        X2, X1, X1
	VMOVDQU      X1, (DI)
	VPADDD       X9, X0, X0
	ADDQ         $16, SI
	ADDQ         $16, DI
	DECQ         CX
	JNZ          single

done:
	VPSHUFB X15, X0, X0
	VMOVDQU X0, (BX)
	VZEROUPPER
	RET

// func subWord(w uint32) uint32: AES's S-box on each byte of w (the
// SubWord of the key schedule), by AESKEYGENASSIST.
TEXT ·subWord(SB), NOSPLIT, $0-12
	MOVL            w+0(FP), AX
	MOVQ            AX, X0
	PSHUFD          $0, X0, X0
	AESKEYGENASSIST $0, X0, X1
	MOVQ            X1, AX
	MOVL            AX, ret+8(FP)
	RET
