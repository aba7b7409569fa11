package openai

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/pkg/jsonscan"
)

// ErrNoModelMember reports a body without a top-level "model" to rewrite.
var ErrNoModelMember = errors.New("the body has no top-level model")

// ReplaceModel returns body with the value of every top-level "model"
// member replaced by model, and every other byte as it was: when the
// gateway rewrites the model a request names, the model server must be
// asked for the model the request was routed for. body must be a JSON
// object (the parsers have validated it); anything else is an error.
func ReplaceModel(body []byte, model string) ([]byte, error) {
	val, err := json.Marshal(model)
	if err != nil {
		return nil, err
	}
	if !jsonscan.Valid(body) {
		return nil, errors.New("rewrite model: the body is not valid JSON")
	}
	i := jsonscan.SkipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, errors.New("rewrite model: the body is not a JSON object")
	}
	var out []byte
	last, found := 0, false
	i = jsonscan.SkipSpace(body, i+1)
	for i < len(body) && body[i] != '}' {
		if body[i] != '"' {
			return nil, fmt.Errorf("rewrite model: malformed object at byte %d", i)
		}
		keyEnd := jsonscan.SkipString(body, i)
		if keyEnd <= i || keyEnd > len(body) {
			return nil, fmt.Errorf("rewrite model: malformed key at byte %d", i)
		}
		key, err := jsonscan.DecodeString(body[i:keyEnd])
		if err != nil {
			return nil, fmt.Errorf("rewrite model: key at byte %d: %w", i, err)
		}
		i = jsonscan.SkipSpace(body, keyEnd)
		if i >= len(body) || body[i] != ':' {
			return nil, fmt.Errorf("rewrite model: no colon at byte %d", i)
		}
		start := jsonscan.SkipSpace(body, i+1)
		end := jsonscan.SkipValue(body, start)
		if end <= start || end > len(body) {
			return nil, fmt.Errorf("rewrite model: malformed value at byte %d", start)
		}
		if key == "model" {
			if out == nil {
				out = make([]byte, 0, len(body)+len(val))
			}
			out = append(append(out, body[last:start]...), val...)
			last, found = end, true
		}
		i = jsonscan.SkipSpace(body, end)
		if i < len(body) && body[i] == ',' {
			i = jsonscan.SkipSpace(body, i+1)
		}
	}
	if i >= len(body) {
		return nil, errors.New("rewrite model: the object is not closed")
	}
	if !found {
		return nil, ErrNoModelMember
	}
	return append(out, body[last:]...), nil
}
