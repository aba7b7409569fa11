package remotetokenizer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// Token ids of the test server's vocabulary: every other word is hashed
// into [wordBase, wordBase+vocab).
const (
	bosToken      = 1
	genPromptTok  = 2
	toolsToken    = 3
	templateToken = 4
	wordBase      = 100
	vocab         = 50000
)

// tokenizeServer is a model server's /tokenize on loopback, tokenizing by a
// simple deterministic rule: one token per whitespace-separated word, a BOS
// token when special tokens are added, and for chat a role token before each
// message and a generation-prompt token at the end.
type tokenizeServer struct {
	*httptest.Server
	calls atomic.Int64
	// handle, when set, answers instead of the tokenizer.
	handle func(w http.ResponseWriter, r *http.Request) bool

	mu     sync.Mutex
	bodies []map[string]json.RawMessage
}

func newTokenizeServer(t *testing.T) *tokenizeServer {
	t.Helper()
	s := &tokenizeServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

func (s *tokenizeServer) serve(w http.ResponseWriter, r *http.Request) {
	s.calls.Add(1)
	if r.URL.Path != "/tokenize" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	// Reading the body to its end lets the server notice a client that
	// hangs up, which cancels r.Context() for the handlers that wait on it.
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(data))
	if s.handle != nil && s.handle(w, r) {
		return
	}
	var body map[string]json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, `{"error":"bad json"}`, http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	s.bodies = append(s.bodies, body)
	s.mu.Unlock()
	tokens, err := ruleTokenize(body)
	if err != nil {
		http.Error(w, fmt.Sprintf(`{"error":%q}`, err), http.StatusBadRequest)
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"count": len(tokens), "max_model_len": 8192, "tokens": tokens})
}

func (s *tokenizeServer) lastBody(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.bodies) == 0 {
		t.Fatal("the server received no tokenize request")
	}
	return s.bodies[len(s.bodies)-1]
}

func wordTokens(text string) []uint32 {
	var out []uint32
	for _, w := range strings.Fields(text) {
		out = append(out, wordBase+uint32(xxhash.Sum64String(w)%vocab))
	}
	return out
}

func ruleTokenize(body map[string]json.RawMessage) ([]uint32, error) {
	var f struct {
		Prompt               *string
		Messages             []struct{ Role, Content string }
		AddSpecialTokens     *bool   `json:"add_special_tokens"`
		AddGenerationPrompt  *bool   `json:"add_generation_prompt"`
		ContinueFinalMessage bool    `json:"continue_final_message"`
		ChatTemplate         *string `json:"chat_template"`
		Tools                []any
	}
	raw, _ := json.Marshal(body)
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, err
	}
	var out []uint32
	if f.Prompt != nil {
		if f.AddSpecialTokens == nil || *f.AddSpecialTokens {
			out = append(out, bosToken)
		}
		return append(out, wordTokens(*f.Prompt)...), nil
	}
	if f.Messages == nil {
		return nil, errors.New("neither prompt nor messages")
	}
	if f.AddGenerationPrompt == nil || *f.AddGenerationPrompt {
		if f.ContinueFinalMessage {
			return nil, errors.New("cannot set both continue_final_message and add_generation_prompt")
		}
	}
	if f.AddSpecialTokens != nil && *f.AddSpecialTokens {
		out = append(out, bosToken)
	}
	if f.ChatTemplate != nil {
		out = append(out, templateToken)
	}
	if f.Tools != nil {
		out = append(out, toolsToken)
	}
	for _, m := range f.Messages {
		out = append(out, wordTokens(m.Role)...)
		out = append(out, wordTokens(m.Content)...)
	}
	if f.AddGenerationPrompt == nil || *f.AddGenerationPrompt {
		out = append(out, genPromptTok)
	}
	return out, nil
}

