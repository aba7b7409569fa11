package sim

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// FuzzServerRequest sends arbitrary bodies to the engine's request
// endpoints: every answer is a success or a clear client error, never a
// panic or a server error.
func FuzzServerRequest(f *testing.F) {
	seeds := []struct{ path, body string }{
		{"/v1/completions", `{"model":"m","prompt":"a b c","max_tokens":2}`},
		{"/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`},
		{"/v1/completions", `{"model":"m","prompt":"x","max_tokens":-1}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3}`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"stream":true}`},
		{"/tokenize", `{"model":"m","prompt":"a b"}`},
		{"/tokenize", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{"/tokenize", `{"prompt":null}`},
		{"/v1/completions", `[]`},
		{"/v1/completions", `{"model":"m","prompt":"a b c d e","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`},
		{"/kv_transfer/pull", `{"remote_request_id":"p-xfer-1","blocks":1}`},
		{"/kv_transfer/abort", `{"remote_request_id":"p-xfer-1"}`},
		{"/v1/completions", `{"model":"m","prompt":"a b","kv_transfer_params":{"do_remote_prefill":true,"remote_request_id":"r","remote_host":"127.0.0.1","remote_port":1}}`},
		{"/v1/messages", `{"model":"m","max_tokens":2,"system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"sys"}],"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"ok"}]}]}],"tools":[{"name":"f","input_schema":{}}]}`},
		{"/v1/messages", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}],"stream":true}`},
		{"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`},
		{"/v1/responses", `{"model":"m","instructions":"be brief","input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"ok"}],"tools":[{"type":"function","name":"f","parameters":{}}],"max_output_tokens":2}`},
		{"/v1/responses", `{"input":[{"type":"reasoning","summary":[{"type":"summary_text","text":"s"}]},{"type":"message","role":"assistant","status":"incomplete","content":[{"type":"output_text","text":"so"}]}]}`},
		{"/inference/v1/generate", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":2}}`},
		{"/v1/embeddings", `{"model":"m","input":"a b c"}`},
		{"/v1/embeddings", `{"model":"m","input":[[1,2],[3]]}`},
	}
	for _, s := range seeds {
		f.Add(s.path, s.body)
	}
	// Holds for remote decodes no one pulls end soon, so that they never
	// fill the pool over a long run.
	eng := NewEngine(EngineConfig{Pod: "p", Address: "127.0.0.1:1", Model: "m", Transfer: Transfer{HoldTimeout: 20 * time.Millisecond},
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 4096, Seed: 1}}, nil)
	// A zero timing model: every step is instant, so long outputs cost
	// only their tokens.
	r := NewCore(eng, Timing{MaxSeqs: 8})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	f.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			f.Error(err)
		}
	})
	h := NewServer(r, nil).Handler()
	f.Fuzz(func(t *testing.T, path, body string) {
		switch path {
		case "/v1/completions", "/v1/chat/completions", "/tokenize", "/kv_transfer/pull", "/kv_transfer/abort", "/v1/messages", "/v1/messages/count_tokens",
			"/v1/responses", "/inference/v1/generate", "/v1/embeddings":
		default:
			path = "/v1/completions"
		}
		if r, err := parseRequest([]byte(body), false); err == nil && r.KVTransfer != nil && r.KVTransfer.DoRemotePrefill && r.KVTransfer.RemoteHost != "127.0.0.1" {
			return // a pull would dial whatever host the input names
		}
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusOK, http.StatusBadRequest, http.StatusNotFound:
		default:
			t.Errorf("%s %q: status %d: %s", path, body, rec.Code, rec.Body)
		}
	})
}
