package prefixmatch_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/request"
)

// store tells ix that the engine at addr holds the first blocks of prompt.
func store(ix *index.Index, addr, model string, blockSize, blocks int, prompt []uint32) {
	hashes := make([]uint64, blocks)
	for i := range hashes {
		hashes[i] = uint64(len(addr))<<40 | uint64(i+1)
	}
	ix.Apply(events.Origin{Stream: events.Stream{Endpoint: addr}, Model: model, BlockSize: blockSize, Instance: "i"},
		&events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: prompt[:blocks*blockSize], BlockSize: blockSize,
		}}})
}

func TestProduceAnswersEachCandidateAtItsOwnBlockSizeAndModel(t *testing.T) {
	t.Parallel()
	prompt := make([]uint32, 256)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	ix := index.New(index.Options{}, nil)
	// Candidates that share a block size and model are interleaved with
	// others, so that groups are not runs of neighbours.
	type want struct {
		blocks, blockSize, total int
		exact                    bool
	}
	endpoints := []struct {
		name, model string
		blockSize   int
		held        int // blocks stored; -1: no event stream at all
		want        want
	}{
		{"a", "m", 16, 4, want{4, 16, 16, true}},
		{"b", "m", 32, 2, want{2, 32, 8, true}},
		{"c", "m2", 16, -1, want{0, 16, 16, false}},
		{"d", "m", 16, 1, want{1, 16, 16, true}},
		{"e", "m2", 16, 3, want{3, 16, 16, true}},
		{"f", "m", 32, 5, want{5, 32, 8, true}},
	}
	var cands []*datalayer.Candidate
	for i, e := range endpoints {
		addr := fmt.Sprintf("10.0.0.%d:8000", i+1)
		ix.AddEndpoint(addr)
		if e.held >= 0 {
			store(ix, addr, e.model, e.blockSize, e.held, prompt)
		}
		cands = append(cands, datalayer.NewCandidate(&datalayer.Endpoint{Name: e.name, Address: addr, Model: e.model},
			datalayer.Metrics{BlockSize: e.blockSize}, datalayer.StreamExact))
	}
	p := prefixmatch.New("", prefixmatch.Params{}, ix, nil)
	if err := p.Produce(context.Background(), &request.Request{Model: "m", TokenIDs: prompt}, cands); err != nil {
		t.Fatal(err)
	}
	keysOf := map[string][]uint64{}
	for i, e := range endpoints {
		v, ok := cands[i].Get(datalayer.PrefixCacheMatchInfoKey)
		if !ok {
			t.Fatalf("%s: no prefix info published", e.name)
		}
		info := v.(datalayer.PrefixCacheInfo)
		got := want{info.MatchBlocks, info.BlockSizeTokens, info.TotalBlocks, info.Exact}
		if got != e.want {
			t.Errorf("%s: got %+v, want %+v", e.name, got, e.want)
		}
		if e.held < 0 {
			continue
		}
		k, _ := cands[i].Get(prefixmatch.RequestBlockKeysKey)
		keys := k.([]uint64)
		group := fmt.Sprintf("%s/%d", e.model, e.blockSize)
		if prev, seen := keysOf[group]; seen && &prev[0] != &keys[0] {
			t.Errorf("%s: block keys computed again for group %s", e.name, group)
		}
		keysOf[group] = keys
	}
	if len(keysOf) != 3 {
		t.Errorf("%d distinct key sets, want one per block size and model (3)", len(keysOf))
	}
}

// An engine that keys blocks by token pairs (SGLang with EAGLE) is asked
// with pair keys, beside one keyed plainly, in the same request.
func TestProduceKeysTokenPairEnginesByPairs(t *testing.T) {
	t.Parallel()
	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(500 + i)
	}
	ix := index.New(index.Options{}, nil)
	plainAddr, pairAddr := "10.0.0.1:8000", "10.0.0.2:8000"
	ix.AddEndpoint(plainAddr)
	ix.AddEndpoint(pairAddr)
	store(ix, plainAddr, "m", 16, 2, prompt)
	ix.Apply(events.Origin{Stream: events.Stream{Endpoint: pairAddr}, Model: "m", BlockSize: 16, Instance: "i"},
		&events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: []uint64{7, 8, 9}, TokenIDs: prompt[:48], BlockSize: 16,
			Bigram: true, BigramNext: prompt[48],
		}}})
	var cands []*datalayer.Candidate
	for _, addr := range []string{plainAddr, pairAddr} {
		cands = append(cands, datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr, Model: "m"},
			datalayer.Metrics{}, datalayer.StreamExact))
	}
	p := prefixmatch.New("", prefixmatch.Params{}, ix, nil)
	for _, tc := range []struct {
		name        string
		tokens      []uint32
		plain, pair int
	}{
		{"a request longer than what either holds", prompt, 2, 3},
		{"a request ending at the third block: no token after it", prompt[:48], 2, 2},
	} {
		if err := p.Produce(context.Background(), &request.Request{Model: "m", TokenIDs: tc.tokens}, cands); err != nil {
			t.Fatal(err)
		}
		got := func(i int) int {
			v, _ := cands[i].Get(datalayer.PrefixCacheMatchInfoKey)
			return v.(datalayer.PrefixCacheInfo).MatchBlocks
		}
		if got(0) != tc.plain || got(1) != tc.pair {
			t.Errorf("%s: plain engine %d, pair engine %d; want %d, %d", tc.name, got(0), got(1), tc.plain, tc.pair)
		}
	}
}

