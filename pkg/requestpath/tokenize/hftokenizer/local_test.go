package hftokenizer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/remotetokenizer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// modelServer is a loopback /tokenize endpoint that answers every prompt
// with the ids of answer, counting the calls; block makes it hold each
// request until the client gives up.
type modelServer struct {
	*httptest.Server
	calls atomic.Int64
}

func newModelServer(t *testing.T, answer func(body map[string]any) []uint32, block bool) *modelServer {
	t.Helper()
	s := &modelServer{}
	release := make(chan struct{})
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.calls.Add(1)
		if block {
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ids := answer(body)
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "tokens": ids})
	}))
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(release) }) // runs first: lets Close finish
	return s
}

func newLocalWith(t *testing.T, server *modelServer, driftEvery int, reg prometheus.Registerer) *Local {
	t.Helper()
	var fallback tokenize.Tokenizer
	if server != nil {
		remote := remotetokenizer.New(remotetokenizer.Options{
			Endpoint:     func(string) (string, bool) { return server.URL, true },
			Timeout:      time.Second,
			CacheEntries: -1,
		}, nil)
		t.Cleanup(remote.Close)
		fallback = remote
	}
	l := NewLocal(LocalOptions{
		Tokenizers: map[string]*Tokenizer{"tiny": loadTiny(t, Options{Name: "tiny"})},
		Fallback:   fallback, DriftEvery: driftEvery,
	}, reg)
	t.Cleanup(l.Close)
	return l
}

func completion(model, prompt string) *request.Request {
	return &request.Request{API: request.APICompletions, Model: model, Prompt: prompt, AddSpecialTokens: true}
}

func TestLocalChoosesBetweenItsTokenizerAndTheFallback(t *testing.T) {
	t.Parallel()
	fixed := []uint32{7, 7, 7}
	for _, tc := range []struct {
		name       string
		req        *request.Request
		wantRemote bool
	}{
		{"a completion for a local model is tokenized in process", completion("tiny", "hello world!"), false},
		{"a chat for a local model is rendered and tokenized in process", &request.Request{
			API: request.APIChatCompletions, Model: "tiny",
			Chat: &request.Chat{Messages: json.RawMessage(`[{"role":"user","content":"hello"}]`), AddGenerationPrompt: true},
		}, false},
		{"another model goes to the model server", completion("other", "hello"), true},
		{"a LoRA adapter goes to the model server", &request.Request{API: request.APICompletions, Model: "tiny", LoRA: "tiny", Prompt: "x"}, true},
		{"a chat with its own template goes to the model server", &request.Request{
			API: request.APIChatCompletions, Model: "tiny",
			Chat: &request.Chat{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), ChatTemplate: "{{ messages }}"},
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server := newModelServer(t, func(map[string]any) []uint32 { return fixed }, false)
			l := newLocalWith(t, server, -1, prometheus.NewRegistry())
			got, err := l.Tokenize(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantRemote {
				if !slices.Equal(got, fixed) || server.calls.Load() != 1 {
					t.Fatalf("got %v after %d calls, want the server's ids", got, server.calls.Load())
				}
				return
			}
			want, err := encodeRequest(l.o.Tokenizers["tiny"], tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) || server.calls.Load() != 0 {
				t.Fatalf("got %v after %d calls, want local ids %v", got, server.calls.Load(), want)
			}
		})
	}
}

func TestLocalWithoutFallbackRefusesUnknownModels(t *testing.T) {
	t.Parallel()
	l := newLocalWith(t, nil, -1, nil)
	if _, err := l.Tokenize(context.Background(), completion("other", "x")); !errors.Is(err, tokenize.ErrUnsupported) {
		t.Fatalf("err %v, want tokenize.ErrUnsupported", err)
	}
}

