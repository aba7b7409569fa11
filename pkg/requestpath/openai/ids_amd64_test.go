//go:build !purego && linux

package openai

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// TestScanIDsAVX2KeepsWithinItsSlices runs the vector reader on arrays that
// end where readable memory ends (a page it may not read follows), into a
// buffer between guard values it must not write, and holds what it reads
// to scanIDBlocks.
func TestScanIDsAVX2KeepsWithinItsSlices(t *testing.T) {
	t.Parallel()
	if !useIDsAVX2 {
		t.Skip("this CPU has no vector reader of token ids")
	}
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[page:], syscall.PROT_NONE); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 9))
	read := 0
	fast := []string{",", ", "}
	odd := []string{",  ", " ,", ",\n", "\t,"}
	for c := range 4000 {
		// Arrays mostly in the forms the vector reader reads, with what
		// stops it (other spacing, leading zeros, long ids, anything not
		// an id) now and then: each case has its own rate of it.
		rate := []int{1000000, 200, 30, 5}[rng.IntN(4)]
		sep := fast[rng.IntN(2)]
		var sb strings.Builder
		sb.WriteString(`{"prompt":[`)
		for i := range 1 + rng.IntN(400) {
			if i > 0 {
				if rng.IntN(rate) == 0 {
					sb.WriteString(odd[rng.IntN(len(odd))])
				} else if rng.IntN(30) == 0 {
					sb.WriteString(fast[rng.IntN(2)])
				} else {
					sb.WriteString(sep)
				}
			}
			switch {
			case rng.IntN(rate) == 0:
				sb.WriteString([]string{"-1", "1.5", "]", "x", "\"", ",", "1e5", "01", "00", "123456789", "4294967296"}[rng.IntN(11)])
			case rng.IntN(60) == 0:
				sb.WriteString("0")
			default:
				sb.WriteString(strconv.Itoa(rng.IntN(1 << (1 + rng.IntN(27)))))
			}
		}
		if rng.IntN(2) == 0 {
			sb.WriteString("]}")
		}
		src := sb.String()
		if len(src) > page {
			continue
		}
		b := mem[page-len(src) : page : page] // the last readable bytes
		copy(b, src)
		s := len(`{"prompt":[`)
		if rng.IntN(3) == 0 {
			s = len(b) - 72 - rng.IntN(8) // the last blocks the reader may read
			s = max(s, len(`{"prompt":[`))
		}

		const guard = 0xA5A5A5A5
		room := rng.IntN(500)
		buf := slices.Repeat([]uint32{guard}, room+8)
		out := buf[4 : 4+room : 4+room]
		k, next := scanIDsAVX2(b, s, out)
		for i, v := range buf {
			if (i < 4 || i >= 4+room) && v != guard {
				t.Fatalf("case %d: wrote out[%d] past its %d elements", c, i-4, room)
			}
		}
		want, at := committedIDs(b, s)
		if k > len(want) || !slices.Equal(out[:k], want[:k]) || jsonscan.SkipSpace(b, next) != at[k] {
			t.Fatalf("case %d: read %v and stopped at %d; the ids each followed by a comma are %v, starting at %v\n%s",
				c, out[:k], next, want, at, src)
		}
		read += k
	}
	if read < 50000 {
		t.Fatalf("read %d ids in all; the cases no longer reach the vector reader", read)
	}
}

// committedIDs reads the ids from b[s] on that are each followed by a
// comma, a byte at a time, and where each starts; at[len(ids)] is where the
// first id not so followed starts, or whatever is there instead.
func committedIDs(b []byte, s int) (ids []uint32, at []int) {
	i := jsonscan.SkipSpace(b, s)
	for {
		at = append(at, i)
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' && i-start <= 10 {
			v = v*10 + uint64(b[i]-'0')
			i++
		}
		n := i - start
		if n == 0 || n > 10 || v > 1<<32-1 || (n > 1 && b[start] == '0') {
			return ids, at
		}
		j := jsonscan.SkipSpace(b, i)
		if j >= len(b) || b[j] != ',' {
			return ids, at
		}
		ids = append(ids, uint32(v))
		i = jsonscan.SkipSpace(b, j+1)
	}
}

// FuzzScanIDsAVX2 holds the vector reader to committedIDs on any bytes
// after an array's opening bracket: it reads only ids each followed by a
// comma, in order, stops at one of them (or past the last), and writes
// nothing past out.
func FuzzScanIDsAVX2(f *testing.F) {
	if !useIDsAVX2 {
		f.Skip("this CPU has no vector reader of token ids")
	}
	f.Add([]byte(longIDs(",", "")), 40)
	f.Add([]byte(longIDs(", ", "")+"]}"), 25)
	f.Add([]byte(longIDs(",", "012")), 40)
	f.Add([]byte(longIDs(",", "123456789")), 40)
	f.Add([]byte(longIDs(", ", "7 ")), 40)
	f.Add([]byte(longIDs(",", "-1")), 3)
	f.Fuzz(func(t *testing.T, data []byte, room int) {
		b := append([]byte(`{"prompt":[`), data...)
		s := len(`{"prompt":[`)
		room = min(max(room, 0), 1024)
		const guard = 0xA5A5A5A5
		buf := slices.Repeat([]uint32{guard}, room+8)
		out := buf[4 : 4+room : 4+room]
		k, next := scanIDsAVX2(b, s, out)
		for i, v := range buf {
			if (i < 4 || i >= 4+room) && v != guard {
				t.Fatalf("wrote out[%d] past its %d elements", i-4, room)
			}
		}
		want, at := committedIDs(b, s)
		if k > len(want) || !slices.Equal(out[:k], want[:k]) || jsonscan.SkipSpace(b, next) != at[k] {
			t.Fatalf("read %v and stopped at %d; the ids each followed by a comma are %v, starting at %v", out[:k], next, want, at)
		}
	})
}
