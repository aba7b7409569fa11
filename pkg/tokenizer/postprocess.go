package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor says which ids surround a single sequence when special
// tokens are asked for: Llama-style TemplateProcessing puts BOS first,
// byte-level post-processors add nothing.
type postProcessor struct {
	prefix, suffix []uint32
}

func (p postProcessor) apply(ids []uint32) []uint32 {
	if len(p.prefix) == 0 && len(p.suffix) == 0 {
		return ids
	}
	out := make([]uint32, 0, len(p.prefix)+len(ids)+len(p.suffix))
	out = append(out, p.prefix...)
	out = append(out, ids...)
	return append(out, p.suffix...)
}

func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	var p postProcessor
	if isNull(raw) {
		return p, nil
	}
	var pp struct {
		Type   string `json:"type"`
		Single []struct {
			SpecialToken *struct {
				ID string `json:"id"`
			} `json:"SpecialToken"`
			Sequence *struct {
				ID string `json:"id"`
			} `json:"Sequence"`
		} `json:"single"`
		SpecialTokens map[string]struct {
			IDs []uint32 `json:"ids"`
		} `json:"special_tokens"`
		Processors []json.RawMessage `json:"processors"`
		// BertProcessing and RobertaProcessing: [token, id].
		Cls []json.RawMessage `json:"cls"`
		Sep []json.RawMessage `json:"sep"`
	}
	if err := json.Unmarshal(raw, &pp); err != nil {
		return p, fmt.Errorf("post_processor: %w", err)
	}
	switch pp.Type {
	case "ByteLevel":
		return p, nil
	case "TemplateProcessing":
		seen := false
		for _, piece := range pp.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return p, fmt.Errorf("%w: post_processor repeats the sequence", ErrUnsupported)
				}
				seen = true
			case piece.SpecialToken != nil:
				st, ok := pp.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return p, fmt.Errorf("post_processor: special token %q has no ids", piece.SpecialToken.ID)
				}
				if seen {
					p.suffix = append(p.suffix, st.IDs...)
				} else {
					p.prefix = append(p.prefix, st.IDs...)
				}
			}
		}
		if !seen {
			return p, fmt.Errorf("%w: post_processor template without the sequence", ErrUnsupported)
		}
		return p, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenPairID(pp.Cls)
		if err != nil {
			return p, fmt.Errorf("post_processor cls: %w", err)
		}
		sep, err := tokenPairID(pp.Sep)
		if err != nil {
			return p, fmt.Errorf("post_processor sep: %w", err)
		}
		return postProcessor{prefix: []uint32{cls}, suffix: []uint32{sep}}, nil
	case "Sequence":
		for _, r := range pp.Processors {
			q, err := parsePostProcessor(r)
			if err != nil {
				return p, err
			}
			p.prefix = append(q.prefix, p.prefix...)
			p.suffix = append(p.suffix, q.suffix...)
		}
		return p, nil
	}
	return p, fmt.Errorf("%w: post_processor %q", ErrUnsupported, pp.Type)
}

func tokenPairID(pair []json.RawMessage) (uint32, error) {
	var id uint32
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id], got %d elements", len(pair))
	}
	if err := json.Unmarshal(pair[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}
