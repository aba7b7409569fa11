package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// The APIs beyond completions and chat that vLLM serves, as far as a
// router's end-to-end tests need them: Messages (whole and streamed) and
// count_tokens, Responses (whole), generate (token ids in and out) and
// embeddings (a prefill of the input, cached as a causal model pooling
// its last token caches it).

func (s *Server) apiRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/messages", s.messages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.countTokens)
	mux.HandleFunc("POST /v1/responses", s.responses)
	mux.HandleFunc("POST /inference/v1/generate", s.generate)
	mux.HandleFunc("POST /v1/embeddings", s.embeddings)
}

// anthropicError answers in Anthropic's error shape, as vLLM's Messages
// endpoint does.
func anthropicError(w http.ResponseWriter, code int, msg string) {
	typ := "invalid_request_error"
	switch {
	case code == http.StatusNotFound:
		typ = "not_found_error"
	case code >= 500:
		typ = "api_error"
	}
	writeJSON(w, code, map[string]any{"type": "error", "error": map[string]any{"type": typ, "message": msg}})
}

func readBody(r *http.Request) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r.Body, maxBody))
}

// admit checks req as the chat and completions endpoints check theirs and
// submits it; false when it answered the client itself (with fail).
func (s *Server) admit(w http.ResponseWriter, req *genRequest, tokens []uint32, fail func(int, string)) (*Seq, bool) {
	if req.Model != "" && req.Model != s.model() {
		fail(http.StatusNotFound, fmt.Sprintf("the model `%s` does not exist", req.Model))
		return nil, false
	}
	switch Fault(s.fault.Load()) {
	case FaultRefuse:
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = c.Close()
			return nil, false
		}
		fail(http.StatusServiceUnavailable, "the engine is down")
		return nil, false
	case FaultError, FaultFabricate:
		fail(http.StatusInternalServerError, "the engine failed")
		return nil, false
	}
	maxTokens := defaultMaxTokens
	if req.MaxTokens > 0 {
		maxTokens = req.MaxTokens
	}
	switch {
	case len(tokens) == 0:
		fail(http.StatusBadRequest, "the prompt is empty")
		return nil, false
	case len(tokens)+maxTokens > MaxModelLen:
		fail(http.StatusBadRequest, fmt.Sprintf("the prompt (%d tokens) and max_tokens (%d) exceed max_model_len %d", len(tokens), maxTokens, MaxModelLen))
		return nil, false
	}
	seq, err := s.r.Submit(blockpool.Request{Tokens: tokens, Salt: req.CacheSalt}, maxTokens)
	if err != nil {
		fail(http.StatusServiceUnavailable, err.Error())
		return nil, false
	}
	return seq, true
}

// collect waits for seq's output: its text and token count.
func collect(ctx context.Context, seq *Seq) (string, int, error) {
	var text []byte
	n := 0
	for {
		select {
		case <-ctx.Done():
			return "", 0, ctx.Err()
		case t := <-seq.Tokens:
			if t.Err != nil {
				return "", 0, t.Err
			}
			if t.Done {
				return string(text), n, nil
			}
			text = append(text, outputWord(t.Index)...)
			n++
		}
	}
}

// anthropicUsage counts a Messages answer's tokens. The engine reports
// its cache hits as Anthropic does (input_tokens are the prompt tokens not
// read from the cache), so that a client sees them.
func anthropicUsage(seq *Seq, output int) map[string]any {
	return map[string]any{
		"input_tokens": seq.PromptTokens() - seq.Cached(), "cache_read_input_tokens": seq.Cached(), "output_tokens": output,
	}
}

