//go:build !purego

#include "textflag.h"

// func scanIDsAVX2(b []byte, s int, out []uint32) (k, next int)
//
// The vector form of scanIDBlocks (validate.go), for blocks of 64 bytes.
// Per block, from compares of all its bytes at once (bit j for b[base+j]):
//
//	D  digits, C commas, S spaces, Z '0's
//	starts = D &^ (D<<1)       ends = ^D & (D<<1)
//	stops  = ^(D|C|S)          anything but a digit, comma or space
//	       | C & ((C|S)<<1)    a comma after a comma or a space
//	       | S &^ (C<<1)       a space not just after a comma
//	       | Z & starts & D>>1 a leading zero
//	       | D & D>>1 & ... & D>>8, a run of nine digits
//
// A block starts at a digit, the start of an id, so the ids it reads are
// those that end before its first stop: each has one to eight digits, no
// leading zero, and ends at a comma. They are made numbers four at a
// time: each id's eight bytes, loaded from its start and shifted up so
// that its digits are the top ones (the zeros shifted in read as leading
// zeros), then the digits combined in pairs, fours and eights by
// multiply-adds. The next block starts past the last comma read and the
// spaces after it. The function stops at a block with a stop, one that
// reads no id, or one whose ids, rounded up to four, out has no room for.
//
// Memory: it reads b[base : base+72] for each base <= len(b)-72 (the
// eight bytes past a block are read as the tail of an id's load, or of
// the loads made for the at most three ids past the last one in a group
// of four); it writes out[k : k+4] only when k+4 <= len(out), and what it
// writes past the ids it reads is scratch, overwritten or past the count
// it returns.
// NEXTID takes the next id's start (AX) and end (CX) off the masks in R14
// and R12 and leaves its eight bytes in DX, shifted up by 64 - 8*digits so
// that its digits are on top.
#define NEXTID \
	TZCNTQ R14, AX;         \
	BLSRQ  R14, R14;        \
	TZCNTQ R12, CX;         \
	BLSRQ  R12, R12;        \
	MOVQ   (R11)(AX*1), DX; \
	SUBQ   CX, AX;          \
	LEAQ   64(AX*8), AX;    \
	SHLXQ  AX, DX, DX

TEXT ·scanIDsAVX2(SB), NOSPLIT, $0-72
	MOVQ b_base+0(FP), SI
	MOVQ b_len+8(FP), R8
	MOVQ s+24(FP), BX
	MOVQ out_base+32(FP), DI
	MOVQ out_len+40(FP), R9
	XORQ R10, R10
	SUBQ $72, R8 // R8: the last base a block may start at

	MOVL $0x30, AX
	VMOVD AX, X0
	VPBROADCASTB X0, Y0 // '0'
	MOVL $9, AX
	VMOVD AX, X1
	VPBROADCASTB X1, Y1 // 9
	MOVL $0x2C, AX
	VMOVD AX, X2
	VPBROADCASTB X2, Y2 // ','
	MOVL $0x20, AX
	VMOVD AX, X3
	VPBROADCASTB X3, Y3 // ' '
	MOVL $0x010A, AX
	VMOVD AX, X4
	VPBROADCASTW X4, Y4 // bytes 10, 1: pairs of digits
	MOVL $0x00010064, AX
	VMOVD AX, X5
	VPBROADCASTD X5, Y5 // words 100, 1: fours
	MOVL $0x00012710, AX
	VMOVD AX, X6
	VPBROADCASTD X6, Y6 // words 10000, 1: eights

block:
	CMPQ BX, R8
	JGT  done
	LEAQ (SI)(BX*1), R11 // R11: the block
	CMPB (R11), $0x20
	JNE  masks
	INCQ BX // whitespace after the comma the last block ended at
	JMP  block

