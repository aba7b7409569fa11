//go:build !purego

package openai

import "golang.org/x/sys/cpu"

// useIDsAVX2 is whether token ids are read with scanIDsAVX2 before
// scanIDBlocks; tests turn it off to hold the two to each other.
var useIDsAVX2 = cpu.X86.HasAVX2 && cpu.X86.HasBMI1 && cpu.X86.HasBMI2 && cpu.X86.HasPOPCNT

// scanIDsAVX2 reads ids as scanIDBlocks does, 64 bytes at a time with
// vector instructions, and stops earlier: at the block with the array's
// end or anything else scanIDBlocks would stop at, in the last 72 bytes of
// b, or when out has little room left. It writes scratch into out past the
// ids it reads. The bounds it keeps to are argued in ids_amd64.s.
//
//go:noescape
func scanIDsAVX2(b []byte, s int, out []uint32) (k, next int)