func (s *Server) messages(w http.ResponseWriter, r *http.Request) {
	fail := func(code int, msg string) { anthropicError(w, code, msg) }
	body, err := readBody(r)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	req, _, err := parseMessages(body)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	tokens, err := s.promptTokens(req)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	seq, ok := s.admit(w, req, tokens, fail)
	if !ok {
		return
	}
	id := fmt.Sprintf("msg-%s-%d", s.r.eng.cfg.Pod, s.next.Add(1))
	if req.Stream {
		s.streamMessages(r.Context(), w, id, req.Model, seq)
		return
	}
	text, n, err := collect(r.Context(), seq)
	if err != nil {
		fail(http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "type": "message", "role": "assistant", "model": s.model(),
		"content": []any{map[string]any{"type": "text", "text": text}}, "stop_reason": "max_tokens", "stop_sequence": nil,
		"usage": anthropicUsage(seq, n),
	})
}

// streamMessages streams seq's output as Messages events: message_start
// with the prompt's usage, one text block, message_delta with the final
// usage, message_stop.
func (s *Server) streamMessages(ctx context.Context, w http.ResponseWriter, id, model string, seq *Seq) {
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	event := func(name string, v any) {
		b, _ := json.Marshal(v)
		_, _ = fmt.Fprintf(w, "event: %s\ndata: %s\n\n", name, b)
		if fl != nil {
			fl.Flush()
		}
	}
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-seq.Tokens:
			if t.Err != nil {
				event("error", map[string]any{"type": "error", "error": map[string]any{"type": "api_error", "message": t.Err.Error()}})
				return
			}
			if t.Done {
				event("content_block_stop", map[string]any{"type": "content_block_stop", "index": 0})
				event("message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": "max_tokens"},
					"usage": map[string]any{"output_tokens": n}})
				event("message_stop", map[string]any{"type": "message_stop"})
				return
			}
			if n == 0 {
				event("message_start", map[string]any{"type": "message_start", "message": map[string]any{
					"id": id, "type": "message", "role": "assistant", "model": model, "content": []any{},
					"stop_reason": nil, "usage": anthropicUsage(seq, 0)}})
				event("content_block_start", map[string]any{"type": "content_block_start", "index": 0,
					"content_block": map[string]any{"type": "text", "text": ""}})
			}
			n++
			event("content_block_delta", map[string]any{"type": "content_block_delta", "index": 0,
				"delta": map[string]any{"type": "text_delta", "text": outputWord(t.Index)}})
		}
	}
}

func (s *Server) countTokens(w http.ResponseWriter, r *http.Request) {
	fail := func(code int, msg string) { anthropicError(w, code, msg) }
	body, err := readBody(r)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	req, _, err := parseMessages(body)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	if req.Model != s.model() {
		fail(http.StatusNotFound, fmt.Sprintf("the model `%s` does not exist", req.Model))
		return
	}
	tokens, err := s.promptTokens(req)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"input_tokens": len(tokens),
		"context_management": map[string]any{"original_input_tokens": len(tokens)}})
}

func (s *Server) responses(w http.ResponseWriter, r *http.Request) {
	fail := func(code int, msg string) { writeError(w, code, msg) }
	body, err := readBody(r)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	req, _, err := parseResponses(body)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	if req.Stream {
		fail(http.StatusBadRequest, "streamed responses are not simulated")
		return
	}
	tokens, err := s.promptTokens(req)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	seq, ok := s.admit(w, req, tokens, fail)
	if !ok {
		return
	}
	text, n, err := collect(r.Context(), seq)
	if err != nil {
		fail(http.StatusServiceUnavailable, err.Error())
		return
	}
	id := fmt.Sprintf("resp-%s-%d", s.r.eng.cfg.Pod, s.next.Add(1))
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": "response", "created_at": time.Now().Unix(), "model": s.model(), "status": "completed",
		"output": []any{map[string]any{"type": "message", "id": "msg_" + id, "role": "assistant", "status": "completed",
			"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}},
		"usage": map[string]any{"input_tokens": seq.PromptTokens(), "input_tokens_details": map[string]any{"cached_tokens": seq.Cached()},
			"output_tokens": n, "output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": seq.PromptTokens() + n},
	})
}

