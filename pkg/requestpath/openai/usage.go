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
}

type usageJSON struct {
	PromptTokens        *int `json:"prompt_tokens"`
	CompletionTokens    *int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens *int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// ParseUsage reads the usage of a whole (non-streaming) JSON response body, or
// of one streamed chunk. It reports false when the body has no usage or a
// null one, and an error when the body is not a JSON object or its usage is
// malformed.
func ParseUsage(body []byte) (Usage, bool, error) {
	trimmed := bytes.TrimLeft(body, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return Usage{}, false, fmt.Errorf("%w: the body is %s; expected a JSON object", ErrBadUsage, describe(trimmed))
	}
	var resp struct {
		Usage json.RawMessage `json:"usage"`
	}
	if err := json.Unmarshal(trimmed, &resp); err != nil {
		return Usage{}, false, fmt.Errorf("%w: %v", ErrBadUsage, err)
	}
	if isAbsent(resp.Usage) {
		return Usage{}, false, nil
	}
	if kindOf(resp.Usage) != '{' {
		return Usage{}, false, fmt.Errorf("%w: usage is %s; expected an object", ErrBadUsage, describe(resp.Usage))
	}
	var u usageJSON
	if err := json.Unmarshal(resp.Usage, &u); err != nil {
		return Usage{}, false, fmt.Errorf("%w: usage: %v", ErrBadUsage, err)
	}
	if u.PromptTokens == nil {
		return Usage{}, false, fmt.Errorf("%w: usage.prompt_tokens is missing", ErrBadUsage)
	}
	out := Usage{PromptTokens: *u.PromptTokens}
	if u.CompletionTokens != nil {
		out.CompletionTokens = *u.CompletionTokens
	}
	if u.PromptTokensDetails != nil && u.PromptTokensDetails.CachedTokens != nil {
		out.CachedTokens, out.CachedTokensKnown = *u.PromptTokensDetails.CachedTokens, true
	}
	if out.PromptTokens < 0 || out.CompletionTokens < 0 || out.CachedTokens < 0 {
		return Usage{}, false, fmt.Errorf("%w: a token count is negative (%+v)", ErrBadUsage, out)
	}
	if out.CachedTokens > out.PromptTokens {
		return Usage{}, false, fmt.Errorf("%w: cached_tokens %d exceeds prompt_tokens %d", ErrBadUsage, out.CachedTokens, out.PromptTokens)
	}
	return out, true, nil
}