func concat(parts ...[]uint32) []uint32 {
	var out []uint32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func newTestRemote(t *testing.T, srv *tokenizeServer, opts Options) (*Remote, *prometheus.Registry) {
	t.Helper()
	if opts.Endpoint == nil {
		opts.Endpoint = func(model string) (string, bool) {
			if model == "unknown" {
				return "", false
			}
			return srv.URL + "/", true
		}
	}
	reg := prometheus.NewRegistry()
	r := New(opts, reg)
	t.Cleanup(r.Close)
	return r, reg
}

func completion(model, prompt string, special bool) *request.Request {
	return &request.Request{API: request.APICompletions, Model: model, Prompt: prompt, AddSpecialTokens: special}
}

func chatReq(model, messages string, c request.Chat) *request.Request {
	c.Messages = json.RawMessage(messages)
	return &request.Request{API: request.APIChatCompletions, Model: model, Chat: &c, AddSpecialTokens: c.AddSpecialTokens}
}

func TestRemoteTokenizesLikeTheModelServer(t *testing.T) {
	t.Parallel()
	srv := newTokenizeServer(t)
	r, _ := newTestRemote(t, srv, Options{})
	msgs := `[{"role":"system","content":"be brief"}, {"role":"user","content":"hi <there> & \"you\""}]`
	tests := []struct {
		name     string
		req      *request.Request
		want     []uint32
		wantBody map[string]string
		absent   []string
	}{
		{
			name:     "a completions prompt with special tokens gets a BOS",
			req:      completion("m", "the quick fox", true),
			want:     concat([]uint32{bosToken}, wordTokens("the quick fox")),
			wantBody: map[string]string{"model": `"m"`, "prompt": `"the quick fox"`, "add_special_tokens": "true"},
		},
		{
			name:     "a completions prompt without special tokens gets none",
			req:      completion("m", "a <b> & \"c\"\n", false),
			want:     wordTokens("a <b> & \"c\"\n"),
			wantBody: map[string]string{"prompt": `"a <b> & \"c\"\n"`, "add_special_tokens": "false"},
		},
		{
			name: "a chat request sends its raw messages and template flags",
			req:  chatReq("m", msgs, request.Chat{AddGenerationPrompt: true}),
			want: concat(wordTokens("system be brief user"), wordTokens(`hi <there> & "you"`), []uint32{genPromptTok}),
			wantBody: map[string]string{"model": `"m"`, "messages": msgs, "add_generation_prompt": "true",
				"continue_final_message": "false", "add_special_tokens": "false"},
			absent: []string{"tools", "chat_template", "chat_template_kwargs", "prompt"},
		},
		{
			name: "a chat request passes tools, template and its kwargs through unchanged",
			req: chatReq("m", `[{"role":"user","content":"x"}]`, request.Chat{
				ContinueFinalMessage: true, AddSpecialTokens: true,
				Tools:              json.RawMessage(`[ {"type":"function"} ]`),
				ChatTemplate:       "{% for m in messages %}{{m}}{% endfor %}",
				ChatTemplateKwargs: json.RawMessage(`{"enable_thinking": false}`),
			}),
			want: concat([]uint32{bosToken, templateToken, toolsToken}, wordTokens("user x")),
			wantBody: map[string]string{"tools": `[ {"type":"function"} ]`, "chat_template_kwargs": `{"enable_thinking": false}`,
				"chat_template": `"{% for m in messages %}{{m}}{% endfor %}"`, "add_generation_prompt": "false",
				"continue_final_message": "true", "add_special_tokens": "true"},
		},
		{
			name:   "null tools and kwargs are left out",
			req:    chatReq("m", `[{"role":"user","content":"y"}]`, request.Chat{AddGenerationPrompt: true, Tools: json.RawMessage("null"), ChatTemplateKwargs: json.RawMessage(" null")}),
			want:   concat(wordTokens("user y"), []uint32{genPromptTok}),
			absent: []string{"tools", "chat_template_kwargs"},
		},
	}
	// Sequential: each case reads the body the server received last.
	for _, tt := range tests {
		got, err := r.Tokenize(context.Background(), tt.req)
		if err != nil {
			t.Fatalf("%s: Tokenize: %v", tt.name, err)
		}
		if fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("%s: tokens = %v, want %v", tt.name, got, tt.want)
		}
		body := srv.lastBody(t)
		for k, v := range tt.wantBody {
			if string(body[k]) != v {
				t.Errorf("%s: the server got %s = %s, want %s", tt.name, k, body[k], v)
			}
		}
		for _, k := range tt.absent {
			if _, ok := body[k]; ok {
				t.Errorf("%s: the server got %s = %s, want it absent", tt.name, k, body[k])
			}
		}
	}
}