// A request with an image or another non-text part is a hit nowhere: the
// engine's blocks for it are keyed with the item's hash, which the request
// path cannot reproduce, even where its text prefix is held.
func TestProduceReportsNoHitForARequestWithNonTextParts(t *testing.T) {
	t.Parallel()
	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	ix := index.New(index.Options{}, nil)
	addr := "10.0.0.1:8000"
	ix.AddEndpoint(addr)
	store(ix, addr, "m", 16, 4, prompt)
	cands := []*datalayer.Candidate{datalayer.NewCandidate(&datalayer.Endpoint{Name: "a", Address: addr, Model: "m"},
		datalayer.Metrics{}, datalayer.StreamExact)}
	p := prefixmatch.New("", prefixmatch.Params{}, ix, nil)
	for _, tc := range []struct {
		name string
		req  request.Request
		want int
	}{
		{"the text-only request", request.Request{Model: "m", TokenIDs: prompt}, 4},
		{"the same tokens with an image", request.Request{Model: "m", TokenIDs: prompt, NoReproduciblePrefix: true}, 0},
		{"an image and no known tokens", request.Request{Model: "m", Prompt: "describe <image_url>", NoReproduciblePrefix: true}, 0},
	} {
		if err := p.Produce(context.Background(), &tc.req, cands); err != nil {
			t.Fatal(err)
		}
		v, _ := cands[0].Get(datalayer.PrefixCacheMatchInfoKey)
		if got := v.(datalayer.PrefixCacheInfo).MatchBlocks; got != tc.want {
			t.Errorf("%s: %d blocks, want %d", tc.name, got, tc.want)
		}
	}
}

func TestProduceAllocatesAlikeForEightAndSixtyFourCandidatesWithEqualAnswers(t *testing.T) {
	// Under the race detector sync.Pool drops items at random, so a run
	// may allocate again what a pool would have given back: a few
	// allocations either way, while a box per candidate would be 56 more.
	tolerance := 0.0
	if raceEnabled {
		tolerance = 4
	}
	prompt := make([]uint32, 1024)
	for i := range prompt {
		prompt[i] = uint32(7 + i)
	}
	allocs := map[int]float64{}
	for _, n := range []int{8, 64} {
		ix := index.New(index.Options{}, nil)
		var cands []*datalayer.Candidate
		for i := range n {
			addr := fmt.Sprintf("10.0.1.%d:8000", i+1)
			ix.AddEndpoint(addr)
			// Every engine holds the same two blocks of the prompt.
			store(ix, addr, "m", 16, 2, prompt)
			cands = append(cands, datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr, Model: "m"},
				datalayer.Metrics{BlockSize: 16}, datalayer.StreamExact))
		}
		p := prefixmatch.New("", prefixmatch.Params{}, ix, nil)
		req := &request.Request{Model: "m", TokenIDs: prompt}
		allocs[n] = testing.AllocsPerRun(200, func() {
			if err := p.Produce(context.Background(), req, cands); err != nil {
				t.Fatal(err)
			}
		})
		for i, c := range cands {
			v, _ := c.Get(datalayer.PrefixCacheMatchInfoKey)
			if info, _ := v.(datalayer.PrefixCacheInfo); info.MatchBlocks != 2 {
				t.Fatalf("%d candidates: candidate %d matches %d blocks, want 2", n, i, info.MatchBlocks)
			}
		}
	}
	if d := allocs[64] - allocs[8]; d > tolerance || d < -tolerance {
		t.Errorf("allocations per Produce: %v with 8 candidates, %v with 64; want the same (within %v)", allocs[8], allocs[64], tolerance)
	}
}

func TestBeforeItsFirstEventsAnEndpointPrefillingAPrefixSentThereIsSeenComputingIt(t *testing.T) {
	t.Parallel()
	prompt := make([]uint32, 160)
	for i := range prompt {
		prompt[i] = uint32(7000 + i)
	}
	const addr = "10.0.0.1:8000"
	ix := index.New(index.Options{}, nil)
	ix.AddEndpoint(addr)
	p := prefixmatch.New("", prefixmatch.Params{}, ix, nil)
	req := &request.Request{Model: "m", TokenIDs: prompt}
	produce := func(prefilling int) datalayer.PrefixCacheInfo {
		t.Helper()
		c := datalayer.NewCandidate(&datalayer.Endpoint{Name: "a", Address: addr, Model: "m"}, datalayer.Metrics{BlockSize: 16}, datalayer.StreamNone)
		c.InFlight.Prefilling = prefilling
		if err := p.Produce(context.Background(), req, []*datalayer.Candidate{c}); err != nil {
			t.Fatal(err)
		}
		k, _ := c.Get(prefixmatch.RequestBlockKeysKey)
		if prefilling == 0 {
			// The pick: the recorder's speculation.
			ix.Speculate(addr, k.([]uint64))
		}
		v, _ := c.Get(datalayer.PrefixCacheMatchInfoKey)
		return v.(datalayer.PrefixCacheInfo)
	}
	if first := produce(0); first.MatchBlocks != 0 {
		t.Fatalf("a first request matched %d blocks on an endpoint nothing was sent to", first.MatchBlocks)
	}
	got := produce(1)
	if got.MatchBlocks != 10 || got.SpeculativeBlocks != 10 || got.BlocksByTier != ([events.NumTiers]int{}) || got.State != datalayer.StreamNone {
		t.Errorf("with its prefill in flight: %+v, want its 10 blocks being computed (speculative), the stream still none", got)
	}
	if got := produce(0); got.SpeculativeBlocks != 0 {
		t.Errorf("with nothing in flight there: %+v, want the routing history's answer, nothing taken as being computed", got)
	}
}
