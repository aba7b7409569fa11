package tokenizer

import (
	"fmt"
	"unicode/utf8"
)

// byteToRune is the byte-level alphabet: every byte is shown as a printable
// rune, so that BPE vocabularies are strings. Printable Latin-1 bytes stand
// for themselves; the rest are numbered from U+0100 upwards in byte order.
var byteToRune, runeToByte = func() (b2r [256]rune, r2b map[rune]byte) {
	r2b = make(map[rune]byte, 256)
	next := rune(256)
	for b := range 256 {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			b2r[b] = rune(b)
		} else {
			b2r[b] = next
			next++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// byteLevelDecode turns a vocabulary token, spelled in the byte-level
// alphabet, back into the bytes it stands for.
func byteLevelDecode(token string) ([]byte, error) {
	out := make([]byte, 0, len(token))
	for i, r := range token {
		b, ok := runeToByte[r]
		if !ok || (r == utf8.RuneError && token[i:] != "" && !validAt(token, i)) {
			return nil, fmt.Errorf("rune %U is not in the byte-level alphabet", r)
		}
		out = append(out, b)
	}
	return out, nil
}

func validAt(s string, i int) bool {
	r, n := utf8.DecodeRuneInString(s[i:])
	return !(r == utf8.RuneError && n <= 1)
}
