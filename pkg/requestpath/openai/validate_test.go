package openai

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestDigits8ReadsLeadingDigits(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8, 8))
	tails := []byte{',', ']', ' ', ':', '/', '.', 'e', 0x00, 0xFA, 0xFF, '9' + 1, '0' - 1}
	for range 20000 {
		var buf [8]byte
		n := rng.IntN(9)
		for i := range n {
			buf[i] = '0' + byte(rng.IntN(10))
		}
		for i := n; i < 8; i++ {
			if i == n || rng.IntN(2) == 0 {
				buf[i] = tails[rng.IntN(len(tails))]
			} else {
				buf[i] = byte(rng.IntN(256))
			}
		}
		v, got := digits8(binary.LittleEndian.Uint64(buf[:]))
		if got != n {
			t.Fatalf("%q: %d digits, want %d", buf, got, n)
		}
		if n == 0 || n == 8 {
			continue
		}
		want, err := strconv.ParseUint(string(buf[:n]), 10, 64)
		if err != nil || v != want {
			t.Fatalf("%q: value %d, want %d", buf, v, want)
		}
	}
}
