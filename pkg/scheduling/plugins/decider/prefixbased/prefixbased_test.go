package prefixbased_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/prefixbased"
)

// decodePod is a decode candidate holding cached of blockSize-token blocks,
// in tier, of a prompt of total blocks.
func decodePod(total, cached, blockSize int, tier events.Tier) *datalayer.Candidate {
	info := datalayer.PrefixCacheInfo{TotalBlocks: total, MatchBlocks: cached, BlockSizeTokens: blockSize, MatchTokens: cached * blockSize, Exact: true, State: datalayer.StreamExact}
	info.BlocksByTier[tier] = cached
	c := datalayer.NewCandidate(&datalayer.Endpoint{Name: "d", Address: "d:8000"}, datalayer.Metrics{}, datalayer.StreamExact)
	c.Put(datalayer.PrefixCacheMatchInfoKey, info)
	return c
}

func decide(t *testing.T, raw string, tokens int, decode *datalayer.Candidate) framework.Verdict {
	t.Helper()
	p, err := prefixbased.Factory("d", json.RawMessage(raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	req := &request.Request{TokenIDs: make([]uint32, tokens)}
	return p.(framework.Decider).Disaggregate(context.Background(), schedtest.Cycle(), req, decode)
}

// The table of upstream's own tests: a 10-token prompt, blocks of one
// token, the decode pod holding some of it.
func TestTheDecisionTableOfUpstreamsTests(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		params string
		cached int
		split  bool
		reason string
	}{
		{"threshold 5 with 8 cached: 2 uncached stay", `{"nonCachedTokens": 5}`, 8, false, framework.ReasonCached},
		{"threshold 5 with 5 cached: 5 uncached split", `{"nonCachedTokens": 5}`, 5, true, framework.ReasonUncached},
		{"threshold 3 with 2 cached: 8 uncached split", `{"nonCachedTokens": 3}`, 2, true, framework.ReasonUncached},
		{"threshold 1 with all 10 cached stays", `{"nonCachedTokens": 1}`, 10, false, framework.ReasonCached},
		{"threshold 0 never splits", `{"nonCachedTokens": 0}`, 0, false, framework.ReasonDisabled},
		{"no parameters never split", `{}`, 0, false, framework.ReasonDisabled},
		{"a prompt under promptTokens 20 stays", `{"nonCachedTokens": 1, "promptTokens": 20}`, 0, false, framework.ReasonShortPrompt},
		{"a prompt shorter than the threshold stays", `{"nonCachedTokens": 11}`, 0, false, framework.ReasonShortPrompt},
		{"a prompt at promptTokens is judged", `{"nonCachedTokens": 1, "promptTokens": 10}`, 0, true, framework.ReasonUncached},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := decide(t, tt.params, 10, decodePod(10, tt.cached, 1, events.TierGPU))
			if v.Split != tt.split || v.Reason != tt.reason {
				t.Errorf("verdict %+v, want split %v (%s)", v, tt.split, tt.reason)
			}
		})
	}
}

func TestNegativeParametersAreRefused(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`{"nonCachedTokens": -1}`, `{"promptTokens": -1}`} {
		if _, err := prefixbased.Factory("d", json.RawMessage(raw), nil); !errors.Is(err, framework.ErrInvalidParams) {
			t.Errorf("%s: err = %v, want ErrInvalidParams", raw, err)
		}
	}
	if _, err := prefixbased.Factory("d", json.RawMessage(`{"threshold": 1}`), nil); !errors.Is(err, framework.ErrInvalidParams) {
		t.Errorf("an unknown parameter: err = %v", err)
	}
}

// A CPU-tier block is a cached block: 240 of a 4096-token prompt's 256
// blocks held in CPU memory leave 256 tokens to compute, under 512.
func TestBlocksInEveryTierCountAsCached(t *testing.T) {
	t.Parallel()
	for _, tier := range []events.Tier{events.TierGPU, events.TierCPU, events.TierStorage} {
		v := decide(t, `{"nonCachedTokens": 512}`, 4096, decodePod(256, 240, 16, tier))
		if v.Split || v.Reason != framework.ReasonCached {
			t.Errorf("240 of 256 blocks in %v: verdict %+v, want the request kept on the decode pod", tier, v)
		}
	}
	if v := decide(t, `{"nonCachedTokens": 512}`, 4096, decodePod(256, 200, 16, events.TierCPU)); !v.Split {
		t.Errorf("200 of 256 blocks in CPU memory leave 896 tokens: verdict %+v, want a split", v)
	}
}

func TestWithoutAPrefixMatchNothingIsSplit(t *testing.T) {
	t.Parallel()
	bare := datalayer.NewCandidate(&datalayer.Endpoint{Name: "d"}, datalayer.Metrics{}, datalayer.StreamNone)
	if v := decide(t, `{"nonCachedTokens": 1}`, 100, bare); v.Split || v.Reason != framework.ReasonNoPrefixInfo {
		t.Errorf("verdict %+v", v)
	}
	if v := decide(t, `{"nonCachedTokens": 1}`, 100, nil); v.Split {
		t.Errorf("no decode pod: verdict %+v", v)
	}
}

func TestThePromptLengthComesFromTokensElseBlocksElseCharacters(t *testing.T) {
	t.Parallel()
	info := datalayer.PrefixCacheInfo{TotalBlocks: 4, BlockSizeTokens: 16}
	if got := prefixbased.PromptTokens(&request.Request{TokenIDs: make([]uint32, 70)}, info); got != 70 {
		t.Errorf("with token ids: %d", got)
	}
	if got := prefixbased.PromptTokens(&request.Request{Prompt: "abcdefgh"}, info); got != 64 {
		t.Errorf("with blocks: %d", got)
	}
	if got := prefixbased.PromptTokens(&request.Request{Prompt: "abcdefgh"}, datalayer.PrefixCacheInfo{}); got != 2 {
		t.Errorf("from characters: %d", got)
	}
}
