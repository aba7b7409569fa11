package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// startServer runs an ext_proc server over d until the test ends and
// returns a client connected to it.
func startServer(t testing.TB, d director.Handler, o extproc.Options) (*extproc.Server, *envoy.Client, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	o.Registerer = reg
	s, err := extproc.New(d, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	c, err := envoy.Dial(s.Addr(), o.Plaintext)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("ext_proc server: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("ext_proc server did not stop within 10s of cancel")
		}
	})
	return s, c, reg
}

func completion(tokens []uint32, stream bool) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": tokens, "max_tokens": 3, "stream": stream})
	return b
}

func tokens(base uint32, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = base + uint32(i)
	}
	return out
}

// checkRouted fails unless res is a pick whose header and metadata agree,
// name fleet endpoints, and carry the body unchanged with its length.
func checkRouted(t *testing.T, f *fleet.Fleet, res *envoy.Result, body []byte) string {
	t.Helper()
	if res.Immediate != nil {
		t.Fatalf("refused with %d: %s", res.Immediate.GetStatus().GetCode(), res.Immediate.GetBody())
	}
	if res.Destination == "" || res.Destination != res.MetadataDestination {
		t.Fatalf("header destination %q, metadata destination %q: want equal and non-empty", res.Destination, res.MetadataDestination)
	}
	for _, a := range strings.Split(res.Destination, ",") {
		if f.Server(a) == nil {
			t.Fatalf("destination %q names no endpoint of the fleet", a)
		}
	}
	if !res.ClearRouteCache {
		t.Error("the route cache is not cleared, so Envoy would route on the stale route")
	}
	if string(res.Body) != string(body) {
		t.Errorf("body passed on = %q, want %q", res.Body, body)
	}
	if cl := res.SetHeaders["content-length"]; body != nil && cl != strconv.Itoa(len(body)) {
		t.Errorf("content-length = %q, want %d", cl, len(body))
	}
	primary, _, _ := strings.Cut(res.Destination, ",")
	return primary
}

func TestPicksFollowTheCacheEndToEnd(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 4})
	_, c, _ := startServer(t, f.Director, extproc.Options{})
	up := envoy.HTTPUpstream(http.DefaultClient)
	ctx := context.Background()

	tests := []struct {
		name string
		body []byte
		held []uint32
	}{
		{"a prompt given as token ids", completion(tokens(1000, 64), false), tokens(1000, 64)},
		{"a streamed prompt given as token ids", completion(tokens(5000, 40), true), tokens(5000, 40)},
		{"a text prompt tokenized through the model server", []byte(`{"model":"m","prompt":"` +
			strings.Repeat("the quick brown fox jumps over the lazy dog ", 8) + `"}`),
			fleet.TokenizeText(strings.Repeat("the quick brown fox jumps over the lazy dog ", 8))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := envoy.Request{Path: "/v1/completions", Body: tt.body, Chunks: 3, RequestID: "first"}
			res, err := c.Do(ctx, req, up)
			if err != nil {
				t.Fatal(err)
			}
			first := checkRouted(t, f, res, tt.body)
			if res.SetHeaders["x-request-id"] != "first" {
				t.Errorf("x-request-id = %q, want the client's kept", res.SetHeaders["x-request-id"])
			}
			if !strings.Contains(string(res.ResponseBody), `"prompt_tokens":`) {
				t.Errorf("response passed back = %q, want the model server's", res.ResponseBody)
			}
			f.WaitHeld(t, first, tt.held)
			for i := range 5 {
				req.RequestID = ""
				res, err := c.Do(ctx, req, up)
				if err != nil {
					t.Fatal(err)
				}
				if got := checkRouted(t, f, res, tt.body); got != first {
					t.Fatalf("repeat %d went to %s; %s holds the whole prompt", i, got, first)
				}
				if res.SetHeaders["x-request-id"] == "" {
					t.Error("no x-request-id was generated")
				}
				// The engine recomputes the prompt's last block, as vLLM does.
				if got, want := cachedTokens(t, res.ResponseBody), (len(tt.held)-1)/4*4; got != want {
					t.Errorf("repeat %d: the engine found %d tokens cached, want %d", i, got, want)
				}
			}
		})
	}
	// Every routed request was accounted once with its usage.
	if n := testkit.HistCount(t, f.Metrics, "inference_objective_input_tokens"); n != 18 {
		t.Errorf("responses accounted with usage = %d, want 18", n)
	}
}

