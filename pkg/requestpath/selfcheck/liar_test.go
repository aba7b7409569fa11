package selfcheck

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// generation is a pick of addr for a completion of a tokens-long prompt
// asking for maxTokens.
func generation(addr string, tokens, maxTokens int) *director.Pick {
	p := pick(addr, tokens, 0, 0, datalayer.StreamExact)
	p.Request.API, p.Request.MaxTokens = request.APICompletions, maxTokens
	return p
}

func answered(addr string, u openai.Usage) director.Served {
	return director.Served{Endpoint: addr, Status: 200, Usage: u}
}

func TestAResponseWhoseUsageCannotBeIsALie(t *testing.T) {
	t.Parallel()
	const a = "10.0.0.1:8000"
	tests := []struct {
		name string
		p    *director.Pick
		s    director.Served
		want string
	}{
		{"more cached tokens than the prompt has", generation(a, 40, 8),
			answered(a, openai.Usage{PromptTokens: 40, CachedTokens: 41, CompletionTokens: 8, CachedTokensKnown: true}), ImpossibleCachedAbovePrompt},
		{"a success with no output for a request that asked for some", generation(a, 40, 8),
			answered(a, openai.Usage{PromptTokens: 40, CompletionTokens: 0}), ImpossibleNoOutput},
		{"an honest answer", generation(a, 40, 8),
			answered(a, openai.Usage{PromptTokens: 40, CachedTokens: 36, CompletionTokens: 8, CachedTokensKnown: true}), ""},
		{"a whole prompt cached is not above it", generation(a, 40, 8),
			answered(a, openai.Usage{PromptTokens: 40, CachedTokens: 40, CompletionTokens: 1, CachedTokensKnown: true}), ""},
		{"more output than max_tokens is not judged: n choices add up", generation(a, 40, 8),
			answered(a, openai.Usage{PromptTokens: 40, CompletionTokens: 16}), ""},
		{"no output when max_tokens was not given is not judged", generation(a, 40, 0),
			answered(a, openai.Usage{PromptTokens: 40}), ""},
		{"a response without usage is not judged", generation(a, 40, 8), director.Served{Endpoint: a, Status: 200}, ""},
		{"an error's usage is not judged", generation(a, 40, 8),
			director.Served{Endpoint: a, Status: 500, Usage: openai.Usage{PromptTokens: 40, CachedTokens: 99}}, ""},
		{"a request other than a generation is not judged", pick(a, 40, 0, 0, datalayer.StreamExact),
			answered(a, openai.Usage{PromptTokens: 40, CachedTokens: 99}), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Impossible(tt.p, tt.s); got != tt.want {
				t.Fatalf("Impossible = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestALiarIsCountedAlarmedAndEjected(t *testing.T) {
	t.Parallel()
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	now := time.Unix(1000, 0)
	reg := prometheus.NewRegistry()
	logs := &testkit.LogBuffer{}
	var ejected []string
	c, err := New(Options{Cooldown: time.Minute, Now: func() time.Time { return now }, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Eject: func(addr string) { ejected = append(ejected, addr) }}, reg)
	if err != nil {
		t.Fatal(err)
	}
	c.ObserveResponse(generation(b, 40, 8), answered(b, openai.Usage{PromptTokens: 40, CompletionTokens: 8}))
	if c.Alarm(AlarmLiar) || len(ejected) != 0 {
		t.Fatal("an honest answer raised the liar alarm or ejected its endpoint")
	}
	c.ObserveResponse(generation(a, 40, 8), answered(a, openai.Usage{PromptTokens: 40, CachedTokens: 400, CompletionTokens: 8, CachedTokensKnown: true}))
	if len(ejected) != 1 || ejected[0] != a {
		t.Fatalf("ejected %v, want the liar %s", ejected, a)
	}
	if !c.Alarm(AlarmLiar) || testkit.Value(t, reg, "kvroute_selfcheck_alarm", "kind", AlarmLiar) != 1 {
		t.Fatal("the liar alarm is not raised")
	}
	if v := testkit.Value(t, reg, "kvroute_selfcheck_impossible_total", "endpoint", a, "reason", ImpossibleCachedAbovePrompt); v != 1 {
		t.Fatalf("impossible_total = %v, want 1", v)
	}
	if v := testkit.Value(t, reg, "kvroute_selfcheck_responses_total", "endpoint", a, "result", ResultImpossible); v != 1 {
		t.Fatalf("responses_total{result=impossible} = %v, want 1", v)
	}
	if !strings.Contains(logs.String(), "usage that cannot be") {
		t.Fatalf("no alarm log line:\n%s", logs)
	}
	now = now.Add(2 * time.Minute)
	c.ObserveResponse(generation(b, 40, 8), answered(b, openai.Usage{PromptTokens: 40, CompletionTokens: 8}))
	if c.Alarm(AlarmLiar) {
		t.Fatal("the liar alarm outlasted its cooldown with no lie since")
	}
	c.Forget(a)
	if f := testkit.Family(t, reg, "kvroute_selfcheck_impossible_total"); f != nil && len(f.GetMetric()) != 0 {
		t.Fatalf("the departed liar's series remain: %v", f.GetMetric())
	}
}

func TestAResponseEndingAfterItsEndpointLeftCountsNowhere(t *testing.T) {
	t.Parallel()
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	var mu sync.Mutex
	pool := map[string]bool{a: true, b: true}
	reg := prometheus.NewRegistry()
	var ejected []string
	c, err := New(Options{Logger: slog.New(slog.DiscardHandler),
		InPool: func(addr string) bool { mu.Lock(); defer mu.Unlock(); return pool[addr] },
		Eject:  func(addr string) { ejected = append(ejected, addr) }}, reg)
	if err != nil {
		t.Fatal(err)
	}
	c.ObserveResponse(pick(a, 40, 8, 0, datalayer.StreamExact), response(a, 40, 32))
	if v := testkit.Value(t, reg, "kvroute_selfcheck_responses_total", "endpoint", a, "result", ResultAgree); v != 1 {
		t.Fatalf("responses_total{result=agree} = %v while a is in the pool, want 1", v)
	}
	// a leaves: the pool drops it, then the checker forgets it; its
	// requests still in flight end after.
	mu.Lock()
	delete(pool, a)
	mu.Unlock()
	c.Forget(a)
	c.ObserveResponse(pick(a, 40, 8, 0, datalayer.StreamExact), response(a, 40, 0))
	c.ObserveResponse(generation(a, 40, 8), answered(a, openai.Usage{PromptTokens: 40, CachedTokens: 400, CompletionTokens: 8, CachedTokensKnown: true}))
	for _, name := range []string{"kvroute_selfcheck_responses_total", "kvroute_selfcheck_impossible_total",
		"kvroute_selfcheck_predicted_tokens_total", "kvroute_selfcheck_cached_tokens_total"} {
		if f := testkit.Family(t, reg, name); f != nil {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "endpoint" && l.GetValue() == a {
						t.Fatalf("%s has a series of the departed endpoint: %v", name, m)
					}
				}
			}
		}
	}
	c.mu.Lock()
	_, kept := c.endpoints[a]
	c.mu.Unlock()
	if kept || len(ejected) != 0 || c.Alarm(AlarmLiar) {
		t.Fatalf("the departed endpoint's window kept: %v, ejected %v, liar alarm %v; want none of them", kept, ejected, c.Alarm(AlarmLiar))
	}
}
