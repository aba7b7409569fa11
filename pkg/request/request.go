// Package request is the parsed form of one inference request, as the request
// path hands it to PrepareData and the scheduler.
package request

import (
	"bytes"
	"encoding/json"
	"time"
)

// API says which of the model server's HTTP APIs a request uses.
type API uint8

// The APIs the request path understands; others are routed without a prefix.
const (
	APIOther API = iota
	APICompletions
	APIChatCompletions
	// APIMessages is Anthropic's Messages API (/v1/messages), which vLLM
	// serves by converting the request into a chat completion.
	APIMessages
	// APIMessagesCountTokens is /v1/messages/count_tokens: the same
	// rendering, no generation.
	APIMessagesCountTokens
	// APIResponses is OpenAI's Responses API (/v1/responses).
	APIResponses
	// APIGenerate is vLLM's /inference/v1/generate: token ids in.
	APIGenerate
	// APIEmbeddings is /v1/embeddings.
	APIEmbeddings
)

func (a API) String() string {
	switch a {
	case APICompletions:
		return "completions"
	case APIChatCompletions:
		return "chat_completions"
	case APIMessages:
		return "messages"
	case APIMessagesCountTokens:
		return "messages_count_tokens"
	case APIResponses:
		return "responses"
	case APIGenerate:
		return "generate"
	case APIEmbeddings:
		return "embeddings"
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

// Clone is c with raw fields of its own. A request's raw fields are the
// body's memory, which the request path reuses once the response is
// handled: whatever reads them later needs a clone.
// A nil Chat's clone is nil.
func (c *Chat) Clone() *Chat {
	if c == nil {
		return nil
	}
	d := *c
	d.Messages = bytes.Clone(c.Messages)
	d.Tools = bytes.Clone(c.Tools)
	d.ChatTemplateKwargs = bytes.Clone(c.ChatTemplateKwargs)
	return &d
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
	// Chat is set for chat completions, and for the APIs the model server
	// renders as one (Messages, Responses): their messages as vLLM
	// converts them, not as the client sent them.
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
	// InexactPrefix, when set, says why the request's prompt cannot be
	// known in full (a Responses request continuing a response the model
	// server stored): it is not tokenized, and its prefix is matched
	// approximately from Prompt.
	InexactPrefix string

	// Headers are the request headers, lower-cased names.
	Headers map[string]string
	// Objective names the request's InferenceObjective
	// (x-gateway-inference-objective), empty for none.
	Objective string
	// Priority comes from the request's objective; below zero is sheddable.
	Priority int
	// SLO is the latency the request asks for: from its x-slo-ttft-ms and
	// x-slo-tpot-ms headers, else its objective's defaults.
	SLO SLO
	// MaxTokens is the output the request asks for at most (max_tokens or
	// max_completion_tokens), 0 when it does not say.
	MaxTokens int
	// Arrival is when the request path began routing it, by the request
	// path's clock.
	Arrival time.Time
	// Stream is true for streaming (SSE) requests.
	Stream bool
	// Body is the request body as received. Its memory (and that of
	// Chat's raw fields, which are in it) may be reused once the response
	// is handled: whatever keeps it longer keeps a copy.
	Body []byte
}

// SLO is a request's latency objective; a zero field means none.
type SLO struct {
	// TTFT bounds the time to the first token, TPOT the mean time per
	// output token after it.
	TTFT, TPOT time.Duration
}

// Response is what the request path learned of a request's answer, for the
// plugins that learn from it.
type Response struct {
	// Endpoint is the ip:port that served it.
	Endpoint string
	Status   int
	// Streamed is true for a streamed (SSE) answer, whose first body byte
	// is its first token; a whole answer's first byte is its end.
	Streamed bool
	// Start is when the request reached the EPP, FirstByte when the answer's
	// first body bytes came back (zero if never), End when it finished.
	Start, FirstByte, End time.Time
	// Usage, when the answer carried it.
	PromptTokens, CompletionTokens, CachedTokens int
	// RequestedModel is the model the client named, before any rewrite.
	RequestedModel string
	// Picked is what PrepareData published on the endpoint that was picked
	// and served it (nil when nothing was, or a fallback served instead).
	Picked Attributes
	// PrefilledBy is the endpoint that prefilled the request when another
	// one decoded it (disaggregated serving): the first token then waited
	// on that prefill and the KV transfer, so it is not Endpoint's TTFT.
	PrefilledBy string
}

// TTFT is the time to the first token, when the answer was streamed, its
// first byte came, and the endpoint prefilled the request itself.
func (r *Response) TTFT() (time.Duration, bool) {
	if !r.Streamed || r.FirstByte.IsZero() || r.Start.IsZero() || r.PrefilledBy != "" {
		return 0, false
	}
	return r.FirstByte.Sub(r.Start), true
}

// TPOT is the mean time per output token after the first, when the answer
// was streamed with usage and more than one token.
func (r *Response) TPOT() (time.Duration, bool) {
	if !r.Streamed || r.FirstByte.IsZero() || r.End.Before(r.FirstByte) || r.CompletionTokens < 2 {
		return 0, false
	}
	return r.End.Sub(r.FirstByte) / time.Duration(r.CompletionTokens-1), true
}

// Attributes is the per-endpoint data PrepareData published for a request.
type Attributes interface {
	Get(key string) (any, bool)
}

// Sheddable reports whether the request may be rejected when the pool is saturated.
func (r *Request) Sheddable() bool { return r.Priority < 0 }

// TokensKnown reports whether the request's token ids are known exactly.
func (r *Request) TokensKnown() bool { return len(r.TokenIDs) > 0 }
