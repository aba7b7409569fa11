package openai

// What the request path's other readers of OpenAI JSON share with
// ParseRequest: the one-pass validator, the splitter of validated JSON and
// the string decoder, each agreeing with encoding/json (FuzzSplitObject,
// FuzzStringValue) and several times faster than it.

// ValidJSON reports whether b is one JSON value with only whitespace
// around it, by encoding/json's rules.
func ValidJSON(b []byte) bool {
	i := skipSpace(b, 0)
	if i == len(b) {
		return false
	}
	end, ok := validValue(b, i, 1)
	return ok && skipSpace(b, end) == len(b)
}

// SkipSpace returns the index of the first byte at or after i in b that is
// not JSON whitespace.
func SkipSpace(b []byte, i int) int { return skipSpace(b, i) }

// SkipValue returns the index just past the JSON value at b[i], in JSON
// that ValidJSON accepts.
func SkipValue(b []byte, i int) int { return skipValue(b, i) }

// DecodeString decodes a JSON string literal as encoding/json does.
func DecodeString(raw []byte) (string, error) { return stringValue(raw) }
