package simkit_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// startServer runs one fast engine behind its HTTP API on loopback, with
// 4-token blocks and 512 GPU blocks.
func startServer(t *testing.T) *sim.Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := sim.NewEngine(sim.EngineConfig{Pod: "p", Address: ln.Addr().String(), Model: "m",
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 512, Seed: 1}}, nil)
	srv := sim.NewServer(sim.NewCore(eng, sim.Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 4}), ln)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- srv.Core().Run(ctx) }()
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	})
	return srv
}

// The request path, parsing a request with its own parser and tokenizing
// it with Tokenizer, finds the token ids an engine's /tokenize answers,
// which the engine reads with a parser of its own.
func TestTheRequestPathTokenizesAsTheEngineDoes(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	for _, tc := range []struct{ name, path, body string }{
		{"a completion", "/v1/completions", `{"model":"m","prompt":"the cat sat on the mat"}`},
		{"a chat", "/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"be brief"},` +
			`{"role":"user","name":"ann","content":[{"type":"text","text":"what is"},{"type":"text","text":" a block"}]},` +
			`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function"}]}],"tools":[{"type":"function"}]}`},
		{"a chat continuing its last message", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"},` +
			`{"role":"assistant","content":"Once upon"}],"continue_final_message":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := openai.ParseRequest(tc.path, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			got, err := simkit.Tokenizer{Model: "m"}.Tokenize(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.Post("http://"+srv.Addr()+"/tokenize", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var tok struct{ Tokens []uint32 }
			if err := json.NewDecoder(resp.Body).Decode(&tok); err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("/tokenize: status %d, %v", resp.StatusCode, err)
			}
			if len(got) == 0 || !slices.Equal(got, tok.Tokens) {
				t.Errorf("the request path's ids %v, the engine's %v", got, tok.Tokens)
			}
		})
	}
}
