package proxy_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// twoTargets picks a primary and one fallback.
const twoTargets = `
plugins:
- type: precise-prefix-cache-scorer
- type: queue-scorer
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 2}
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
`

func startProxy(t testing.TB, d director.Handler, o proxy.Options) (string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Addr, o.Registerer = "127.0.0.1:0", reg
	s, err := proxy.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("proxy: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("proxy did not stop within 10s of cancel")
		}
	})
	return "http://" + s.Addr(), reg
}

func completion(base uint32, n int, stream bool) string {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = base + uint32(i)
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids, "stream": stream})
	return string(b)
}

func post(t testing.TB, url, body string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestCompletionsAreForwardedAndFollowTheCache(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 4, NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{})
	body := completion(1000, 48, false)
	resp, got := post(t, base+"/v1/completions", body)
	if resp.StatusCode != 200 || !strings.Contains(got, `"prompt_tokens":48`) {
		t.Fatalf("first request: %d %s", resp.StatusCode, got)
	}
	first := resp.Header.Get("x-gateway-destination-endpoint-served")
	if first == "" || first != resp.Header.Get("X-Served-By") {
		t.Fatalf("served header %q, model server says %q", first, resp.Header.Get("X-Served-By"))
	}
	ids := make([]uint32, 48)
	for i := range ids {
		ids[i] = 1000 + uint32(i)
	}
	f.WaitHeld(t, first, ids)
	for i := range 5 {
		resp, got := post(t, base+"/v1/completions", body)
		if served := resp.Header.Get("x-gateway-destination-endpoint-served"); served != first {
			t.Fatalf("repeat %d served by %s; %s holds the prompt", i, served, first)
		}
		// All but the last block, which the engine recomputes as vLLM does.
		if !strings.Contains(got, `"cached_tokens":44`) {
			t.Errorf("repeat %d: %s: the engine did not find the prefix cached", i, got)
		}
	}
	// Usage is accounted once the response is copied through, which may be
	// after the client has read its last byte.
	testkit.WaitFor(t, "6 responses accounted with usage", func() error {
		if seen := testkit.HistCount(t, f.Metrics, "inference_objective_input_tokens"); seen != 6 {
			return fmt.Errorf("testkit.HistCount(t, f.Metrics, \"inference_objective_input_tokens\") is %v, want %v", seen, 6)
		}
		return nil
	})
}