func TestRemoteAnswersRepeatedInputsFromItsCache(t *testing.T) {
	t.Parallel()
	srv := newTokenizeServer(t)
	r, reg := newTestRemote(t, srv, Options{})
	ctx := context.Background()
	first, err := r.Tokenize(ctx, completion("m", "shared system prompt", true))
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name      string
		req       *request.Request
		wantCalls int64
	}{
		{"the same prompt is a hit", completion("m", "shared system prompt", true), 1},
		{"another cache salt is still a hit, as the salt does not change tokens", &request.Request{API: request.APICompletions, Model: "m", Prompt: "shared system prompt", AddSpecialTokens: true, CacheSalt: "s"}, 1},
		{"another model is a miss", completion("m2", "shared system prompt", true), 2},
		{"other special-token rules are a miss", completion("m", "shared system prompt", false), 3},
		{"the same chat as a completion's text is a miss", chatReq("m", `[{"role":"user","content":"shared system prompt"}]`, request.Chat{}), 4},
		{"a chat with other template flags is a miss", chatReq("m", `[{"role":"user","content":"shared system prompt"}]`, request.Chat{AddGenerationPrompt: true}), 5},
		{"a repeated chat is a hit", chatReq("m", `[{"role":"user","content":"shared system prompt"}]`, request.Chat{AddGenerationPrompt: true}), 5},
	}
	for _, s := range steps {
		if _, err := r.Tokenize(ctx, s.req); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if got := srv.calls.Load(); got != s.wantCalls {
			t.Errorf("%s: server calls = %d, want %d", s.name, got, s.wantCalls)
		}
	}
	again, err := r.Tokenize(ctx, completion("m", "shared system prompt", true))
	if err != nil || fmt.Sprint(again) != fmt.Sprint(first) {
		t.Fatalf("a cache hit returned %v, %v; want %v", again, err, first)
	}
	again[0] = 999
	if third, _ := r.Tokenize(ctx, completion("m", "shared system prompt", true)); third[0] == 999 {
		t.Error("modifying a returned slice changed the cached tokens")
	}
	if n := testutil.CollectAndCount(reg, "kvroute_tokenize_duration_seconds"); n < 2 {
		t.Errorf("duration series = %d, want cache and remote", n)
	}
	hits := histogramCount(t, reg, "cache", "ok")
	if hits != 5 {
		t.Errorf("cache hits observed = %d, want 5", hits)
	}
	if got := testutil.ToFloat64(r.m.cacheEntries); got != 5 {
		t.Errorf("kvroute_tokenize_cache_entries = %v, want 5", got)
	}
}

func histogramCount(t *testing.T, reg *prometheus.Registry, source, result string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kvroute_tokenize_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["source"] == source && labels["result"] == result {
				return m.GetHistogram().GetSampleCount()
			}
		}
	}
	return 0
}

func TestRemoteSharesOneRoundTripAmongConcurrentCallers(t *testing.T) {
	t.Parallel()
	srv := newTokenizeServer(t)
	release := make(chan struct{})
	srv.handle = func(w http.ResponseWriter, r *http.Request) bool {
		<-release
		return false
	}
	r, _ := newTestRemote(t, srv, Options{Timeout: time.Minute})
	const callers = 8
	var wg sync.WaitGroup
	results := make([][]uint32, callers)
	errs := make([]error, callers)
	for i := range callers {
		wg.Go(func() {
			results[i], errs[i] = r.Tokenize(context.Background(), completion("m", "one two three", true))
		})
	}
	testkit.WaitFor(t, "every caller to wait on the round trip", func() error {
		if seen := r.waiting.Load(); seen < callers {
			return fmt.Errorf("r.waiting.Load() is %v, want >= %v", seen, callers)
		}
		return nil
	})
	close(release)
	wg.Wait()
	if got := srv.calls.Load(); got != 1 {
		t.Errorf("server calls = %d, want 1 shared round trip", got)
	}
	want := fmt.Sprint(concat([]uint32{bosToken}, wordTokens("one two three")))
	for i := range callers {
		if errs[i] != nil || fmt.Sprint(results[i]) != want {
			t.Errorf("caller %d got %v, %v; want %s", i, results[i], errs[i], want)
		}
	}
	results[0][0] = 77
	if results[1][0] == 77 {
		t.Error("callers sharing a round trip share one slice")
	}
}