func TestConcurrentAnswersToTheSameEndpointsEachCarryTheirOwnRequest(t *testing.T) {
	t.Parallel()
	// Answers share what names their targets, and make the rest in their
	// stream's memory: streams answered at once must not mix them up, nor
	// the chunks of a body passed back.
	f := fleet.Start(t, fleet.Options{Endpoints: 2})
	_, c, _ := startServer(t, f.Director, extproc.Options{Plaintext: true})
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				id := fmt.Sprintf("req-%d-%d-%s", w, i, strings.Repeat("x", (w*10+i)%80))
				n := 16 + w*i
				if w == 0 {
					n = 30000 // a body passed back in several chunks
				}
				body := completion(tokens(uint32(100*w+i), n), false)
				res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body, RequestID: id}, nil)
				if err != nil {
					t.Error(err)
					return
				}
				checkRouted(t, f, res, body)
				if got := res.SetHeaders["x-request-id"]; got != id {
					t.Errorf("x-request-id = %q, want %q", got, id)
				}
			}
		}()
	}
	wg.Wait()
}

func TestBufferedModeRoutesWithOneAnswerPerMessage(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{})
	_, c, _ := startServer(t, f.Director, extproc.Options{DefaultMode: extproc.Buffered, Plaintext: true})
	body := completion(tokens(7, 33), false)
	for _, trailers := range []bool{false, true} {
		res, err := c.Do(context.Background(), envoy.Request{
			Path: "/v1/completions", Body: body, Mode: extproc.Buffered, Trailers: trailers,
		}, envoy.HTTPUpstream(http.DefaultClient))
		if err != nil {
			t.Fatalf("trailers %t: %v", trailers, err)
		}
		checkRouted(t, f, res, body)
		if res.ResponseChunks != 1 || !strings.Contains(string(res.ResponseBody), `"usage"`) {
			t.Errorf("trailers %t: response passed back in %d chunks: %q", trailers, res.ResponseChunks, res.ResponseBody)
		}
	}
}

