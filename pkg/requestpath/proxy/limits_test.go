package proxy_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

func forwarded(f *fleet.Fleet) int64 {
	var n int64
	for _, s := range f.Servers {
		n += s.Requests.Load()
	}
	return n
}

func TestTheProxyRefusesWhatItMustNotForward(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{})
	unknown, _ := json.Marshal(map[string]any{"model": "no-such-model", "prompt": []int{1, 2, 3, 4}})
	tests := []struct {
		name, method, path, contentType, body string
		status                                int
		reason, param, allow                  string
	}{
		{"a GET of a completion", "GET", "/v1/completions", "", "", 405, "use POST", "", "POST"},
		{"a PUT of a chat completion", "PUT", "/v1/chat/completions", "application/json", completion(1, 8, false), 405, "use POST", "", "POST"},
		{"a POST of the model list", "POST", "/v1/models", "application/json", "{}", 405, "GET", "", "GET, HEAD"},
		{"a form-encoded body", "POST", "/v1/completions", "application/x-www-form-urlencoded", completion(1, 8, false), 415, "not application/json", "", ""},
		{"a text body", "POST", "/v1/completions", "text/plain; charset=utf-8", completion(1, 8, false), 415, "not application/json", "", ""},
		{"a Content-Type that does not parse", "POST", "/v1/completions", "application/json; =", completion(1, 8, false), 415, "does not parse", "", ""},
		{"a model no endpoint serves", "POST", "/v1/completions", "application/json", string(unknown), 404, "the model `no-such-model` does not exist", "model", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
			if tt.contentType != "" {
				req.Header.Set("Content-Type", tt.contentType)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if got := resp.Header.Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
			b, _ := io.ReadAll(resp.Body)
			checkError(t, &http.Response{StatusCode: resp.StatusCode, Body: io.NopCloser(bytes.NewReader(b))}, tt.status, tt.reason)
			var e struct {
				Error struct {
					Type  string `json:"type"`
					Param string `json:"param"`
				} `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			if e.Error.Param != tt.param {
				t.Errorf("param = %q, want %q", e.Error.Param, tt.param)
			}
			if tt.status == 404 && e.Error.Type != "NotFoundError" {
				t.Errorf("type = %q, want vLLM's NotFoundError", e.Error.Type)
			}
		})
	}
	if n := forwarded(f); n != 0 {
		t.Errorf("%d refused requests reached a model server", n)
	}
	// The model list is still a GET.
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/models: %d", resp.StatusCode)
	}
}

func TestUnknownModelsPassThroughWhenConfigured(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 1, NoTokenizer: true, EPP: func(o *epp.Options) {
		o.RequestPath.PassUnknownModels = true
	}})
	base, _ := startProxy(t, f.Director, proxy.Options{})
	body, _ := json.Marshal(map[string]any{"model": "an-adapter-loaded-on-demand", "prompt": []int{1, 2, 3, 4}})
	resp, got := post(t, base+"/v1/completions", string(body))
	if resp.StatusCode != 200 || forwarded(f) != 1 {
		t.Fatalf("status %d, %d forwarded: %s", resp.StatusCode, forwarded(f), got)
	}
}

func TestAPromptLongerThanTheContextIsRefusedPlainly(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 1})
	base, _ := startProxy(t, f.Director, proxy.Options{MaxBodyBytes: 4 << 20})
	// The stand-ins' /tokenize reports a context of 131072 tokens: the
	// EPP learns it with the first prompt it tokenizes.
	if resp, got := post(t, base+"/v1/completions", `{"model":"m","prompt":"a short prompt"}`); resp.StatusCode != 200 {
		t.Fatalf("a short prompt: %d %s", resp.StatusCode, got)
	}
	ids := make([]int, 131072+10)
	long, _ := json.Marshal(map[string]any{"model": "m", "prompt": ids})
	resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(long))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checkError(t, resp, 400, "maximum context length is 131072 tokens, and the prompt alone is 131082 tokens")
	if n := forwarded(f); n != 1 {
		t.Errorf("%d requests forwarded, want only the short one", n)
	}
}

// dial opens a raw connection, for a client that misbehaves below HTTP.
func dial(t *testing.T, base string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// A guard against a test that hangs, not a timing assertion.
	_ = c.SetDeadline(time.Now().Add(testkit.WaitLimit))
	return c
}

// closedByServer reads until the server closes the connection (or answers
// and then closes it), and reports what it read.
func closedByServer(t *testing.T, c net.Conn) string {
	t.Helper()
	got, err := io.ReadAll(c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %v (read %q)", testkit.WaitLimit, got)
	}
	return string(got)
}

func TestSlowBodiesAndIdleConnectionsAreCutOff(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{ReadTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond})
	body := completion(1, 8, false)

	t.Run("a body that never arrives in full", func(t *testing.T) {
		t.Parallel()
		c := dial(t, base)
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body[:10])
		closedByServer(t, c)
	})
	t.Run("a connection kept alive and idle", func(t *testing.T) {
		t.Parallel()
		c := dial(t, base)
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		rd := bufio.NewReader(c)
		resp, err := http.ReadResponse(rd, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Close {
			t.Fatalf("status %d, close %t: want a kept-alive success first", resp.StatusCode, resp.Close)
		}
		if rest, err := io.ReadAll(rd); len(rest) > 0 {
			t.Fatalf("after the response: %q, %v", rest, err)
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("the idle connection was kept for %v", testkit.WaitLimit)
		}
	})
	t.Run("headers that never end", func(t *testing.T) {
		t.Parallel()
		c := dial(t, base)
		fmt.Fprint(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
		closedByServer(t, c)
	})
}

// A response held back at the model server keeps its request in flight.
func holdResponses(t *testing.T, f *fleet.Fleet) (release func()) {
	gate := make(chan struct{})
	for _, s := range f.Servers {
		s.SetGate(gate)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			close(gate)
			for _, s := range f.Servers {
				s.SetGate(nil)
			}
		})
	}
	t.Cleanup(release)
	return release
}

func TestConcurrentRequestsPastTheLimitAreRefusedWith429(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	const limit = 3
	base, reg := startProxy(t, f.Director, proxy.Options{MaxConcurrent: limit})
	release := holdResponses(t, f)
	var streams []*http.Response
	for i := range limit {
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(completion(uint32(100*i), 8, true)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		streams = append(streams, resp)
	}
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(completion(9999, 8, false)))
	if err != nil {
		t.Fatal(err)
	}
	if resp.Header.Get("Retry-After") == "" {
		t.Error("no Retry-After")
	}
	checkError(t, resp, 429, "limit of 3 concurrent requests")
	resp.Body.Close()
	if got := testkit.Value(t, reg, "kvroute_proxy_refused_total", "reason", "concurrency"); got != 1 {
		t.Errorf("refused_total{concurrency} = %v", got)
	}
	if n := forwarded(f); n != limit {
		t.Errorf("%d requests forwarded, want the %d admitted", n, limit)
	}
	release()
	for _, s := range streams {
		_, _ = io.Copy(io.Discard, s.Body)
		s.Body.Close()
	}
	testkit.WaitFor(t, "the admitted requests to end", func() error {
		if seen := testkit.Value(t, reg, "kvroute_proxy_active_requests"); seen != 0 {
			return fmt.Errorf("testkit.Value(t, reg, \"kvroute_proxy_active_requests\") is %v, want %v", seen, 0)
		}
		return nil
	})
	resp, body := post(t, base+"/v1/completions", completion(9999, 8, false))
	if resp.StatusCode != 200 {
		t.Fatalf("after the others ended: %d %s", resp.StatusCode, body)
	}
}

// Clients send 1 MiB bodies at once and keep their requests in flight:
// each is charged ten times its size while it is parsed and routed, and
// its size while it is forwarded. The bodies the proxy holds stay within
// its budget, and the rest are refused with 503 naming the limit.
func TestBodyBytesInFlightStayWithinTheirBudget(t *testing.T) {
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	const budget, bodySize, clients = 20 << 20, 1 << 20, 32
	base, reg := startProxy(t, f.Director, proxy.Options{MaxBodyBytes: 2 << 20, MaxInFlightBytes: budget})
	release := holdResponses(t, f)
	// One 1 MiB body, shared by every client: a valid completion padded
	// with spaces.
	ids := completion(1, 8, true)
	payload := []byte(ids[:len(ids)-1] + strings.Repeat(" ", bodySize-len(ids)) + "}")
	before := uint64(testkit.LiveHeap())

	type result struct {
		resp *http.Response
		err  error
	}
	results := make(chan result, clients)
	for range clients {
		go func() {
			resp, err := http.Post(base+"/v1/completions", "application/json", bytes.NewReader(payload))
			if err == nil && resp.StatusCode == 200 {
				_, err = bufio.NewReader(resp.Body).ReadString('\n')
			}
			results <- result{resp, err}
		}()
	}
	var admitted []*http.Response
	refused := 0
	for range clients {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.resp.StatusCode == 200 {
			admitted = append(admitted, r.resp)
			continue
		}
		checkError(t, r.resp, 503, "limit of 20971520 bytes")
		r.resp.Body.Close()
		refused++
	}
	grown := int64(uint64(testkit.LiveHeap())) - int64(before)
	t.Logf("heap grew by %d MiB with %d bodies of 1 MiB in flight (budget %d MiB), %d refused", grown>>20, len(admitted), budget>>20, refused)
	if len(admitted) == 0 || len(admitted) > budget/bodySize || refused+len(admitted) != clients {
		t.Errorf("%d admitted and %d refused of %d: want some admitted, at most %d", len(admitted), refused, clients, budget/bodySize)
	}
	// The admitted bodies, once each, plus room for buffers and the
	// requests in flight; every body would be 32 MiB.
	if limit := int64(budget + 8<<20); grown > limit {
		t.Errorf("heap grew by %d MiB with %d bodies in flight, over the budget of %d MiB plus slack", grown>>20, len(admitted), budget>>20)
	}
	if got := testkit.Value(t, reg, "kvroute_proxy_refused_total", "reason", "body_bytes"); got != float64(refused) {
		t.Errorf("refused_total{body_bytes} = %v, want %d", got, refused)
	}
	release()
	for _, r := range admitted {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
}

// A body is charged ten times its size while it is parsed and routed,
// then its size while it is forwarded. With requests held in flight, one
// after another, the proxy admits as many 80 KiB chat bodies as leave
// room for the next one's decoded charge (800 KiB of 1 MiB: three), not
// as many as their raw bytes would allow (thirteen).
func TestABodyIsChargedAtItsDecodedSizeWhileRouted(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	const budget, size = 1 << 20, 80 << 10
	base, reg := startProxy(t, f.Director, proxy.Options{MaxBodyBytes: budget / 10, MaxInFlightBytes: budget})
	release := holdResponses(t, f)
	// A short conversation padded with white space to 80 KiB, so that the
	// simulated engines have room for its tokens.
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]` + strings.Repeat(" ", size) + `}`
	var held []*http.Response
	defer func() {
		release()
		for _, r := range held {
			_, _ = io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
	}()
	for range 3 {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, resp)
		if resp.StatusCode != 200 {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("request %d: %d %s", len(held), resp.StatusCode, b)
		}
	}
	resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	checkError(t, resp, 503, "charged at 10× their size while routed")
	resp.Body.Close()
	// Routed, each holds its body alone.
	if got := testkit.Value(t, reg, "kvroute_proxy_request_bytes_in_flight"); got != float64(3*len(body)) {
		t.Errorf("%v bytes in flight with three requests held, want their bodies' %d", got, 3*len(body))
	}
	if got := testkit.Value(t, reg, "kvroute_proxy_refused_total", "reason", "body_bytes"); got != 1 {
		t.Errorf("refused_total{body_bytes} = %v, want 1", got)
	}
	if _, err := proxy.New(f.Director, proxy.Options{Addr: "127.0.0.1:0", MaxBodyBytes: budget/10 + 1, MaxInFlightBytes: budget}); err == nil ||
		!strings.Contains(err.Error(), "charged") {
		t.Errorf("a body limit whose decoded charge exceeds the budget: %v, want an error", err)
	}
}

// The read timeout bounds reading a request, not the response: a stream
// outlives it.
func TestAStreamOutlivesTheReadTimeout(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	base, _ := startProxy(t, f.Director, proxy.Options{ReadTimeout: 100 * time.Millisecond})
	release := holdResponses(t, f)
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(completion(5, 8, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if _, err := rd.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	// A slow body started after the stream is cut off: by then the read
	// timeout has passed for the stream too.
	c := dial(t, base)
	fmt.Fprint(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
	closedByServer(t, c)
	release()
	rest, err := io.ReadAll(rd)
	if err != nil || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream after the read timeout: %q, %v", rest, err)
	}
}
