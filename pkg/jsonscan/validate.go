package jsonscan

import "encoding/binary"

// ValidValue returns the index just past the valid JSON value at b[i], or
// false; depth is how many containers hold the value (0 for a whole
// document).
func ValidValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return ValidString(b, i)
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

// validContainer checks the object or array at b[i], which is the depth-th
// container around its members.
func validContainer(b []byte, i, depth int) (int, bool) {
	if depth > MaxDepth {
		return i, false
	}
	isObject := b[i] == '{'
	closer := byte(']')
	if isObject {
		closer = '}'
	}
	i = SkipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, true
	}
	for {
		var ok bool
		if isObject {
			if i >= len(b) || b[i] != '"' {
				return i, false
			}
			if i, ok = ValidString(b, i); !ok {
				return i, false
			}
			i = SkipSpace(b, i)
			if i >= len(b) || b[i] != ':' {
				return i, false
			}
			i = SkipSpace(b, i+1)
		}
		if i, ok = ValidValue(b, i, depth); !ok {
			return i, false
		}
		i = SkipSpace(b, i)
		switch {
		case i < len(b) && b[i] == ',':
			i = SkipSpace(b, i+1)
		case i < len(b) && b[i] == closer:
			return i + 1, true
		default:
			return i, false
		}
	}
}

// ValidString checks the string literal at b[i], which starts with '"',
// returning the index just past it. Bytes that are not valid UTF-8 are
// allowed, as encoding/json allows them (decoding replaces them);
// control characters are not.
func ValidString(b []byte, i int) (int, bool) {
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