func TestMalformedRequestsAreRefusedWithAReason(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	_, c, _ := startServer(t, f.Director, extproc.Options{MaxBodyBytes: 4096})
	tests := []struct {
		name   string
		req    envoy.Request
		status int
		reason string
	}{
		{"a body that is not JSON", envoy.Request{Path: "/v1/completions", Body: []byte("model=m")}, 400, ""},
		{"an empty completions body", envoy.Request{Path: "/v1/completions", Body: []byte{}, Chunks: 1}, 400, ""},
		{"a completion without a model", envoy.Request{Path: "/v1/completions", Body: []byte(`{"prompt":"hi"}`)}, 400, "model"},
		{"a negative token id", envoy.Request{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":[1,-2]}`)}, 400, "prompt"},
		{"a chat without messages", envoy.Request{Path: "/v1/chat/completions", Body: []byte(`{"model":"m"}`)}, 400, "messages"},
		{"trailing garbage after the JSON", envoy.Request{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"a"} x`)}, 400, ""},
		{"a body over the limit in many chunks", envoy.Request{Path: "/v1/completions",
			Body: completion(tokens(1, 2000), false), Chunks: 16}, 413, "4096 bytes"},
		{"a body over the limit in one chunk", envoy.Request{Path: "/v1/completions",
			Body: completion(tokens(1, 2000), false)}, 413, "limit"},
		{"a declared length over the limit", envoy.Request{Path: "/v1/completions",
			Body: completion(tokens(1, 8), false), Headers: map[string]string{"content-length": "5000"}}, 413, "5000 bytes"},
		{"a subset hint naming no endpoint of the pool", envoy.Request{Path: "/v1/completions",
			Body: completion(tokens(1, 8), false), Subset: []string{"10.9.9.9:8000"}}, 503, "subset"},
		{"an empty subset hint", envoy.Request{Path: "/v1/completions",
			Body: completion(tokens(1, 8), false), Subset: []string{}}, 503, "subset"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res, err := c.Do(context.Background(), tt.req, nil)
			if err != nil {
				t.Fatal(err)
			}
			ir := res.Immediate
			if ir == nil {
				t.Fatalf("routed to %q; want refused with %d", res.Destination, tt.status)
			}
			if got := int(ir.GetStatus().GetCode()); got != tt.status {
				t.Fatalf("status %d, want %d (body %s)", got, tt.status, ir.GetBody())
			}
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil {
				t.Fatalf("error body %q is not JSON: %v", ir.GetBody(), err)
			}
			if e.Error.Code != tt.status || e.Error.Type == "" || e.Error.Message == "" || !strings.Contains(e.Error.Message, tt.reason) {
				t.Errorf("error body %s: want code %d, a type, and a message mentioning %q", ir.GetBody(), tt.status, tt.reason)
			}
			if !hasHeader(ir.GetHeaders().GetSetHeaders(), "content-type", "application/json") {
				t.Error("the error is not labelled application/json")
			}
		})
	}
}

func TestTheSubsetHintIsRespected(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{Endpoints: 5, NoTokenizer: true})
	_, c, _ := startServer(t, f.Director, extproc.Options{})
	a, b := f.Servers[1].Addr, f.Servers[3].Addr
	tests := []struct {
		name     string
		req      envoy.Request
		allowed  []string
		bodyless bool
	}{
		{"a list of one endpoint", envoy.Request{Subset: []string{b}}, []string{b}, false},
		{"a list of two endpoints", envoy.Request{Subset: []string{a, b}}, []string{a, b}, false},
		{"a comma-separated string", envoy.Request{Subset: []string{a, b}, SubsetAsString: true}, []string{a, b}, false},
		{"a list whose entry is comma-separated", envoy.Request{Subset: []string{a + " , " + b}}, []string{a, b}, false},
		{"a hint with an address outside the pool", envoy.Request{Subset: []string{"10.1.1.1:1", a}}, []string{a}, false},
		{"a bodyless request", envoy.Request{Method: "GET", Subset: []string{b}}, []string{b}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for i := range 10 {
				req := tt.req
				req.Path = "/v1/completions"
				var body []byte
				if !tt.bodyless {
					body = completion(tokens(uint32(100*i), 12), false)
					req.Body = body
				} else {
					req.Path = "/v1/models"
				}
				res, err := c.Do(context.Background(), req, nil)
				if err != nil {
					t.Fatal(err)
				}
				checkRouted(t, f, res, body)
				for _, d := range strings.Split(res.Destination, ",") {
					if !slices.Contains(tt.allowed, d) {
						t.Fatalf("routed to %s, outside the subset %v", d, tt.allowed)
					}
				}
			}
		})
	}
}

func TestBodylessRequestsGoToAnyReadyEndpoint(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	_, c, _ := startServer(t, f.Director, extproc.Options{})
	seen := map[string]bool{}
	for range 60 {
		res, err := c.Do(context.Background(), envoy.Request{Method: "GET", Path: "/v1/models"},
			envoy.HTTPUpstream(http.DefaultClient))
		if err != nil {
			t.Fatal(err)
		}
		checkRouted(t, f, res, nil)
		if _, ok := res.SetHeaders["content-length"]; ok {
			t.Error("a bodyless request got a content-length")
		}
		if !strings.Contains(string(res.ResponseBody), `"object":"list"`) {
			t.Fatalf("response %q", res.ResponseBody)
		}
		seen[res.Destination] = true
	}
	if len(seen) != len(f.Servers) {
		t.Errorf("60 bodyless requests went to %d of %d endpoints; want them spread at random", len(seen), len(f.Servers))
	}
}

func TestBodiesSplitAtEveryByteBoundaryArriveWhole(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	_, c, _ := startServer(t, f.Director, extproc.Options{Plaintext: true})
	body := []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9],"stream":false}`)
	check := func(splits []int) {
		res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body, Splits: splits}, nil)
		if err != nil {
			t.Fatalf("splits %v: %v", splits, err)
		}
		checkRouted(t, f, res, body)
	}
	for i := 0; i <= len(body); i++ {
		check([]int{i})
	}
	every := make([]int, len(body))
	for i := range every {
		every[i] = i
	}
	check(every) // one byte per chunk, led by an empty one
}

func TestALargeBodyGoesBackInChunksEnvoyAccepts(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	_, c, _ := startServer(t, f.Director, extproc.Options{})
	body := completion(tokens(0, 40000), false) // ~270 KB: several 64 KiB answers
	res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body, Chunks: 7}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRouted(t, f, res, body)
}

