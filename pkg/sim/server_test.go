package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// startServer runs one fast core behind its HTTP API on loopback.
func startServer(t testing.TB) *Server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := NewEngine(EngineConfig{Pod: "p0", Address: ln.Addr().String(), Model: "m",
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 512, CPUBlocks: 64, Seed: 1}}, nil)
	tm := Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 4}
	s := NewServer(NewCore(eng, tm), ln)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- s.Core().Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	})
	return s
}

func post(t *testing.T, s *Server, path, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post("http://"+s.Addr()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func TestCompletionsReportCachedTokensOnAPrefixHit(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	shared := strings.Repeat("alpha beta gamma delta ", 8) // 32 tokens, 8 blocks
	var got []usage
	for _, q := range []string{"first question", "second question"} {
		code, body := post(t, s, "/v1/completions", `{"model":"m","prompt":"`+shared+q+`","max_tokens":5}`)
		if code != http.StatusOK {
			t.Fatalf("status %d: %s", code, body)
		}
		var resp struct {
			Object  string `json:"object"`
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
			Usage usage `json:"usage"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatal(err)
		}
		if resp.Object != "text_completion" || len(resp.Choices) != 1 || len(strings.Fields(resp.Choices[0].Text)) != 5 {
			t.Fatalf("unexpected response %s", body)
		}
		got = append(got, resp.Usage)
	}
	if got[0].PromptTokens != 34 || got[0].CompletionTokens != 5 || got[0].PromptTokensDetails.CachedTokens != 0 {
		t.Errorf("first usage = %+v, want 34 prompt, 5 completion, 0 cached", got[0])
	}
	if got[1].PromptTokensDetails.CachedTokens != 32 {
		t.Errorf("second request's cached tokens = %d, want the 32 shared", got[1].PromptTokensDetails.CachedTokens)
	}
}

// sse reads a stream's data lines up to [DONE].
func sse(t *testing.T, body []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(body))
	done := false
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		out = append(out, m)
	}
	if !done {
		t.Fatal("the stream did not end with [DONE]")
	}
	return out
}

func TestChatStreamsTokensAndAFinalUsageChunk(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	tests := []struct {
		name         string
		includeUsage bool
	}{
		{"a stream asking for usage ends with a usage chunk", true},
		{"a stream not asking for usage has none", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hi there"}]`
			if tt.includeUsage {
				body += `,"stream_options":{"include_usage":true}`
			}
			code, resp := post(t, s, "/v1/chat/completions", body+"}")
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, resp)
			}
			chunks := sse(t, resp)
			content, usages := 0, 0
			for _, c := range chunks {
				if c["object"] != "chat.completion.chunk" {
					t.Errorf("chunk object %v", c["object"])
				}
				for _, ch := range c["choices"].([]any) {
					if d, ok := ch.(map[string]any)["delta"].(map[string]any); ok && d["content"] != "" && d["content"] != nil {
						content++
					}
				}
				if u, ok := c["usage"].(map[string]any); ok {
					usages++
					if u["completion_tokens"] != 4.0 || u["prompt_tokens_details"] == nil {
						t.Errorf("usage %v", u)
					}
					if len(c["choices"].([]any)) != 0 {
						t.Errorf("the usage chunk has choices")
					}
				}
			}
			if content != 4 {
				t.Errorf("%d content chunks, want 4", content)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.includeUsage]; usages != want {
				t.Errorf("%d usage chunks, want %d", usages, want)
			}
		})
	}
}

func TestTokenizeAgreesWithWhatTheEngineServes(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	messages := `[{"role":"system","content":"be brief"},{"role":"user","content":"what is a block"}]`
	tests := []struct {
		name, tokenize, complete, path string
	}{
		{"a completion prompt", `{"model":"m","prompt":"one two three four five"}`, `{"model":"m","prompt":"one two three four five","max_tokens":1}`, "/v1/completions"},
		{"chat messages", `{"model":"m","messages":` + messages + `}`, `{"model":"m","max_tokens":1,"messages":` + messages + `}`, "/v1/chat/completions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, s, "/tokenize", tt.tokenize)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			var tok struct {
				Count       int      `json:"count"`
				MaxModelLen int      `json:"max_model_len"`
				Tokens      []uint32 `json:"tokens"`
			}
			if err := json.Unmarshal(body, &tok); err != nil {
				t.Fatal(err)
			}
			code, body = post(t, s, tt.path, tt.complete)
			if code != http.StatusOK {
				t.Fatalf("status %d: %s", code, body)
			}
			var resp struct{ Usage usage }
			if err := json.Unmarshal(body, &resp); err != nil {
				t.Fatal(err)
			}
			if tok.Count == 0 || tok.Count != len(tok.Tokens) || tok.Count != resp.Usage.PromptTokens || tok.MaxModelLen != MaxModelLen {
				t.Errorf("tokenize says %d tokens (%d ids, max %d); the completion counted %d", tok.Count, len(tok.Tokens), tok.MaxModelLen, resp.Usage.PromptTokens)
			}
		})
	}
}

