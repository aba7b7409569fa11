package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites a text segment before pre-tokenization.
type normalizer func(string) string

// parseNormalizer builds the normalizers byte-level models use; others are
// refused at load rather than ignored, since ignoring one would change ids.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var n struct {
		Type        string            `json:"type"`
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &n); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch n.Type {
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Sequence":
		var seq []normalizer
		for _, r := range n.Normalizers {
			f, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if f != nil {
				seq = append(seq, f)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return func(s string) string {
			for _, f := range seq {
				s = f(s)
			}
			return s
		}, nil
	}
	return nil, fmt.Errorf("%w: normalizer %q", ErrUnsupported, n.Type)
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
