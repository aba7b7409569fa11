package openai

import (
	"encoding/binary"
	"encoding/json"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestNonDigits8MarksEveryByteThatIsNotADigit(t *testing.T) {
	t.Parallel()
	// Every byte value in every position, beside neighbours that carry or
	// borrow the most (0x00, 0xFF) and digits.
	for _, fill := range []byte{0x00, 0xFF, '0', '9', ',', 0x7F, 0x80} {
		for pos := range 8 {
			for c := range 256 {
				var buf [8]byte
				for i := range buf {
					buf[i] = fill
				}
				buf[pos] = byte(c)
				var want uint64
				for i, b := range buf {
					if b < '0' || b > '9' {
						want |= 1 << i
					}
				}
				if got := nonDigits8(binary.LittleEndian.Uint64(buf[:])); got != want {
					t.Fatalf("%q: marks %08b, want %08b", buf, got, want)
				}
			}
		}
	}
}

func TestCombine8ReadsTheDigitsOfAnIdOfUpToEightDigits(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(8, 8))
	for range 20000 {
		n := 1 + rng.IntN(8)
		var buf [8]byte
		for i := range buf {
			buf[i] = byte(rng.IntN(256)) // what comes before the id
		}
		for i := 8 - n; i < 8; i++ {
			buf[i] = '0' + byte(rng.IntN(10))
		}
		d := idDigits[n]
		got := combine8(binary.LittleEndian.Uint64(buf[:])&d.mask ^ d.zeros)
		want, err := strconv.ParseUint(string(buf[8-n:]), 10, 64)
		if err != nil || got != want {
			t.Fatalf("%q, %d digits: value %d, want %d", buf, n, got, want)
		}
		if leadingZero := n > 1 && buf[8-n] == '0'; leadingZero != (got < d.least) {
			t.Fatalf("%q, %d digits: below the least of %d digits: %v, want %v", buf, n, n, got < d.least, leadingZero)
		}
	}
}

// TestScanTokenIDsReadsLongArraysAsParseTokenIDsDoes holds the reader of
// token-id prompts, whose fast path only runs on arrays longer than 64
// bytes, to parseTokenIDs and json.Valid: arrays of up to some 20,000 ids in
// each form the fast path reads or leaves to the slow one (spacing, long
// ids), with one fault (a leading zero, a sign, a fraction, a missing id,
// an id too large) at a random place, read into a dirty buffer that is
// sometimes too small.
func TestScanTokenIDsReadsLongArraysAsParseTokenIDsDoes(t *testing.T) {
	// Not parallel: with the CPU's vector reader and without it.
	have := useIDsAVX2
	defer func() { useIDsAVX2 = have }()
	for _, vector := range []bool{false, true} {
		if vector && !have {
			t.Log("this CPU has no vector reader of token ids")
			continue
		}
		useIDsAVX2 = vector
		readsLongArraysAsParseTokenIDsDoes(t)
	}
}

func readsLongArraysAsParseTokenIDsDoes(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 4))
	seps := []string{",", ",", ",", ", ", ", ", " ,", ",\n  ", ",  ", "\t,"}
	faults := []string{"", "", "0", "01", "00", "-1", "-0", "1.5", "2e3", "", "4294967295", "4294967296", "12345678901", "null", "\"7\"", "[1]"}
	for c := range 3000 {
		var arr strings.Builder
		arr.WriteString("[")
		if rng.IntN(4) == 0 {
			arr.WriteString(" ")
		}
		n := 1 + rng.IntN(300)
		if c%100 == 0 {
			n = 3000 + rng.IntN(20000) // longer than the vector reader's 16 KiB pieces
		}
		fault := rng.IntN(n + n/2) // often none
		sep := seps[rng.IntN(len(seps))]
		for i := range n {
			if i > 0 {
				if rng.IntN(20) == 0 {
					arr.WriteString(seps[rng.IntN(len(seps))])
				} else {
					arr.WriteString(sep)
				}
			}
			if i == fault {
				arr.WriteString(faults[rng.IntN(len(faults))])
				continue
			}
			digits := 1 + rng.IntN(7)
			if rng.IntN(50) == 0 {
				digits = 8 + rng.IntN(3)
			}
			v := rng.Uint64N(pow10(digits))
			if digits == 10 {
				v = rng.Uint64N(math.MaxUint32 + 1)
			}
			arr.WriteString(strconv.FormatUint(v, 10))
		}
		arr.WriteString([]string{"]", " ]", "\n]"}[rng.IntN(3)])
		body := []byte(`{"model":"m","prompt":` + arr.String() + []string{`}`, `,"max_tokens":1}`}[rng.IntN(2)])

		want, wantErr := parseTokenIDs(json.RawMessage(arr.String()), "prompt")
		wantOK := json.Valid(body) && wantErr == nil
		dst := slices.Repeat([]uint32{0xdeadbeef}, 2+rng.IntN(2*n))[:rng.IntN(3)]
		obj, ok, err := splitBody(body, dst)
		if err != nil || ok != json.Valid(body) {
			t.Fatalf("case %d: splitBody ok %v, %v; json.Valid says %v\n%s", c, ok, err, json.Valid(body), body)
		}
		if (obj.promptIDs != nil) != wantOK || (wantOK && !slices.Equal(obj.promptIDs, want)) {
			t.Fatalf("case %d: read %v; parseTokenIDs reads %v, %v\n%s", c, obj.promptIDs, want, wantErr, body)
		}
	}
}

func pow10(n int) uint64 {
	v := uint64(1)
	for range n {
		v *= 10
	}
	return v
}