func TestBadRequestsGetClearErrors(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	tests := []struct {
		name, path, body string
		want             int
	}{
		{"malformed JSON", "/v1/completions", `{"model":`, http.StatusBadRequest},
		{"an unknown model", "/v1/completions", `{"model":"other","prompt":"x"}`, http.StatusNotFound},
		{"an empty prompt", "/v1/completions", `{"model":"m","prompt":"   "}`, http.StatusBadRequest},
		{"zero max_tokens", "/v1/completions", `{"model":"m","prompt":"x","max_tokens":0}`, http.StatusBadRequest},
		{"chat without messages", "/v1/chat/completions", `{"model":"m"}`, http.StatusBadRequest},
		{"tokenize without input", "/tokenize", `{"model":"m"}`, http.StatusBadRequest},
		{"tokenize with bad messages", "/tokenize", `{"model":"m","messages":[1]}`, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := post(t, s, tt.path, tt.body)
			if code != tt.want {
				t.Fatalf("status %d, want %d: %s", code, tt.want, body)
			}
			var e struct {
				Object, Message string
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Object != "error" || e.Message == "" {
				t.Errorf("error body %s is not vLLM's shape", body)
			}
		})
	}
}

// byteTokenizer is a model's tokenizer other than Words: one token per
// byte, a BOS of 1 when asked for special tokens, and a chat template of
// its own.
type byteTokenizer struct{}

func (byteTokenizer) Encode(text string, special bool) ([]uint32, error) {
	var ids []uint32
	if special {
		ids = append(ids, 1)
	}
	for _, b := range []byte(text) {
		ids = append(ids, uint32(b))
	}
	return ids, nil
}

func (byteTokenizer) RenderChat(c *Chat) (string, error) { return "chat:" + string(c.Messages), nil }

// The engine tokenizes with the tokenizer it is given, special tokens and
// chat template included, in /tokenize and in what it prefills.
func TestTheEngineUsesTheTokenizerItIsGiven(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := NewEngine(EngineConfig{Pod: "p0", Address: ln.Addr().String(), Model: "m", Tokenizer: byteTokenizer{},
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64, Seed: 1}}, nil)
	s := NewServer(NewCore(eng, Timing{MaxSeqs: 4}), ln)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- s.Core().Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	})
	for _, tc := range []struct {
		name, tokenize, path, complete string
		want                           []uint32
	}{
		{"a completion, BOS added", `{"model":"m","prompt":"ab"}`, "/v1/completions", `{"model":"m","prompt":"ab","max_tokens":1}`, []uint32{1, 'a', 'b'}},
		{"a completion without special tokens", `{"model":"m","prompt":"ab","add_special_tokens":false}`, "/v1/completions",
			`{"model":"m","prompt":"ab","max_tokens":1,"add_special_tokens":false}`, []uint32{'a', 'b'}},
		{"empty messages, refused before the template", `{"model":"m","messages":[]}`, "", "", nil},
		{"a chat", `{"model":"m","messages":[{"role":"user","content":"x"}]}`, "/v1/chat/completions",
			`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1}`, byteIDs(`chat:[{"role":"user","content":"x"}]`)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, s, "/tokenize", tc.tokenize)
			if tc.want == nil {
				if code != http.StatusBadRequest {
					t.Fatalf("status %d, want 400: %s", code, body)
				}
				return
			}
			var tok struct{ Tokens []uint32 }
			if err := json.Unmarshal(body, &tok); err != nil || code != http.StatusOK || !slices.Equal(tok.Tokens, tc.want) {
				t.Fatalf("/tokenize: status %d, %v: %s; want ids %v", code, err, body, tc.want)
			}
			code, body = post(t, s, tc.path, tc.complete)
			var resp struct{ Usage usage }
			if err := json.Unmarshal(body, &resp); err != nil || code != http.StatusOK || resp.Usage.PromptTokens != len(tc.want) {
				t.Fatalf("%s: status %d, %v: %s; want %d prompt tokens", tc.path, code, err, body, len(tc.want))
			}
		})
	}
}

func byteIDs(s string) []uint32 {
	ids := make([]uint32, len(s))
	for i := range len(s) {
		ids[i] = uint32(s[i])
	}
	return ids
}