func TestSSEStreamsThroughEventByEvent(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{})
	gate := make(chan struct{})
	for _, s := range f.Servers {
		s.SetGate(gate)
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(completion(7, 16, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	rd := bufio.NewReader(resp.Body)
	line, err := rd.ReadString('\n')
	if err != nil || !strings.Contains(line, `"text":"one"`) {
		t.Fatalf("first event %q, %v", line, err)
	}
	// The model server is holding the rest behind the gate: the first event
	// arrived before the last was written.
	close(gate)
	rest, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(rest), `"text":"three"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest of the stream %q", rest)
	}
	testkit.WaitFor(t, "the stream's usage to be accounted", func() error {
		if seen := testkit.HistSum(t, f.Metrics, "inference_objective_input_tokens"); seen != 16 {
			return fmt.Errorf("testkit.HistSum(t, f.Metrics, \"inference_objective_input_tokens\") is %v, want %v", seen, 16)
		}
		return nil
	})
}

func TestErrorsAreAnsweredAsOpenAIErrors(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{MaxBodyBytes: 2048})
	tests := []struct {
		name, method, path, body string
		headers                  map[string]string
		status                   int
		reason                   string
	}{
		{"a body that is not JSON", "POST", "/v1/completions", "prompt=hi", nil, 400, ""},
		{"a completion without a model", "POST", "/v1/completions", `{"prompt":"hi"}`, nil, 400, "model"},
		{"a body over the limit", "POST", "/v1/completions", completion(1, 1000, false), nil, 413, "2048 bytes"},
		{"a path outside the API", "GET", "/metrics", "", nil, 404, "/v1/"},
		{"a subset naming no endpoint", "POST", "/v1/completions", completion(1, 8, false),
			map[string]string{"x-gateway-destination-endpoint-subset": "10.0.0.1:80"}, 503, "subset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			checkError(t, resp, tt.status, tt.reason)
		})
	}
}

func TestModelServerErrorsPassThrough(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 1, NoTokenizer: true})
	base, reg := startProxy(t, f.Director, proxy.Options{})
	for _, code := range []int32{429, 500, 503} {
		f.Servers[0].Status.Store(code)
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(completion(1, 8, false)))
		if err != nil {
			t.Fatal(err)
		}
		checkError(t, resp, int(code), "unhappy")
		resp.Body.Close()
	}
	// A request is accounted after its response is written; the handler
	// has done so once it is no longer active.
	testkit.WaitFor(t, "every request to end", func() error {
		if seen := testkit.Value(t, reg, "kvroute_proxy_active_requests"); seen != 0 {
			return fmt.Errorf("testkit.Value(t, reg, \"kvroute_proxy_active_requests\") is %v, want %v", seen, 0)
		}
		return nil
	})
	if got := testkit.Value(t, reg, "kvroute_proxy_requests_total"); got != 3 {
		t.Errorf("requests counted = %v, want 3", got)
	}
	if got := testkit.Value(t, f.Metrics, "inference_objective_request_error_total", "error_code", "503"); got != 1 {
		t.Errorf("503s accounted by the director = %v, want 1", got)
	}
}

func TestAFallbackServesWhenThePrimaryRefusesConnections(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 2, NoTokenizer: true, Config: twoTargets})
	// The test drops the proxy's kept-alive connections after closing a
	// server, so that the next request dials, and is refused, rather than
	// finding the closed connection (after which it could have been
	// served: no fallback, by design).
	tr := http.DefaultTransport.(*http.Transport).Clone()
	base, reg := startProxy(t, f.Director, proxy.Options{Transport: tr})

	body := completion(50, 32, false)
	resp, _ := post(t, base+"/v1/completions", body)
	holder := resp.Header.Get("x-gateway-destination-endpoint-served")
	ids := make([]uint32, 32)
	for i := range ids {
		ids[i] = 50 + uint32(i)
	}
	f.WaitHeld(t, holder, ids)
	// The holder goes away but is still listed: it is picked first, for the
	// prompt it holds, and its address refuses connections.
	f.Server(holder).Close()
	tr.CloseIdleConnections()

	resp, got := post(t, base+"/v1/completions", body)
	served := resp.Header.Get("x-gateway-destination-endpoint-served")
	if resp.StatusCode != 200 || served == holder || served == "" {
		t.Fatalf("got %d from %q (%s); want 200 from the live endpoint", resp.StatusCode, served, got)
	}
	if testkit.Value(t, reg, "kvroute_proxy_fallbacks_total") < 1 {
		t.Error("no fallback was counted")
	}
	// With every pick down, the client gets a 502 naming the failures.
	f.Servers[0].Close()
	f.Servers[1].Close()
	tr.CloseIdleConnections()
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checkError(t, resp, http.StatusBadGateway, "no picked endpoint accepted a connection")
}

func TestAClientThatLeavesMidStreamLeaksNothing(t *testing.T) {
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, reg := startProxy(t, f.Director, proxy.Options{})
	post(t, base+"/v1/completions", completion(1, 8, false)) // warm the connection pools
	before := testkit.SettledGoroutines(0)
	accounted := testkit.HistCount(t, f.Metrics, "inference_objective_request_duration_seconds")

	gate := make(chan struct{})
	defer close(gate)
	for _, s := range f.Servers {
		s.SetGate(gate)
	}
	const n = 10
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", base+"/v1/completions", strings.NewReader(completion(uint32(i*100), 8, true)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
	}
	testkit.WaitFor(t, "every request to end", func() error {
		if seen := testkit.Value(t, reg, "kvroute_proxy_active_requests"); seen != 0 {
			return fmt.Errorf("testkit.Value(t, reg, \"kvroute_proxy_active_requests\") is %v, want %v", seen, 0)
		}
		return nil
	})
	if got := testkit.HistCount(t, f.Metrics, "inference_objective_request_duration_seconds") - accounted; got != n {
		t.Errorf("responses accounted = %d, want %d", got, n)
	}
	for _, s := range f.Servers {
		s.SetGate(nil)
	}
	http.DefaultClient.CloseIdleConnections()
	if after := testkit.SettledGoroutines(before); after > before {
		t.Errorf("goroutines: %d before, %d after %d abandoned streams", before, after, n)
	}
}

func checkError(t *testing.T, resp *http.Response, status int, reason string) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d (%s), want %d", resp.StatusCode, b, status)
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", b, err)
	}
	if e.Error.Code != status || e.Error.Type == "" || !strings.Contains(e.Error.Message, reason) {
		t.Errorf("error body %s: want code %d, a type, and a message mentioning %q", b, status, reason)
	}
}

func TestMessagesRefusalsAreAnsweredAsAnthropicErrors(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{MaxBodyBytes: 2048})
	for _, tc := range []struct {
		name, path, body string
		status           int
		errType, reason  string
	}{
		{"a Messages body that is not JSON", "/v1/messages", "hi", 400, "invalid_request_error", "JSON"},
		{"Messages without messages", "/v1/messages", `{"model":"m","max_tokens":8}`, 400, "invalid_request_error", "messages"},
		{"count_tokens for a model no endpoint serves", "/v1/messages/count_tokens", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, 404, "not_found_error", "nope"},
		{"a Messages body over the limit", "/v1/messages", `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 3000) + `"}]}`, 413, "request_too_large", "2048"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			resp, body := post(t, base+tc.path, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, body, tc.status)
			}
			var e struct {
				Type  string `json:"type"`
				Error struct {
					Type    string `json:"type"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error.Type != tc.errType || !strings.Contains(e.Error.Message, tc.reason) {
				t.Fatalf("body %s (%v): want Anthropic's error shape, type %s, a message mentioning %q", body, err, tc.errType, tc.reason)
			}
		})
	}
	// The OpenAI paths keep OpenAI's shape.
	req, _ := http.NewRequest("POST", base+"/v1/responses", strings.NewReader("hi"))
	req.Header.Set("Content-Type", "application/json")
	r2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Body.Close()
	checkError(t, r2, 400, "JSON")
}
