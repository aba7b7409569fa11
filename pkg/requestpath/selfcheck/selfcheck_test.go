package selfcheck

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/testkit"
)

const bs = 4

// pick is a pick of addr for a prompt of tokens tokens, whose prefix info
// says held confirmed blocks and spec speculative ones, in state.
func pick(addr string, tokens, held, spec int, state datalayer.StreamState) *director.Pick {
	c := datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr}, datalayer.Metrics{}, state)
	info := datalayer.PrefixCacheInfo{MatchBlocks: held + spec, TotalBlocks: tokens / bs, BlockSizeTokens: bs,
		SpeculativeBlocks: spec, State: state, Exact: state.Exact()}
	info.BlocksByTier[0] = held
	c.Put(datalayer.PrefixCacheMatchInfoKey, info)
	return &director.Pick{Request: &request.Request{TokenIDs: make([]uint32, tokens)}, Candidates: []*datalayer.Candidate{c}, Targets: []string{addr}}
}

func response(addr string, prompt, cached int) director.Served {
	return director.Served{Endpoint: addr, Status: 200,
		Usage: openai.Usage{PromptTokens: prompt, CachedTokens: cached, CachedTokensKnown: true}}
}

func TestAResponseIsJudgedAgainstThePredictionForTheEndpointThatServedIt(t *testing.T) {
	t.Parallel()
	const a = "10.0.0.1:8000"
	exact, partial := datalayer.StreamExact, datalayer.StreamPartial
	tests := []struct {
		name string
		p    *director.Pick
		s    director.Served
		want string
	}{
		{"an engine that hits what the index predicted agrees", pick(a, 40, 8, 0, exact), response(a, 40, 32), ResultAgree},
		{"a block evicted between pick and prefill is within tolerance", pick(a, 40, 8, 0, exact), response(a, 40, 28), ResultAgree},
		{"an engine finding much less than predicted is an overclaim", pick(a, 40, 8, 0, exact), response(a, 40, 8), ResultOver},
		{"an engine finding much more than predicted is under", pick(a, 80, 2, 0, exact), response(a, 80, 60), ResultUnder},
		{"speculative blocks the engine hits agree", pick(a, 40, 2, 6, exact), response(a, 40, 32), ResultAgree},
		{"speculative blocks the engine misses are no overclaim", pick(a, 40, 2, 6, exact), response(a, 40, 8), ResultAgree},
		{"a partial stream finding more is judged under", pick(a, 80, 2, 0, partial), response(a, 80, 60), ResultUnder},
		{"an uncertain stream is not checked", pick(a, 40, 8, 0, datalayer.StreamUncertain), response(a, 40, 0), ResultUnchecked},
		{"a stream without events is not checked", pick(a, 40, 8, 0, datalayer.StreamNone), response(a, 40, 0), ResultUnchecked},
		{"a server that does not report cached tokens is not checked", pick(a, 40, 8, 0, exact),
			director.Served{Endpoint: a, Status: 200, Usage: openai.Usage{PromptTokens: 40}}, ResultUnchecked},
		{"an error is not checked", pick(a, 40, 8, 0, exact), director.Served{Endpoint: a, Status: 503}, ResultUnchecked},
		{"a response from an endpoint the pick did not consider is not checked", pick(a, 40, 8, 0, exact), response("10.0.0.9:8000", 40, 0), ResultUnchecked},
	}
	c, err := New(Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := c.Judge(tt.p, tt.s); got.Result != tt.want {
				t.Fatalf("verdict %+v, want %s", got, tt.want)
			}
		})
	}
}

func TestSustainedDisagreementDistrustsTheEndpointOncePerCooldown(t *testing.T) {
	t.Parallel()
	const a, b = "10.0.0.1:8000", "10.0.0.2:8000"
	now := time.Unix(1000, 0)
	var distrusted []string
	c, err := New(Options{Window: 8, MinSamples: 4, Cooldown: time.Minute, Now: func() time.Time { return now },
		Distrust: func(addr string) { distrusted = append(distrusted, addr) }, Logger: slog.New(slog.DiscardHandler)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// b agrees throughout; a disagrees once in a while, then all the time.
	for i := range 8 {
		c.ObserveResponse(pick(b, 40, 8, 0, datalayer.StreamExact), response(b, 40, 32))
		cached := 32
		if i%4 == 0 {
			cached = 0
		}
		c.ObserveResponse(pick(a, 40, 8, 0, datalayer.StreamExact), response(a, 40, cached))
	}
	if len(distrusted) != 0 {
		t.Fatalf("distrusted %v on occasional disagreement", distrusted)
	}
	for range 8 {
		c.ObserveResponse(pick(a, 40, 8, 0, datalayer.StreamExact), response(a, 40, 0))
	}
	if len(distrusted) != 1 || distrusted[0] != a {
		t.Fatalf("distrusted %v, want %s once", distrusted, a)
	}
	now = now.Add(2 * time.Minute)
	for range 8 {
		c.ObserveResponse(pick(a, 40, 8, 0, datalayer.StreamExact), response(a, 40, 0))
	}
	if len(distrusted) != 2 {
		t.Fatalf("distrusted %v after the cooldown, want twice", distrusted)
	}
}

func TestTheFleetAlarmSaysWhatToCheckAndClears(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		kind   string
		bad    func(addr string) (*director.Pick, director.Served)
		saying string
	}{
		{"engines finding far less than predicted raise an overclaim", AlarmOverclaim, func(addr string) (*director.Pick, director.Served) {
			return pick(addr, 64, 2, 12, datalayer.StreamExact), response(addr, 64, 4)
		}, "far fewer cached prompt tokens than the prefix index predicted"},
		{"engines finding far more than predicted raise a blind alarm", AlarmBlind, func(addr string) (*director.Pick, director.Served) {
			return pick(addr, 64, 0, 0, datalayer.StreamExact), response(addr, 64, 56)
		}, "the prefix index never predicted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var log testkit.LogBuffer
			c, err := New(Options{FleetWindow: 64, FleetMinTokens: 256, Logger: slog.New(slog.NewTextHandler(&log, nil))}, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 64 {
				addr := []string{"10.0.0.1:8000", "10.0.0.2:8000"}[i%2]
				c.ObserveResponse(tt.bad(addr))
			}
			if !c.Alarm(tt.kind) || !strings.Contains(log.String(), tt.saying) || !strings.Contains(log.String(), "tokenizer") {
				t.Fatalf("alarm %s %v; log:\n%s", tt.kind, c.Alarm(tt.kind), log.String())
			}
			if n := strings.Count(log.String(), "level=ERROR"); n != 1 {
				t.Fatalf("the alarm was logged %d times, want once", n)
			}
			for i := range 64 {
				addr := []string{"10.0.0.1:8000", "10.0.0.2:8000"}[i%2]
				c.ObserveResponse(pick(addr, 64, 12, 0, datalayer.StreamExact), response(addr, 64, 48))
			}
			if c.Alarm(tt.kind) || !strings.Contains(log.String(), "alarm cleared") {
				t.Fatalf("alarm %s still raised after agreement; log:\n%s", tt.kind, log.String())
			}
		})
	}
}
