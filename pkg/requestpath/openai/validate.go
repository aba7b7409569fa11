package openai

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"math/bits"
	"slices"
)

// The body is validated in the same pass that splits it into members, by
// the checker below, which accepts exactly what encoding/json accepts
// (FuzzSplitObject holds the two together). A separate json.Valid pass
// cost more than everything else ParseRequest does: it steps a state
// machine through a function call per byte, over a body that for an
// 8k-token prompt is 50 KB of digits and commas.

// maxDepth is encoding/json's limit on nesting; deeper input is invalid to
// it, and so it is here.
const maxDepth = 10000

// body is a request body split into its members.
type body struct {
	fields map[string]json.RawMessage
	// promptIDs is the prompt member read as token ids, set only when the
	// prompt is a flat array of them. The ids are read while validating,
	// so that the body's largest part is scanned once, not twice.
	promptIDs []uint32
}

// splitBody checks that b, which starts with '{', is exactly one valid JSON
// object (with only whitespace after it) and returns its members. A key
// given twice keeps its last value, as with encoding/json. ok is false when
// b is not valid JSON. A prompt of token ids is read into idBuf's backing
// array when it is large enough (see ParseRequestInto).
func splitBody(b []byte, idBuf []uint32) (out body, ok bool, err error) {
	out.fields = make(map[string]json.RawMessage, 8)
	i := skipSpace(b, 1)
	if i < len(b) && b[i] == '}' {
		return out, skipSpace(b, i+1) == len(b), nil
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return out, false, nil
		}
		keyEnd, ok := validString(b, i)
		if !ok {
			return out, false, nil
		}
		key, err := stringValue(b[i:keyEnd])
		if err != nil {
			return out, false, err
		}
		i = skipSpace(b, keyEnd)
		if i >= len(b) || b[i] != ':' {
			return out, false, nil
		}
		i = skipSpace(b, i+1)
		start := i
		var ids []uint32
		if key == "prompt" && i < len(b) && b[i] == '[' {
			ids, i, ok = scanTokenIDs(b, i, idBuf)
		} else {
			ok = false
		}
		if !ok {
			// Not a flat array of token ids: validated as any value, and
			// read later by whatever reads the member.
			if i, ok = validValue(b, start, 1); !ok {
				return out, false, nil
			}
		}
		out.fields[key] = b[start:i:i]
		if key == "prompt" {
			out.promptIDs = ids
		}
		i = skipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == '}':
			return out, skipSpace(b, i+1) == len(b), nil
		default:
			return out, false, nil
		}
	}
}

// scanTokenIDs reads the array at b[i] when it is valid JSON made only of
// integers from 0 to MaxUint32, and returns the ids and the index just
// past the array. ok is false for anything else, empty arrays included; the
// caller then validates the array as any value, and parseTokenIDs says what
// is wrong with it. The ids are appended to dst[:0], which is grown if it is
// too small.
func scanTokenIDs(b []byte, i int, dst []uint32) (ids []uint32, end int, ok bool) {
	i = skipSpace(b, i+1)
	if i >= len(b) || b[i] == ']' {
		return nil, i, false
	}
	// A flat array ends at the first ']', and its commas then give the
	// count exactly; counting them is far cheaper than growing the slice.
	last := bytes.IndexByte(b[i:], ']')
	if last < 0 {
		return nil, i, false
	}
	ids = slices.Grow(dst[:0], bytes.Count(b[i:i+last], []byte{','})+1)
	for {
		start := i
		var v uint64
		// This loop is where ParseRequest spends most of its time. Ids of
		// up to seven digits, which is every vocabulary's, are read eight
		// bytes at a time; longer ones, and those near the end of the
		// body, a digit at a time. The range is checked once per id, not
		// per digit: ten digits cannot overflow a uint64.
		if i+8 <= len(b) {
			if w, n := digits8(binary.LittleEndian.Uint64(b[i:])); n < 8 {
				v, i = w, i+n
			}
		}
		if i == start {
			for i < len(b) && b[i]-'0' <= 9 {
				v = v*10 + uint64(b[i]-'0')
				i++
			}
		}
		if n := i - start; n == 0 || n > 10 || v > math.MaxUint32 || (b[start] == '0' && n > 1) {
			return nil, i, false
		}
		ids = append(ids, uint32(v))
		if i < len(b) && b[i] == ',' && i+1 < len(b) && b[i+1]-'0' <= 9 {
			i++ // compact JSON: straight on to the next id
			continue
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return nil, i, false
		}
		switch b[i] {
		case ']':
			return ids, i + 1, true
		case ',':
			i = skipSpace(b, i+1)
		default:
			// A fraction, an exponent or anything else.
			return nil, i, false
		}
	}
}