func TestSSEResponsesPassThroughAndAreAccounted(t *testing.T) {
	t.Parallel()
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	_, c, reg := startServer(t, f.Director, extproc.Options{})
	body := completion(tokens(300, 20), true)
	res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body},
		func(ctx context.Context, target, path string, headers map[string]string, b []byte) (*envoy.Response, error) {
			sse := "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":16}}}\n\ndata: [DONE]\n\n"
			return &envoy.Response{Status: 200, ContentType: "text/event-stream",
				Parts: envoy.Split([]byte(sse), nil, 9), Served: target, Trailers: true}, nil
		})
	if err != nil {
		t.Fatal(err)
	}
	checkRouted(t, f, res, body)
	if res.ResponseChunks != 9 || !strings.HasSuffix(string(res.ResponseBody), "data: [DONE]\n\n") {
		t.Errorf("response passed back in %d chunks as %q", res.ResponseChunks, res.ResponseBody)
	}
	if got := testkit.HistSum(t, f.Metrics, "inference_objective_prompt_cached_tokens"); got != 16 {
		t.Errorf("cached tokens accounted = %v, want 16 from the SSE usage", got)
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_response_body_bytes_total"); got != float64(len(res.ResponseBody)) {
		t.Errorf("response bytes counted = %v, want %d", got, len(res.ResponseBody))
	}
}

func TestCancelledStreamsLeakNothingAndAreAccountedOnce(t *testing.T) {
	f := fleet.Start(t, fleet.Options{NoTokenizer: true})
	_, c, reg := startServer(t, f.Director, extproc.Options{Plaintext: true})
	body := completion(tokens(1, 64), false)
	// Warm the connection so that its goroutines are in the baseline.
	if _, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body}, nil); err != nil {
		t.Fatal(err)
	}
	before := testkit.SettledGoroutines(0)
	picksBefore := testkit.HistCount(t, f.Metrics, "inference_objective_request_duration_seconds")

	const n = 40
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		if i%2 == 0 {
			// Cut after the pick, while the response is under way.
			_, err := c.Do(ctx, envoy.Request{Path: "/v1/completions", Body: body},
				func(context.Context, string, string, map[string]string, []byte) (*envoy.Response, error) {
					cancel()
					return nil, context.Canceled
				})
			if err == nil {
				t.Fatal("a cancelled exchange reported success")
			}
		} else {
			// Cut in the middle of the request body.
			ps, err := c.Process(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := ps.Send(headersOnly("/v1/completions")); err != nil {
				t.Fatal(err)
			}
			if err := ps.Send(bodyChunk(body[:10], false)); err != nil {
				t.Fatal(err)
			}
			cancel()
		}
		cancel()
	}
	testkit.WaitFor(t, "every stream to end", func() error {
		if seen := testkit.Value(t, reg, "kvroute_extproc_active_streams"); seen != 0 {
			return fmt.Errorf("testkit.Value(t, reg, \"kvroute_extproc_active_streams\") is %v, want %v", seen, 0)
		}
		return nil
	})
	if after := testkit.SettledGoroutines(before); after > before {
		t.Errorf("goroutines: %d before, %d after %d cancelled streams", before, after, n)
	}
	// Each of the n/2 streams that were picked was accounted exactly once.
	if got := testkit.HistCount(t, f.Metrics, "inference_objective_request_duration_seconds") - picksBefore; got != n/2 {
		t.Errorf("responses accounted = %d, want %d", got, n/2)
	}
}

func hasHeader(hs []*corev3.HeaderValueOption, k, v string) bool {
	for _, h := range hs {
		if h.GetHeader().GetKey() == k && (string(h.GetHeader().GetRawValue()) == v || h.GetHeader().GetValue() == v) {
			return true
		}
	}
	return false
}

func headersOnly(path string) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":path", RawValue: []byte(path)}, {Key: ":method", RawValue: []byte("POST")},
		}},
	}}}
}

func bodyChunk(b []byte, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: eos}}}
}

// cachedTokens reads a completion's usage, JSON or SSE.
func cachedTokens(t *testing.T, body []byte) int {
	t.Helper()
	if u, ok, err := openai.ParseUsage(body); err == nil && ok {
		return u.CachedTokens
	}
	var sc openai.SSEUsageScanner
	sc.Write(body)
	u, ok := sc.Usage()
	if !ok {
		t.Fatalf("no usage in %q", body)
	}
	return u.CachedTokens
}