func TestRemoteFailures(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		handle  func(w http.ResponseWriter, r *http.Request) bool
		opts    Options
		req     *request.Request
		wantErr error
		say     string
		reason  string
	}{
		{
			name: "a server slower than the timeout is a timeout",
			handle: func(w http.ResponseWriter, r *http.Request) bool {
				<-r.Context().Done()
				return true
			},
			opts:    Options{Timeout: 100 * time.Millisecond},
			wantErr: context.DeadlineExceeded,
			reason:  "timeout",
		},
		{
			name: "a 500 is an error carrying the server's reason",
			handle: func(w http.ResponseWriter, r *http.Request) bool {
				http.Error(w, `{"error":"engine dead"}`, http.StatusInternalServerError)
				return true
			},
			wantErr: ErrRemoteStatus,
			say:     "status 500: {\"error\":\"engine dead\"}",
			reason:  "status",
		},
		{
			name: "a response that is not JSON is a bad response",
			handle: func(w http.ResponseWriter, r *http.Request) bool {
				_, _ = w.Write([]byte(`{"count":2,"tokens":[1,2`))
				return true
			},
			wantErr: ErrBadResponse,
			reason:  "bad_response",
		},
		{
			name:    "a response larger than the cap is refused",
			handle:  respond(`{"count":3000,"tokens":[` + strings.Repeat("12345,", 2999) + `1]}`),
			opts:    Options{MaxResponseBytes: 4096},
			wantErr: ErrResponseTooLarge,
			reason:  "too_large",
		},
		{
			name:    "a negative token id is a bad response",
			handle:  respond(`{"count":2,"tokens":[1,-2]}`),
			wantErr: ErrBadResponse,
			say:     "tokens[1] is not a token id",
		},
		{
			name:    "a token id beyond uint32 is a bad response",
			handle:  respond(`{"count":1,"tokens":[4294967296]}`),
			wantErr: ErrBadResponse,
			say:     "tokens[0] does not fit a token id",
		},
		{
			name:    "a null token id is a bad response",
			handle:  respond(`{"count":2,"tokens":[5,null]}`),
			wantErr: ErrBadResponse,
			say:     "tokens[1] is not a token id",
		},
		{
			name:    "a fractional token id is a bad response",
			handle:  respond(`{"count":1,"tokens":[5.5]}`),
			wantErr: ErrBadResponse,
		},
		{
			name:    "a count that disagrees with the tokens is a bad response",
			handle:  respond(`{"count":3,"tokens":[5,6]}`),
			wantErr: ErrBadResponse,
			say:     "count 3 but 2 tokens",
		},
		{
			name:    "a response without tokens is a bad response",
			handle:  respond(`{"count":0}`),
			wantErr: ErrBadResponse,
			say:     "tokens is missing",
		},
		{
			name:    "a model without an endpoint has no endpoint",
			req:     completion("unknown", "x", true),
			wantErr: ErrNoEndpoint,
			reason:  "no_endpoint",
		},
		{
			name:    "a request to another API is unsupported",
			req:     &request.Request{API: request.APIOther, Model: "m"},
			wantErr: tokenize.ErrUnsupported,
			reason:  "unsupported",
		},
		{
			name:    "a multimodal request is unsupported",
			req:     &request.Request{API: request.APIChatCompletions, Model: "m", NoReproduciblePrefix: true, Chat: &request.Chat{Messages: json.RawMessage(`[]`)}},
			wantErr: tokenize.ErrUnsupported,
		},
		{
			name:    "a chat request without its chat fields is unsupported",
			req:     &request.Request{API: request.APIChatCompletions, Model: "m"},
			wantErr: tokenize.ErrUnsupported,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newTokenizeServer(t)
			srv.handle = tt.handle
			r, reg := newTestRemote(t, srv, tt.opts)
			req := tt.req
			if req == nil {
				req = completion("m", "some words", true)
			}
			for attempt := int64(1); attempt <= 2; attempt++ {
				ids, err := r.Tokenize(context.Background(), req)
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("Tokenize = %v, %v; want an error wrapping %v", ids, err, tt.wantErr)
				}
				if !strings.Contains(err.Error(), tt.say) {
					t.Errorf("error %q does not say %q", err, tt.say)
				}
				// A request the client gave up on may reach the server
				// only after the client has returned.
				for deadline := time.Now().Add(2 * time.Second); tt.handle != nil && srv.calls.Load() < attempt && time.Now().Before(deadline); {
					time.Sleep(5 * time.Millisecond)
				}
				if tt.handle != nil && srv.calls.Load() != attempt {
					t.Errorf("after %d attempts the server saw %d calls; failures must not be cached", attempt, srv.calls.Load())
				}
			}
			if tt.reason != "" {
				got := testutil.ToFloat64(r.m.errors.WithLabelValues(tt.reason))
				if got != 2 {
					t.Errorf("kvroute_tokenize_errors_total{reason=%q} = %v, want 2", tt.reason, got)
				}
			}
			if n, _ := r.cache.len(); n != 0 {
				t.Errorf("cache holds %d entries after failures", n)
			}
			_ = reg
		})
	}
}

