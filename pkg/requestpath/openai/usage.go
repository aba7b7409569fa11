package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// ErrBadUsage is wrapped by errors about a response whose usage cannot be read.
var ErrBadUsage = errors.New("bad usage in response")

// Usage is what a response says the request cost, in tokens.
type Usage struct {
	PromptTokens int
	// CachedTokens are the prompt tokens the model server found in its
	// prefix cache (usage.prompt_tokens_details.cached_tokens; zero when
	// the server does not report them).
	CachedTokens     int
	CompletionTokens int
	// CachedTokensKnown says the server reported CachedTokens at all (vLLM
	// does only with --enable-prompt-tokens-details): a zero it did not
	// report is not a miss.
	CachedTokensKnown bool
	// outputOnly: the usage counted output tokens alone (an Anthropic
	// message_delta), and says nothing of the prompt.
	outputOnly bool
}

type usageJSON struct {
	PromptTokens        *int `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	// The Responses API's names, and Anthropic's.
	InputTokens        *int `json:"input_tokens"`
	OutputTokens       *int `json:"output_tokens"`
	InputTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
}

// ParseUsage reads the usage of a whole (non-streaming) JSON response body, or
// of one streamed event's data, in any of the shapes the request path's
// APIs answer with: OpenAI's (usage.prompt_tokens, and cached tokens in
// prompt_tokens_details), the Responses API's (usage.input_tokens with
// input_tokens_details, at the top or in a response.completed event's
// response), and Anthropic's (usage.input_tokens with
// cache_read_input_tokens, at the top or in a message_start event's
// message). It reports false when the body has no usage or a null one,
// and an error when the body is not a JSON object or its usage is
// malformed.
func ParseUsage(body []byte) (Usage, bool, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Usage{}, false, fmt.Errorf("%w: the body is %s; expected a JSON object", ErrBadUsage, describe(trimmed))
	}
	var resp struct {
		Usage    json.RawMessage `json:"usage"`
		Message  json.RawMessage `json:"message"`
		Response json.RawMessage `json:"response"`
	}
	if err := json.Unmarshal(trimmed, &resp); err != nil {
		return Usage{}, false, fmt.Errorf("%w: %v", ErrBadUsage, err)
	}
	raw := resp.Usage
	for _, inner := range []json.RawMessage{resp.Message, resp.Response} {
		if !isAbsent(raw) || kindOf(inner) != '{' {
			continue
		}
		var nested struct {
			Usage json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal(inner, &nested); err != nil {
			return Usage{}, false, fmt.Errorf("%w: %v", ErrBadUsage, err)
		}
		raw = nested.Usage
	}
	if isAbsent(raw) {
		return Usage{}, false, nil
	}
	if kindOf(raw) != '{' {
		return Usage{}, false, fmt.Errorf("%w: usage is %s; expected an object", ErrBadUsage, describe(raw))
	}
	var u usageJSON
	if err := json.Unmarshal(raw, &u); err != nil {
		return Usage{}, false, fmt.Errorf("%w: usage: %v", ErrBadUsage, err)
	}
	var out Usage
	switch {
	case u.PromptTokens != nil:
		out.PromptTokens = *u.PromptTokens
		if u.CompletionTokens != nil {
			out.CompletionTokens = *u.CompletionTokens
		}
		if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
			out.CachedTokens, out.CachedTokensKnown = *u.PromptTokensDetails.CachedTokens, true
		}
	case u.InputTokensDetails != nil:
		// The Responses API: input_tokens counts the cached ones too.
		if u.InputTokens == nil {
			return Usage{}, false, fmt.Errorf("%w: usage.input_tokens is missing", ErrBadUsage)
		}
		out.PromptTokens = *u.InputTokens
		if u.OutputTokens != nil {
			out.CompletionTokens = *u.OutputTokens
		}
		if u.InputTokensDetails.CachedTokens != nil {
			out.CachedTokens, out.CachedTokensKnown = *u.InputTokensDetails.CachedTokens, true
		}
	case u.InputTokens != nil || u.OutputTokens != nil:
		// Anthropic's: input_tokens are the prompt tokens neither read
		// from nor written to the cache. vLLM reports no cache counts
		// there, and its input_tokens are the whole prompt. A
		// message_delta may carry output_tokens alone.
		for _, n := range []*int{u.InputTokens, u.CacheReadInputTokens, u.CacheCreationInputTokens} {
			if n != nil {
				out.PromptTokens += *n
			}
		}
		out.outputOnly = u.InputTokens == nil
		if u.OutputTokens != nil {
			out.CompletionTokens = *u.OutputTokens
		}
		if u.CacheReadInputTokens != nil {
			out.CachedTokens, out.CachedTokensKnown = *u.CacheReadInputTokens, true
		}
	default:
		return Usage{}, false, fmt.Errorf("%w: usage.prompt_tokens is missing", ErrBadUsage)
	}
	if out.PromptTokens < 0 || out.CompletionTokens < 0 || out.CachedTokens < 0 {
		return Usage{}, false, fmt.Errorf("%w: a token count is negative (%+v)", ErrBadUsage, out)
	}
	if out.CachedTokens > out.PromptTokens && !out.outputOnly {
		return Usage{}, false, fmt.Errorf("%w: cached_tokens %d exceeds prompt_tokens %d", ErrBadUsage, out.CachedTokens, out.PromptTokens)
	}
	return out, true, nil
}

// merge is u, a later event's usage, completed by earlier, the usage of an
// earlier event of the same stream: an Anthropic message_delta may count
// the output alone, the prompt having been counted in message_start.
func (u Usage) merge(earlier Usage) Usage {
	if !u.outputOnly {
		return u
	}
	u.PromptTokens, u.CachedTokens, u.CachedTokensKnown = earlier.PromptTokens, earlier.CachedTokens, earlier.CachedTokensKnown
	u.outputOnly = earlier.outputOnly
	return u
}
