package tokenizer

import (
	"bytes"
	"encoding/json"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The chat's JSON (messages, tools, chat_template_kwargs) is read here by a
// validator, a splitter of validated JSON and a string decoder that accept
// and decode exactly what encoding/json does (FuzzJSONReader holds them to
// it). encoding/json steps a state machine through a function call per
// byte, which for a chat's long system prompt was most of rendering it.

// maxNesting is encoding/json's own limit: deeper input is invalid to it,
// and so it is here.
const maxNesting = 10000

// validJSON reports whether b is one JSON value with only whitespace around
// it, by encoding/json's rules.
func validJSON(b []byte) bool {
	i := skipSpace(b, 0)
	end, ok := validValue(b, i, 1)
	return ok && skipSpace(b, end) == len(b)
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// validValue checks the value at b[i], returning the index just past it.
func validValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return validString(b, i)
	case c == '{' || c == '[':
		return validContainer(b, i, depth)
	case c == 't':
		return validLiteral(b, i, "true")
	case c == 'f':
		return validLiteral(b, i, "false")
	case c == 'n':
		return validLiteral(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return validNumber(b, i)
	}
	return i, false
}

func validContainer(b []byte, i, depth int) (int, bool) {
	if depth > maxNesting {
		return i, false
	}
	object := b[i] == '{'
	closer := byte(']')
	if object {
		closer = '}'
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == closer {
		return i + 1, true
	}
	for {
		var ok bool
		if object {
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
		if i, ok = validValue(b, i, depth+1); !ok {
			return i, false
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return i, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case closer:
			return i + 1, true
		default:
			return i, false
		}
	}
}

// validString checks the string literal at b[i]. Like encoding/json it
// accepts bytes that are not UTF-8; decoding replaces them.
func validString(b []byte, i int) (int, bool) {
	for i++; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			return i + 1, true
		case c < 0x20:
			return i, false
		case c == '\\':
			i++
			if i >= len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= len(b) || hex4(b[i+1:i+5]) < 0 {
					return i, false
				}
				i += 4
			default:
				return i, false
			}
		}
	}
	return i, false
}

func validNumber(b []byte, i int) (int, bool) {
	digits := func(i int) int {
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i
	}
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(i + 1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(i + 1)
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
		j := digits(i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func validLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// hex4 returns the value of four hex digits, or -1.
func hex4(h []byte) rune {
	if len(h) < 4 {
		return -1
	}
	var r rune
	for _, c := range h[:4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c -= 'a' - 10
		case c >= 'A' && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// skipValue returns the index just past the value at b[i] of JSON that
// validJSON accepts; on other input it still stops within b.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for ; i < len(b); i++ {
		switch b[i] {
		case ',', '}', ']', ':', ' ', '\t', '\r', '\n':
			return i
		}
	}
	return i
}

// skipString returns the index just past the string literal at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(b)
}

// decodeString decodes a valid JSON string literal as encoding/json does:
// escapes decoded, a lone or broken surrogate and each byte of invalid
// UTF-8 replaced with U+FFFD. A literal without escapes in valid UTF-8 is
// its own content.
func decodeString(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' {
		return unmarshalString(raw)
	}
	if end, ok := validString(raw, 0); !ok || end != len(raw) {
		return unmarshalString(raw)
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') < 0 && utf8.Valid(in) {
		return string(in), nil
	}
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); {
		c := in[i]
		switch {
		case c == '\\':
			i++
			switch e := in[i]; e {
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r := hex4(in[i+1:])
				i += 5
				if utf16.IsSurrogate(r) {
					var r2 rune = -1
					if i+6 <= len(in) && in[i] == '\\' && in[i+1] == 'u' {
						r2 = hex4(in[i+2:])
					}
					if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
						out = utf8.AppendRune(out, d)
						i += 6
						continue
					}
					r = unicode.ReplacementChar
				}
				out = utf8.AppendRune(out, r)
				continue
			default: // '"', '\\', '/'
				out = append(out, e)
			}
			i++
		case c < utf8.RuneSelf:
			out = append(out, c)
			i++
		default:
			r, n := utf8.DecodeRune(in[i:])
			if r == utf8.RuneError && n == 1 {
				out = utf8.AppendRune(out, utf8.RuneError)
			} else {
				out = append(out, in[i:i+n]...)
			}
			i += n
		}
	}
	return string(out), nil
}

// unmarshalString is decodeString for input that is not one string
// literal: encoding/json says what is wrong.
func unmarshalString(raw []byte) (string, error) {
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}