func respond(body string) func(w http.ResponseWriter, r *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		_, _ = w.Write([]byte(body))
		return true
	}
}

func TestRemoteStopsWaitingWhenTheCallerGivesUp(t *testing.T) {
	t.Parallel()
	srv := newTokenizeServer(t)
	release := make(chan struct{})
	srv.handle = func(w http.ResponseWriter, r *http.Request) bool {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return false
	}
	r, _ := newTestRemote(t, srv, Options{Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := r.Tokenize(ctx, completion("m", "late answer", true))
		done <- err
	}()
	testkit.WaitFor(t, "the caller to wait on the round trip", func() error {
		if seen := r.waiting.Load(); seen < 1 {
			return fmt.Errorf("r.waiting.Load() is %v, want >= %v", seen, 1)
		}
		return nil
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Tokenize = %v, want context.Canceled", err)
	}
	// The round trip went on without the caller and its answer is kept.
	close(release)
	testkit.WaitFor(t, "the late answer to be cached", func() error {
		n, _ := r.cache.len()
		if n != 1 {
			return fmt.Errorf("n is %v, want %v", n, 1)
		}
		return nil
	})
	if _, err := r.Tokenize(context.Background(), completion("m", "late answer", true)); err != nil || srv.calls.Load() != 1 {
		t.Errorf("after the late answer: err %v, server calls %d; want a cache hit", err, srv.calls.Load())
	}
}

func TestRemoteCacheStaysWithinItsBounds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		opts        Options
		prompts     []string
		wantEntries int
		// cached are prompts asked again afterwards that must be answered
		// from the cache; reasked, asked after those, must reach the server.
		cached  []string
		reasked []string
	}{
		{
			name:        "the least recently used entry goes when the entry bound is reached",
			opts:        Options{CacheEntries: 2},
			prompts:     []string{"a", "b", "a", "c"},
			wantEntries: 2,
			reasked:     []string{"b"},
			cached:      []string{"a"},
		},
		{
			name:        "entries are evicted to stay within the byte bound",
			opts:        Options{CacheBytes: 2*entryOverhead + 4*4 + 4*4},
			prompts:     []string{"w x y z", "a b c d", "e f g h"},
			wantEntries: 2,
			reasked:     []string{"w x y z"},
			cached:      []string{"e f g h"},
		},
		{
			name:        "an entry larger than the byte bound is not kept",
			opts:        Options{CacheBytes: entryOverhead + 4*2},
			prompts:     []string{"one two three four five"},
			wantEntries: 0,
			reasked:     []string{"one two three four five"},
		},
		{
			name:        "a negative entry bound disables the cache",
			opts:        Options{CacheEntries: -1},
			prompts:     []string{"a"},
			wantEntries: 0,
			reasked:     []string{"a"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := newTokenizeServer(t)
			r, _ := newTestRemote(t, srv, tt.opts)
			ctx := context.Background()
			for _, p := range tt.prompts {
				if _, err := r.Tokenize(ctx, completion("m", p, false)); err != nil {
					t.Fatal(err)
				}
			}
			entries, bytes := r.cache.len()
			if entries != tt.wantEntries {
				t.Errorf("cache entries = %d, want %d", entries, tt.wantEntries)
			}
			if got := testutil.ToFloat64(r.m.cacheBytes); int64(got) != bytes || (tt.opts.CacheBytes > 0 && bytes > tt.opts.CacheBytes) {
				t.Errorf("cache bytes = %d (gauge %v), bound %d", bytes, got, tt.opts.CacheBytes)
			}
			for _, p := range tt.cached {
				before := srv.calls.Load()
				if _, err := r.Tokenize(ctx, completion("m", p, false)); err != nil {
					t.Fatal(err)
				}
				if srv.calls.Load() != before {
					t.Errorf("%q reached the server, want it cached", p)
				}
			}
			for _, p := range tt.reasked {
				before := srv.calls.Load()
				if _, err := r.Tokenize(ctx, completion("m", p, false)); err != nil {
					t.Fatal(err)
				}
				if srv.calls.Load() != before+1 {
					t.Errorf("%q was answered from the cache, want it evicted", p)
				}
			}
		})
	}
}

