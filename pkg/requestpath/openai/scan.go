package openai

import (
	"bytes"
	"encoding/json"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// The request body is validated once, as splitBody splits it; after that
// its parts are split here without validating them again. Decoding the body into
// nested json.RawMessage values instead rescans each part once per level of
// nesting, which for a long chat prompt means reading its text five or six
// times.

// splitObject returns the members of a JSON object that is known to be
// valid. A key given twice keeps its last value, as with encoding/json.
func splitObject(raw []byte) (map[string]json.RawMessage, error) {
	fields := make(map[string]json.RawMessage, 8)
	i := skipSpace(raw, 0) + 1 // past '{'
	for {
		i = skipSpace(raw, i)
		if i >= len(raw) || raw[i] == '}' {
			return fields, nil
		}
		end := skipValue(raw, i)
		key, err := stringValue(raw[i:end])
		if err != nil {
			return nil, err
		}
		i = skipSpace(raw, end) + 1 // past ':'
		i = skipSpace(raw, i)
		end = skipValue(raw, i)
		fields[key] = raw[i:end:end]
		i = skipSpace(raw, end)
		if i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}

// splitArray returns the elements of a JSON array that is known to be valid.
func splitArray(raw []byte) []json.RawMessage {
	var elems []json.RawMessage
	i := skipSpace(raw, 0) + 1 // past '['
	for {
		i = skipSpace(raw, i)
		if i >= len(raw) || raw[i] == ']' {
			return elems
		}
		end := skipValue(raw, i)
		elems = append(elems, raw[i:end:end])
		i = skipSpace(raw, end)
		if i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}

// skipValue returns the index just past the valid JSON value starting at
// b[i]. On input that is not valid JSON it still stops within b.
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
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return len(b)
	}
	for i < len(b) {
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
		i++
	}
	return i
}

// skipString returns the index just past the string literal at b[i]. The
// closing quote is found with bytes.IndexByte, which for a long chat
// message is several times faster than stopping at every quote and
// backslash: a quote is escaped exactly when an odd number of backslashes
// stands before it.
func skipString(b []byte, i int) int {
	open := i
	for i++; i < len(b); i++ {
		j := bytes.IndexByte(b[i:], '"')
		if j < 0 {
			return len(b)
		}
		i += j
		k := i
		for k > open+1 && b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 {
			return i + 1
		}
	}
	return len(b)
}

// stringValue decodes a valid JSON string literal exactly as encoding/json
// does: escapes decoded, a lone or broken surrogate and each byte of
// invalid UTF-8 replaced with U+FFFD. A literal without escapes in valid
// UTF-8 is its own content. A chat message's text is most of a chat body
// and nearly always holds a newline or a quote; through encoding/json, its
// decoding cost more than everything else ParseRequest does.
func stringValue(raw []byte) (string, error) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return unmarshalStringJSON(raw)
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
			return unmarshalStringJSON(raw)
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
				return unmarshalStringJSON(raw)
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
			return unmarshalStringJSON(raw)
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

func unmarshalStringJSON(raw []byte) (string, error) {
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}
