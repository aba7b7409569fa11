package jsonscan

import (
	"bytes"
	"encoding/json"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// DecodeString decodes a string literal of valid JSON exactly as
// encoding/json does: escapes decoded, a lone or broken surrogate and each
// byte of invalid UTF-8 replaced with U+FFFD. A literal without escapes in
// valid UTF-8 is its own content. Where raw is plainly not a literal (no
// quotes around it, a broken escape) the error is encoding/json's. A chat
// message's text nearly always holds a newline or a quote; through
// encoding/json, decoding it cost more than reading the rest of the body.
func DecodeString(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return unmarshalString(raw)
	}
	inner := raw[1 : len(raw)-1]
	esc := bytes.IndexByte(inner, '\\')
	if esc < 0 && utf8.Valid(inner) {
		return string(inner), nil
	}
	out := make([]byte, 0, len(inner))
	for {
		if esc < 0 {
			out = appendUTF8(out, inner)
			return string(out), nil
		}
		out = appendUTF8(out, inner[:esc])
		inner = inner[esc:]
		if len(inner) < 2 {
			return unmarshalString(raw)
		}
		n := 2
		switch c := inner[1]; c {
		case '"', '\\', '/':
			out = append(out, c)
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
			r := hex4(inner[2:])
			if r < 0 {
				return unmarshalString(raw)
			}
			n = 6
			if utf16.IsSurrogate(r) {
				if r2 := hex4After(inner[6:]); r2 >= 0 {
					if d := utf16.DecodeRune(r, r2); d != unicode.ReplacementChar {
						r, n = d, 12
					} else {
						r = unicode.ReplacementChar
					}
				} else {
					r = unicode.ReplacementChar
				}
			}
			out = utf8.AppendRune(out, r)
		default:
			return unmarshalString(raw)
		}
		inner = inner[n:]
		esc = bytes.IndexByte(inner, '\\')
	}
}

// appendUTF8 appends b with each byte of invalid UTF-8 replaced by U+FFFD.
func appendUTF8(out, b []byte) []byte {
	if utf8.Valid(b) {
		return append(out, b...)
	}
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		if r == utf8.RuneError && size == 1 {
			out = utf8.AppendRune(out, unicode.ReplacementChar)
		} else {
			out = append(out, b[:size]...)
		}
		b = b[size:]
	}
	return out
}

// hex4 reads four hex digits; -1 if b does not start with them.
func hex4(b []byte) rune {
	if len(b) < 4 {
		return -1
	}
	var r rune
	for _, c := range b[:4] {
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
		r = r*16 + rune(c)
	}
	return r
}

// hex4After reads a \uXXXX escape at the start of b; -1 if there is none.
func hex4After(b []byte) rune {
	if len(b) < 6 || b[0] != '\\' || b[1] != 'u' {
		return -1
	}
	return hex4(b[2:])
}

// unmarshalString is DecodeString for what is not a literal it can read:
// encoding/json says what is wrong.
func unmarshalString(raw []byte) (string, error) {
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}
