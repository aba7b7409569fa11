// Package request is the parsed form of one inference request, as the request
// path hands it to PrepareData and the scheduler.
package request

import "encoding/json"

// API says which OpenAI-compatible API a request uses.
type API uint8

// The APIs the request path understands; others are routed without a prefix.
const (
	APIOther API = iota
	APICompletions
	APIChatCompletions
)

func (a API) String() string {
	switch a {
	case APICompletions:
		return "completions"
	case APIChatCompletions:
		return "chat_completions"
	}
	return "other"
}

// Chat is what tokenizing a chat request needs, as the client sent it: the
// model server renders the messages with its chat template, so they are kept
// raw and passed on unchanged.
type Chat struct {
	Messages             json.RawMessage
	Tools                json.RawMessage
	ChatTemplate         string
	ChatTemplateKwargs   json.RawMessage
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// AddSpecialTokens is false for chat by default: the template adds them.
	AddSpecialTokens bool
}

// Request is one inference request after parsing (and tokenization, when the
// token ids are known).
type Request struct {
	// ID is the x-request-id, generated when the client sent none.
	ID string
	// API is the OpenAI API the request uses, from its path.
	API API
	// Model is the model name the client asked for (after any rewrite).
	Model string
	// LoRA is the adapter name when Model names a LoRA adapter rather than a
	// base model; empty for the base model.
	LoRA string
	// CacheSalt is vLLM's cache_salt: requests with different salts never share
	// cached blocks.
	CacheSalt string

	// TokenIDs are the prompt's token ids as the model server computes them,
	// when known (given in the request, or from a tokenizer).
	TokenIDs []uint32
	// Chat is set for chat completions.
	Chat *Chat
	// AddSpecialTokens says whether the model server adds special tokens
	// (BOS) when it tokenizes Prompt: true for completions by default.
	AddSpecialTokens bool
	// Prompt is the prompt text (for chat, the rendered or serialised messages),
	// used by approximate matching when token ids are unknown.
	Prompt string
	// NoReproduciblePrefix marks requests whose cached blocks cannot be keyed
	// from text or tokens alone (images and other multimodal parts): they are
	// routed, but never matched against the index.
	NoReproduciblePrefix bool

	// Headers are the request headers, lower-cased names.
	Headers map[string]string
	// Priority comes from the request's objective; below zero is sheddable.
	Priority int
	// Stream is true for streaming (SSE) requests.
	Stream bool
	// Body is the request body as received.
	Body []byte
}

// Sheddable reports whether the request may be rejected when the pool is saturated.
func (r *Request) Sheddable() bool { return r.Priority < 0 }

// TokensKnown reports whether the request's token ids are known exactly.
func (r *Request) TokensKnown() bool { return len(r.TokenIDs) > 0 }
