package openai

import (
	"bytes"
	"encoding/json"
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

// stringValue decodes a valid JSON string literal. Literals without escapes
// in valid UTF-8 are their own content; the rest go through encoding/json,
// which decodes escapes and replaces invalid UTF-8 with U+FFFD.
func stringValue(raw []byte) (string, error) {
	if len(raw) >= 2 && raw[0] == '"' {
		inner := raw[1 : len(raw)-1]
		if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
			return string(inner), nil
		}
	}
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err
}
