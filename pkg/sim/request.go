package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
)

// errBadRequest is wrapped by every error parseRequest returns: the rest
// of the message is the 400 reason the client reads.
var errBadRequest = errors.New("bad request")

// genRequest is a completions or chat completions request as the engine
// reads it, with vLLM's OpenAI-compatible server's rules: its own parser,
// so that it and the EPP's check each other.
type genRequest struct {
	Chat  bool
	Model string
	// Prompt is a completion's text prompt; TokenIDs its prompt given as
	// token ids. A batch of prompts is served as its first, whose tokens
	// are what a router keys it by; the rest are checked all the same.
	Prompt   string
	TokenIDs []uint32
	// Messages is set for a chat.
	Messages         *Chat
	AddSpecialTokens bool
	CacheSalt        string
	// MaxTokens is max_completion_tokens, else max_tokens, else -1.
	MaxTokens    int
	Stream       bool
	IncludeUsage bool
	// KVTransfer is the request's kv_transfer_params (nil: none).
	KVTransfer *KVTransferParams
}

// wireRequest is the JSON of both APIs; what one API does not read is
// ignored, as vLLM ignores unknown fields.
type wireRequest struct {
	Model                *string         `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	PromptEmbeds         json.RawMessage `json:"prompt_embeds"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	ChatTemplate         *string         `json:"chat_template"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	CacheSalt            *string         `json:"cache_salt"`
	MaxTokens            *int64          `json:"max_tokens"`
	MaxCompletionTokens  *int64          `json:"max_completion_tokens"`
	Stream               *bool           `json:"stream"`
	StreamOptions        *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

// parseRequest reads body as a request to the chat API (chat) or the
// completions API. The caller bounds the body's size.
func parseRequest(body []byte, chat bool) (*genRequest, error) {
	var w wireRequest
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRequest, jsonReason(err))
	}
	r := &genRequest{Chat: chat, MaxTokens: -1}
	if w.Model == nil {
		return nil, fmt.Errorf("%w: model is required", errBadRequest)
	}
	r.Model = *w.Model
	if w.CacheSalt != nil {
		if *w.CacheSalt == "" {
			return nil, fmt.Errorf("%w: cache_salt must be a non-empty string when given", errBadRequest)
		}
		r.CacheSalt = *w.CacheSalt
	}
	r.Stream = w.Stream != nil && *w.Stream
	if w.StreamOptions != nil {
		if !r.Stream {
			return nil, fmt.Errorf("%w: stream_options is only allowed when stream is true", errBadRequest)
		}
		r.IncludeUsage = w.StreamOptions.IncludeUsage
	}
	kv, err := ParseKVTransferParams(w.KVTransferParams)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadRequest, err)
	}
	r.KVTransfer = kv
	for _, m := range []struct {
		v    *int64
		name string
	}{{w.MaxCompletionTokens, "max_completion_tokens"}, {w.MaxTokens, "max_tokens"}} {
		if m.v == nil {
			continue
		}
		if *m.v < 1 || *m.v > math.MaxInt32 {
			return nil, fmt.Errorf("%w: %s must be at least 1, got %d", errBadRequest, m.name, *m.v)
		}
		r.MaxTokens = int(*m.v)
		break
	}
	if chat {
		return r, parseChat(r, &w)
	}
	return r, parseCompletion(r, &w)
}

func parseCompletion(r *genRequest, w *wireRequest) error {
	r.AddSpecialTokens = w.AddSpecialTokens == nil || *w.AddSpecialTokens
	if isNull(w.Prompt) {
		if !isNull(w.PromptEmbeds) {
			return fmt.Errorf("%w: prompt_embeds are not supported by this model server", errBadRequest)
		}
		return fmt.Errorf("%w: prompt is required", errBadRequest)
	}
	p := bytes.TrimSpace(w.Prompt)
	if p[0] == '"' {
		return json.Unmarshal(p, &r.Prompt)
	}
	var items []json.RawMessage
	if p[0] != '[' || json.Unmarshal(p, &items) != nil {
		return fmt.Errorf("%w: prompt must be a string, an array of strings, an array of token ids or an array of arrays of token ids", errBadRequest)
	}
	if len(items) == 0 {
		return fmt.Errorf("%w: prompt is empty", errBadRequest)
	}
	switch bytes.TrimSpace(items[0])[0] {
	case '"':
		for i, it := range items {
			var s string
			if err := json.Unmarshal(it, &s); err != nil {
				return fmt.Errorf("%w: prompt[%d] must be a string like the first", errBadRequest, i)
			}
			if i == 0 {
				r.Prompt = s
			}
		}
		return nil
	case '[':
		for i, it := range items {
			ids, err := tokenIDs(it, fmt.Sprintf("prompt[%d]", i))
			if err != nil {
				return err
			}
			if i == 0 {
				r.TokenIDs = ids
			}
		}
		return nil
	}
	ids, err := tokenIDs(p, "prompt")
	r.TokenIDs = ids
	return err
}

// tokenIDs reads a non-empty array of token ids. encoding/json into
// []uint32 would refuse negative and oversized ids with a message naming
// Go types; this one names the field.
func tokenIDs(raw json.RawMessage, name string) ([]uint32, error) {
	var nums []json.Number
	if err := json.Unmarshal(raw, &nums); err != nil {
		return nil, fmt.Errorf("%w: %s must be an array of token ids", errBadRequest, name)
	}
	if len(nums) == 0 {
		return nil, fmt.Errorf("%w: %s is an empty array of token ids", errBadRequest, name)
	}
	ids := make([]uint32, len(nums))
	for i, n := range nums {
		v, err := n.Int64()
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, fmt.Errorf("%w: %s[%d] is %s, not a token id (an integer from 0 to %d)", errBadRequest, name, i, n, uint32(math.MaxUint32))
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

func parseChat(r *genRequest, w *wireRequest) error {
	// Chat templates add the special tokens themselves.
	r.AddSpecialTokens = w.AddSpecialTokens != nil && *w.AddSpecialTokens
	c := &Chat{AddGenerationPrompt: w.AddGenerationPrompt == nil || *w.AddGenerationPrompt}
	c.ContinueFinalMessage = w.ContinueFinalMessage != nil && *w.ContinueFinalMessage
	// As vLLM, only when both are given: add_generation_prompt's default
	// does not clash.
	if w.AddGenerationPrompt != nil && *w.AddGenerationPrompt && c.ContinueFinalMessage {
		return fmt.Errorf("%w: add_generation_prompt and continue_final_message cannot both be true", errBadRequest)
	}
	if w.ChatTemplate != nil {
		c.ChatTemplate = *w.ChatTemplate
	}
	if !isNull(w.ChatTemplateKwargs) {
		if bytes.TrimSpace(w.ChatTemplateKwargs)[0] != '{' {
			return fmt.Errorf("%w: chat_template_kwargs must be an object", errBadRequest)
		}
		c.ChatTemplateKwargs = w.ChatTemplateKwargs
	}
	if !isNull(w.Tools) {
		if bytes.TrimSpace(w.Tools)[0] != '[' {
			return fmt.Errorf("%w: tools must be an array", errBadRequest)
		}
		c.Tools = w.Tools
	}
	if isNull(w.Messages) {
		return fmt.Errorf("%w: messages is required", errBadRequest)
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(w.Messages, &msgs); err != nil {
		return fmt.Errorf("%w: messages must be an array of message objects", errBadRequest)
	}
	if len(msgs) == 0 {
		return fmt.Errorf("%w: messages is empty", errBadRequest)
	}
	for i, m := range msgs {
		if err := checkMessage(m); err != nil {
			return fmt.Errorf("%w: messages[%d]: %v", errBadRequest, i, err)
		}
	}
	c.Messages = w.Messages
	r.Messages = c
	return nil
}

// checkMessage holds a message to what a chat template can render: an
// object with a string role, and content that is a string, null or an
// array of content parts.
func checkMessage(raw json.RawMessage) error {
	var m struct {
		Role    *string         `json:"role"`
		Name    *string         `json:"name"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return errors.New("must be an object with a string role")
	}
	if m.Role == nil {
		return errors.New("role is required")
	}
	if isNull(m.Content) {
		return nil
	}
	switch bytes.TrimSpace(m.Content)[0] {
	case '"':
		return nil
	case '[':
	default:
		return errors.New("content must be a string, null or an array of content parts")
	}
	var parts []json.RawMessage
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return errors.New("content must be an array of content parts")
	}
	for j, p := range parts {
		var part struct {
			Type *string `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(p, &part); err != nil {
			return fmt.Errorf("content[%d] must be an object with a string type", j)
		}
		if part.Type != nil && *part.Type == "text" && part.Text == nil {
			return fmt.Errorf("content[%d] is a text part without a string text", j)
		}
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// jsonReason says what is wrong with a body in the client's terms.
func jsonReason(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return "the body must be a JSON object"
		}
		return fmt.Sprintf("%s must not be %s", te.Field, te.Value)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("the body is not valid JSON (at byte %d): %v", se.Offset, err)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}