func TestDriftCheckCountsMismatchesWithTheModelServer(t *testing.T) {
	t.Parallel()
	tiny := loadTiny(t, Options{})
	for _, tc := range []struct {
		name      string
		perturb   bool
		wantDrift float64
	}{
		{"agreeing ids count as a match", false, 0},
		{"differing ids count as drift", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			server := newModelServer(t, func(body map[string]any) []uint32 {
				ids, _ := tiny.Encode(body["prompt"].(string), true)
				if tc.perturb {
					ids[len(ids)-1]++
				}
				return ids
			}, false)
			reg := prometheus.NewRegistry()
			l := newLocalWith(t, server, 1, reg)
			if _, err := l.Tokenize(context.Background(), completion("tiny", "hello world!")); err != nil {
				t.Fatal(err)
			}
			waitForChecks(t, l, 1)
			if got := testutil.ToFloat64(l.m.drift.WithLabelValues("tiny")); got != tc.wantDrift {
				t.Errorf("kvroute_tokenizer_drift_total %v, want %v", got, tc.wantDrift)
			}
			if got := testutil.ToFloat64(l.m.checks.WithLabelValues("tiny", "match")); got != 1-tc.wantDrift {
				t.Errorf("matching checks %v, want %v", got, 1-tc.wantDrift)
			}
		})
	}
}

// A request's raw chat fields are the body's memory, which the request
// path reuses once the response is handled; a drift check still under way
// then must ask about the messages the request had.
func TestADriftCheckAsksAboutTheMessagesAsTheyWereWhenTheirMemoryIsReused(t *testing.T) {
	t.Parallel()
	const messages = `[{"role":"user","content":"hello"}]`
	got := make(chan any, 1)
	server := newModelServer(t, func(body map[string]any) []uint32 {
		got <- body["messages"]
		return []uint32{1}
	}, false)
	l := newLocalWith(t, server, 1, nil)
	body := []byte(messages)
	req := &request.Request{API: request.APIChatCompletions, Model: "tiny",
		Chat: &request.Chat{Messages: body, AddGenerationPrompt: true}}
	if _, err := l.Tokenize(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	copy(body, `[{"role":"user","content":"XXXXX"}]`) // the next request's body
	var want any
	if err := json.Unmarshal([]byte(messages), &want); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-got:
		if fmt.Sprint(m) != fmt.Sprint(want) {
			t.Errorf("the drift check asked about %v, want %v", m, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no drift check reached the model server")
	}
}

func TestCloseStopsDriftChecksInFlight(t *testing.T) {
	t.Parallel()
	server := newModelServer(t, nil, true)
	l := newLocalWith(t, server, 1, nil)
	if _, err := l.Tokenize(context.Background(), completion("tiny", "hello")); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the drift check to reach the server", func() error {
		if seen := server.calls.Load(); seen <= 0 {
			return fmt.Errorf("server.calls.Load() is %v, want > %v", seen, 0)
		}
		return nil
	})
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not stop the drift check")
	}
	if got := testutil.ToFloat64(l.m.checks.WithLabelValues("tiny", "error")); got != 1 {
		t.Errorf("errored checks %v, want 1", got)
	}
}

func TestLoadModelsRejectsBadSpecs(t *testing.T) {
	t.Parallel()
	for _, specs := range [][]string{{"noequals"}, {"=dir"}, {"m="}, {"m=" + tinyDir, "m=" + tinyDir}, {"m=/does/not/exist"}} {
		if _, err := LoadModels(specs, Options{}); err == nil {
			t.Errorf("LoadModels(%q) succeeded", specs)
		}
	}
	got, err := LoadModels([]string{"a=" + tinyDir, "b=" + tinyDir + "/" + TokenizerFile}, Options{})
	if err != nil || len(got) != 2 || !got["b"].HasChatTemplate() {
		t.Fatalf("LoadModels = %v, %v", got, err)
	}
}

// waitForChecks waits until n drift checks have finished, whatever their
// result.
func waitForChecks(t *testing.T, l *Local, n float64) {
	t.Helper()
	testkit.WaitFor(t, fmt.Sprintf("%v drift checks to finish", n), func() error {
		var sum float64
		for _, result := range []string{"match", "mismatch", "error"} {
			sum += testutil.ToFloat64(l.m.checks.WithLabelValues("tiny", result))
		}
		if sum < n {
			return fmt.Errorf("sum is %v, want >= %v", sum, n)
		}
		return nil
	})
}