func TestRemoteCloseCancelsRoundTripsInFlight(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	srv := newTokenizeServer(t)
	srv.handle = func(w http.ResponseWriter, r *http.Request) bool {
		<-r.Context().Done()
		return true
	}
	r := New(Options{Timeout: time.Minute, Endpoint: func(string) (string, bool) { return srv.URL, true }}, nil)
	done := make(chan error, 1)
	go func() {
		_, err := r.Tokenize(context.Background(), completion("m", "never answered", true))
		done <- err
	}()
	testkit.WaitFor(t, "the caller to wait on the round trip", func() error {
		if seen := r.waiting.Load(); seen < 1 {
			return fmt.Errorf("r.waiting.Load() is %v, want >= %v", seen, 1)
		}
		return nil
	})
	r.Close()
	if err := <-done; !errors.Is(err, ErrClosed) {
		t.Errorf("in-flight Tokenize = %v, want ErrClosed", err)
	}
	if _, err := r.Tokenize(context.Background(), completion("m", "x", true)); !errors.Is(err, ErrClosed) {
		t.Errorf("Tokenize after Close = %v, want ErrClosed", err)
	}
	srv.Close()
}

func TestRemoteRegistersItsMetrics(t *testing.T) {
	t.Parallel()
	srv := newTokenizeServer(t)
	r, reg := newTestRemote(t, srv, Options{})
	if _, err := r.Tokenize(context.Background(), completion("m", "x", true)); err != nil {
		t.Fatal(err)
	}
	_, _ = r.Tokenize(context.Background(), completion("unknown", "x", true))
	for _, name := range []string{"kvroute_tokenize_duration_seconds", "kvroute_tokenize_errors_total", "kvroute_tokenize_cache_entries", "kvroute_tokenize_cache_bytes"} {
		if testutil.CollectAndCount(reg, name) == 0 {
			t.Errorf("%s is not registered", name)
		}
	}
	// A nil registerer registers nothing and still works.
	r2 := New(Options{Endpoint: func(string) (string, bool) { return srv.URL, true }}, nil)
	defer r2.Close()
	if _, err := r2.Tokenize(context.Background(), completion("m", "x", true)); err != nil {
		t.Fatal(err)
	}
}

func FuzzDecodeResponse(f *testing.F) {
	for _, s := range []string{
		`{"count":3,"max_model_len":8192,"tokens":[128000,9906,1917]}`,
		`{"count":0,"max_model_len":8192,"tokens":[]}`,
		`{"tokens":[1,-1]}`,
		`{"tokens":[4294967295, 4294967296]}`,
		`{"tokens":[1.0]}`,
		`{"tokens":null}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ids, _, err := decodeResponse(data)
		if err != nil {
			if !errors.Is(err, ErrBadResponse) {
				t.Fatalf("error %q does not wrap ErrBadResponse", err)
			}
			return
		}
		// Whatever is accepted must be what encoding/json reads too.
		var check struct{ Tokens []uint32 }
		if err := json.Unmarshal(data, &check); err != nil || len(check.Tokens) != len(ids) {
			t.Fatalf("accepted %v, which encoding/json reads as %v, %v", ids, check.Tokens, err)
		}
		for i := range ids {
			if ids[i] != check.Tokens[i] {
				t.Fatalf("token %d = %d, encoding/json reads %d", i, ids[i], check.Tokens[i])
			}
		}
	})
}

func BenchmarkRemote8kPrompt(b *testing.B) {
	words := make([]string, 8192)
	for i := range words {
		words[i] = fmt.Sprintf("w%d", i%977)
	}
	prompt := strings.Join(words, " ")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]json.RawMessage
		_ = json.NewDecoder(r.Body).Decode(&body)
		tokens, _ := ruleTokenize(body)
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(tokens), "max_model_len": 8192, "tokens": tokens})
	}))
	defer srv.Close()
	for _, mode := range []string{"cache", "remote"} {
		b.Run(mode, func(b *testing.B) {
			opts := Options{Timeout: time.Minute, Endpoint: func(string) (string, bool) { return srv.URL, true }}
			if mode == "remote" {
				opts.CacheEntries = -1
			}
			r := New(opts, nil)
			defer r.Close()
			req := completion("m", prompt, true)
			if _, err := r.Tokenize(context.Background(), req); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				ids, err := r.Tokenize(context.Background(), req)
				if err != nil || len(ids) != 8193 {
					b.Fatalf("%d ids, %v", len(ids), err)
				}
			}
			b.ReportMetric(float64(b.N)*8193/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}