// generateRequest is vLLM's /inference/v1/generate request: token ids in.
type generateRequest struct {
	Model          *string         `json:"model"`
	TokenIDs       json.RawMessage `json:"token_ids"`
	SamplingParams *struct {
		MaxTokens *int64 `json:"max_tokens"`
	} `json:"sampling_params"`
	CacheSalt *string `json:"cache_salt"`
}

func (s *Server) generate(w http.ResponseWriter, r *http.Request) {
	fail := func(code int, msg string) { writeError(w, code, msg) }
	body, err := readBody(r)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	var in generateRequest
	if err := json.Unmarshal(body, &in); err != nil {
		fail(http.StatusBadRequest, jsonReason(err))
		return
	}
	if isNull(in.TokenIDs) {
		fail(http.StatusBadRequest, "token_ids is required")
		return
	}
	ids, err := tokenIDs(in.TokenIDs, "token_ids")
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	req := &genRequest{MaxTokens: -1}
	if in.Model != nil {
		req.Model = *in.Model
	}
	if in.SamplingParams != nil && in.SamplingParams.MaxTokens != nil && *in.SamplingParams.MaxTokens > 0 {
		req.MaxTokens = int(*in.SamplingParams.MaxTokens)
	}
	if in.CacheSalt != nil {
		req.CacheSalt = *in.CacheSalt
	}
	seq, ok := s.admit(w, req, ids, fail)
	if !ok {
		return
	}
	var out []uint32
	for {
		t, err := next(r.Context(), seq)
		if err != nil {
			fail(http.StatusServiceUnavailable, err.Error())
			return
		}
		if t.Done {
			break
		}
		out = append(out, wordID(outputWord(t.Index)[1:]))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"request_id": fmt.Sprintf("gen-%s-%d", s.r.eng.cfg.Pod, s.next.Add(1)),
		"choices":    []any{map[string]any{"index": 0, "token_ids": out, "finish_reason": "length"}},
		"usage": map[string]any{"prompt_tokens": seq.PromptTokens(), "completion_tokens": len(out), "total_tokens": seq.PromptTokens() + len(out),
			"prompt_tokens_details": map[string]any{"cached_tokens": seq.Cached()}},
	})
}

func next(ctx context.Context, seq *Seq) (Token, error) {
	select {
	case <-ctx.Done():
		return Token{}, ctx.Err()
	case t := <-seq.Tokens:
		return t, t.Err
	}
}

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	fail := func(code int, msg string) { writeError(w, code, msg) }
	body, err := readBody(r)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	var in struct {
		Model            *string         `json:"model"`
		Input            json.RawMessage `json:"input"`
		AddSpecialTokens *bool           `json:"add_special_tokens"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		fail(http.StatusBadRequest, jsonReason(err))
		return
	}
	// The input as a completion's prompt, which it reads alike.
	req, err := parseRequest(mustJSON(map[string]any{"model": "", "prompt": in.Input, "add_special_tokens": in.AddSpecialTokens}), false)
	if err != nil {
		fail(http.StatusBadRequest, "input: "+err.Error())
		return
	}
	if in.Model != nil {
		req.Model = *in.Model
	}
	tokens, err := s.promptTokens(req)
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	req.MaxTokens = 1
	seq, ok := s.admit(w, req, tokens, fail)
	if !ok {
		return
	}
	if _, _, err := collect(r.Context(), seq); err != nil {
		fail(http.StatusServiceUnavailable, err.Error())
		return
	}
	vec := make([]float64, 8)
	for i, t := range tokens {
		vec[i%len(vec)] += float64(t%97) / 97
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list", "model": s.model(),
		"data":  []any{map[string]any{"object": "embedding", "index": 0, "embedding": vec}},
		"usage": map[string]any{"prompt_tokens": len(tokens), "total_tokens": len(tokens), "prompt_tokens_details": map[string]any{"cached_tokens": seq.Cached()}},
	})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