masks:
	VMOVDQU (R11), Y7
	VMOVDQU 32(R11), Y8

	// AX = D: a byte is a digit when byte-'0', wrapping, is at most 9.
	VPSUBB    Y0, Y7, Y9
	VPMINUB   Y1, Y9, Y10
	VPCMPEQB  Y10, Y9, Y10
	VPMOVMSKB Y10, AX
	VPSUBB    Y0, Y8, Y9
	VPMINUB   Y1, Y9, Y10
	VPCMPEQB  Y10, Y9, Y10
	VPMOVMSKB Y10, DX
	SHLQ      $32, DX
	ORQ       DX, AX
	TESTQ     $1, AX
	JZ        done // not at an id

	// CX = C, R12 = S
	VPCMPEQB  Y2, Y7, Y9
	VPMOVMSKB Y9, CX
	VPCMPEQB  Y2, Y8, Y9
	VPMOVMSKB Y9, DX
	SHLQ      $32, DX
	ORQ       DX, CX
	VPCMPEQB  Y3, Y7, Y9
	VPMOVMSKB Y9, R12
	VPCMPEQB  Y3, Y8, Y9
	VPMOVMSKB Y9, DX
	SHLQ      $32, DX
	ORQ       DX, R12

	// R15 = stops
	MOVQ AX, R15
	ORQ  CX, R15
	ORQ  R12, R15
	NOTQ R15     // neither digit, comma nor space
	MOVQ CX, R13
	ORQ  R12, R13
	SHLQ $1, R13
	ANDQ CX, R13
	ORQ  R13, R15 // a comma after a comma or a space
	MOVQ CX, R13
	SHLQ $1, R13
	NOTQ R13
	ANDQ R12, R13
	ORQ  R13, R15 // a space not just after a comma

	// CX = Z
	VPCMPEQB  Y0, Y7, Y9
	VPMOVMSKB Y9, CX
	VPCMPEQB  Y0, Y8, Y9
	VPMOVMSKB Y9, DX
	SHLQ      $32, DX
	ORQ       DX, CX

	// R14 = starts, R12 = ends
	MOVQ AX, DX
	SHLQ $1, DX
	MOVQ DX, R14
	NOTQ R14
	ANDQ AX, R14
	MOVQ AX, R12
	NOTQ R12
	ANDQ DX, R12
	MOVQ AX, R13
	SHRQ $1, R13
	ANDQ CX, R13
	ANDQ R14, R13
	ORQ  R13, R15 // a leading zero

	// Runs of nine digits: D & D>>1, then of four, eight, nine.
	MOVQ AX, CX
	SHRQ $1, CX
	ANDQ AX, CX
	MOVQ CX, DX
	SHRQ $2, DX
	ANDQ DX, CX
	MOVQ CX, DX
	SHRQ $4, DX
	ANDQ DX, CX
	MOVQ AX, DX
	SHRQ $8, DX
	ANDQ DX, CX
	ORQ  CX, R15

	// The ids to read end before the first stop.
	TZCNTQ  R15, R15
	BZHIQ   R15, R12, R12
	POPCNTQ R12, R13
	JZ      done
	LEAQ    3(R13), DX
	ANDQ    $-4, DX
	ADDQ    R10, DX
	CMPQ    DX, R9
	JGT     done // no room
	BSRQ    R12, CX // the last id's end
	LEAQ    1(CX), DX
	BZHIQ   DX, R14, R14 // the starts of the ids to read
	LEAQ    1(BX)(CX*1), BX // the next block: past that comma
	ADDQ    R10, R13 // R13: k once the block is read
	CMPQ    R15, $64
	JEQ     group
	MOVQ    $-1, R8 // a stop: this is the last block

group:
	// Four ids. Past the last, starts and ends are empty and TZCNT
	// gives 64: a load of the eight bytes past the block, stored as
	// scratch.
	NEXTID
	VMOVQ   DX, X9
	NEXTID
	VPINSRQ $1, DX, X9, X9
	NEXTID
	VMOVQ   DX, X10
	NEXTID
	VPINSRQ $1, DX, X10, X10

	VINSERTI128 $1, X10, Y9, Y9
	VPSUBUSB    Y0, Y9, Y9  // digit values; the zeros shifted in stay 0
	VPMADDUBSW  Y4, Y9, Y9  // pairs
	VPMADDWD    Y5, Y9, Y9  // fours
	VPACKUSDW   Y9, Y9, Y9
	VPMADDWD    Y6, Y9, Y9  // eights: ids 0 1 0 1 | 2 3 2 3
	VPERMQ      $0x08, Y9, Y9
	VMOVDQU     X9, (DI)(R10*4)
	ADDQ        $4, R10
	CMPQ        R10, R13
	JLT         group
	MOVQ        R13, R10
	JMP         block

done:
	VZEROUPPER
	MOVQ R10, k+56(FP)
	MOVQ BX, next+64(FP)
	RET
