// Package jsonscan reads JSON in place, as encoding/json would read it but
// several times faster: a validator that accepts exactly what json.Valid
// accepts, and readers of validated JSON that skip values, split objects
// and arrays into raw members and decode string literals. The request path
// validates a body once and then reads only the members it needs; the
// tokenizer reads a chat's messages and tools the same way.
// encoding/json steps a state machine through a function call per byte,
// which for a chat's long text costs more than everything else done with it.
//
// The validators (Valid, ValidValue, ValidString) take any input. The
// readers (SkipValue, SkipString, SplitObject, SplitArray, DecodeString)
// are for JSON a validator accepted: on other input they stay within the
// slice and never panic, but what they return means nothing.
//
// It imports nothing of the module, so that any layer may use it.
package jsonscan

import (
	"bytes"
	"encoding/json"
)

// MaxDepth is encoding/json's limit on nesting: deeper input is invalid to
// it, and so it is here.
const MaxDepth = 10000

// Valid reports whether b is one JSON value with only whitespace around
// it, by encoding/json's rules.
func Valid(b []byte) bool {
	end, ok := ValidValue(b, SkipSpace(b, 0), 0)
	return ok && SkipSpace(b, end) == len(b)
}

// SkipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func SkipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
		i++
	}
	return i
}

// SkipValue returns the index just past the value at b[i] of valid JSON.
func SkipValue(b []byte, i int) int {
	if i >= len(b) {
		return len(b)
	}
	switch b[i] {
	case '"':
		return SkipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = SkipString(b, i)
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
		case ',', '}', ']', ':', ' ', '\t', '\r', '\n':
			return i
		}
		i++
	}
	return i
}

// SkipString returns the index just past the string literal at b[i] of
// valid JSON. The closing quote is found with bytes.IndexByte, which for a
// long chat message is several times faster than stopping at every quote
// and backslash: a quote is escaped exactly when an odd number of
// backslashes stands before it.
func SkipString(b []byte, i int) int {
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

// SplitObject returns the members of the valid JSON object raw (whitespace
// around it allowed). A key given twice keeps its last value, as with
// encoding/json. Keys are decoded; values are raw.
func SplitObject(raw []byte) (map[string]json.RawMessage, error) {
	fields := make(map[string]json.RawMessage, 8)
	i := SkipSpace(raw, 0) + 1 // past '{'
	for {
		i = SkipSpace(raw, i)
		if i >= len(raw) || raw[i] == '}' {
			return fields, nil
		}
		end := SkipValue(raw, i)
		key, err := DecodeString(raw[i:end])
		if err != nil {
			return nil, err
		}
		if i = SkipSpace(raw, end); i >= len(raw) {
			return fields, nil
		}
		i = SkipSpace(raw, i+1) // past ':'
		if end = SkipValue(raw, i); end == i {
			return fields, nil // not valid: no value
		}
		fields[key] = raw[i:end:end]
		i = SkipSpace(raw, end)
		if i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}

// SplitArray returns the elements of the valid JSON array raw (whitespace
// around it allowed), each raw.
func SplitArray(raw []byte) []json.RawMessage {
	var elems []json.RawMessage
	i := SkipSpace(raw, 0) + 1 // past '['
	for {
		i = SkipSpace(raw, i)
		if i >= len(raw) || raw[i] == ']' {
			return elems
		}
		end := SkipValue(raw, i)
		if end == i {
			return elems // not valid: no element
		}
		elems = append(elems, raw[i:end:end])
		i = SkipSpace(raw, end)
		if i < len(raw) && raw[i] == ',' {
			i++
		}
	}
}