// digits8 reads the decimal digits that start the 8 bytes in x (loaded
// little-endian, so the first byte is the lowest) and returns their value
// and count; a count of 8 means the number may go on, and v is then not set.
func digits8(x uint64) (v uint64, n int) {
	const ones = 0x0101010101010101
	// A byte is a digit when its high nibble is 3 both as it is and after
	// adding 6 (which carries 0x3A-0x3F into 0x4_). A carry out of a byte
	// of 0xFA or more can only disturb the bytes after it, which come
	// after a non-digit and are not read.
	nonDigit := (x&(0xF0*ones) ^ 0x30*ones) | ((x+0x06*ones)&(0xF0*ones) ^ 0x30*ones)
	n = bits.TrailingZeros64(nonDigit) / 8
	if n == 0 || n == 8 {
		return 0, n
	}
	// Move the n digits to the top bytes, so that the zero bytes below act
	// as leading zeros, then combine neighbours: pairs, fours, eight.
	shift := uint(8-n) * 8
	x = x<<shift - (0x30*ones)<<shift
	x = (x*10 + x>>8) & 0x00FF00FF00FF00FF
	x = (x*100 + x>>16) & 0x0000FFFF0000FFFF
	x = (x*10000 + x>>32) & 0xFFFFFFFF
	return x, n
}

// validValue returns the index just past the valid JSON value at b[i],
// or false; depth is how many containers hold the value.
func validValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return validString(b, i)
	case c == '{', c == '[':
		return validContainer(b, i, depth+1)
	case c == '-' || (c >= '0' && c <= '9'):
		return validNumber(b, i)
	case c == 't':
		return validLiteral(b, i, "true")
	case c == 'f':
		return validLiteral(b, i, "false")
	case c == 'n':
		return validLiteral(b, i, "null")
	}
	return i, false
}

// validContainer checks the object or array at b[i].
func validContainer(b []byte, i, depth int) (int, bool) {
	if depth > maxDepth {
		return i, false
	}
	isObject := b[i] == '{'
	closer := byte(']')
	if isObject {
		closer = '}'
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, true
	}
	for {
		var ok bool
		if isObject {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			if i, ok = validString(b, i); !ok {
				return i, false
			}
			i = skipSpace(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, false
			}
			i = skipSpace(b, i+1)
		}
		if i, ok = validValue(b, i, depth); !ok {
			return i, false
		}
		i = skipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i = skipSpace(b, i+1)
		case i < len(b) && b[i] == closer:
			return i + 1, true
		default:
			return i, false
		}
	}
}

// validString checks the string literal at b[i]. Bytes that are not valid
// UTF-8 are allowed, as encoding/json allows them; control characters are
// not.
func validString(b []byte, i int) (int, bool) {
	for i++; i < len(b); {
		// Eight bytes at a time past the plain ones: a chat message is
		// tens of kilobytes of text with few quotes or backslashes.
		for i+8 <= len(b) && plain8(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		if i >= len(b) {
			break
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c == '\\':
			if i+1 >= len(b) {
				return i, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex(b[i+2]) || !isHex(b[i+3]) || !isHex(b[i+4]) || !isHex(b[i+5]) {
					return i, false
				}
				i += 6
			default:
				return i, false
			}
		case c < 0x20:
			return i, false
		default:
			i++
		}
	}
	return i, false
}

// plain8 reports whether none of the eight bytes in x is a quote, a
// backslash or a control character (below 0x20): none of them ends or
// escapes a string, or makes it invalid.
func plain8(x uint64) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	// A byte b has its high bit set in (b - n) &^ b only when b < n (for
	// b < 0x80); a byte is zero after the XOR exactly where it matched.
	below := (x - ones*0x20) &^ x
	quote := x ^ (ones * '"')
	slash := x ^ (ones * '\\')
	return (below|(quote-ones)&^quote|(slash-ones)&^slash)&highs == 0
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

// validNumber checks the number at b[i]: an optional minus, an integer part
// without leading zeros, an optional fraction and an optional exponent.
// What follows it is for the caller to check.
func validNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = skipDigits(b, i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := skipDigits(b, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := skipDigits(b, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func skipDigits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

func validLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i >= len(lit) && string(b[i:i+len(lit)]) == lit {
		return i + len(lit), true
	}
	return i, false
}
