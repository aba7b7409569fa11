package predictedlatency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare/predictedlatency"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// inProcess is a producer predicting with a new in-process predictor that
// learns synchronously.
func inProcess(tb testing.TB, reg prometheus.Registerer) (*predict.Predictor, *predictedlatency.Producer) {
	tb.Helper()
	p, err := predict.New(predict.Options{Synchronous: true})
	if err != nil {
		tb.Fatal(err)
	}
	prod, err := predictedlatency.New("", predictedlatency.InProcess{P: p}, 2*time.Second, reg)
	if err != nil {
		tb.Fatal(err)
	}
	return p, prod
}

// manyCandidates is n fresh candidates known to p, holding increasing
// parts (in GPU) of a prompt of tokens tokens.
func manyCandidates(p *predict.Predictor, n, tokens int) []*datalayer.Candidate {
	return manyCandidatesIn(p, n, tokens, nil)
}

// manyCandidatesIn is manyCandidates made in set's memory (nil: fresh), as
// the ext_proc stream makes each request's.
func manyCandidatesIn(p *predict.Predictor, n, tokens int, set *datalayer.CandidateSet) []*datalayer.Candidate {
	now := time.Now()
	ds := datalayer.NewDatastore(nil)
	for i := range n {
		addr := fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250)
		p.AddEndpoint(addr, "")
		// Names sort as the addresses were made, so that candidate i is
		// the i-th endpoint.
		name := fmt.Sprintf("e%05d", i)
		ds.Upsert(&datalayer.Endpoint{Name: name, Address: addr})
		ds.SetMetrics(name, datalayer.Metrics{RunningRequests: i % 4, UpdateTime: now})
	}
	cands := ds.CandidatesInto(set, nil)
	for i, c := range cands {
		held := min(i*8, tokens/16)
		var byTier [events.NumTiers]int
		byTier[events.TierGPU] = held
		c.Stream = datalayer.StreamExact
		c.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
			MatchBlocks: held, TotalBlocks: tokens / 16, BlockSizeTokens: 16, BlocksByTier: byTier, State: datalayer.StreamExact})
	}
	return cands
}

func candidates(now time.Time) []*datalayer.Candidate {
	hit := datalayer.NewCandidate(&datalayer.Endpoint{Name: "hit", Address: "10.0.0.1:8000"},
		datalayer.Metrics{RunningRequests: 1, UpdateTime: now}, datalayer.StreamExact)
	var byTier [events.NumTiers]int
	byTier[events.TierGPU], byTier[events.TierCPU] = 200, 40
	hit.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
		MatchBlocks: 240, TotalBlocks: 250, BlockSizeTokens: 16, MatchTokens: 3840, BlocksByTier: byTier, Exact: true, State: datalayer.StreamExact})
	cold := datalayer.NewCandidate(&datalayer.Endpoint{Name: "cold", Address: "10.0.0.2:8000"},
		datalayer.Metrics{UpdateTime: now.Add(-time.Hour)}, datalayer.StreamExact)
	cold.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{TotalBlocks: 250, BlockSizeTokens: 16, Exact: true, State: datalayer.StreamExact})
	return []*datalayer.Candidate{hit, cold}
}

func info(t *testing.T, c *datalayer.Candidate) datalayer.LatencyPredictionInfo {
	t.Helper()
	v, ok := c.Get(datalayer.LatencyPredictionInfoKey)
	if !ok {
		t.Fatalf("%s: no LatencyPredictionInfo", c.Name)
	}
	return *v.(*datalayer.LatencyPredictionInfo)
}

func TestTheProducerPredictsEachCandidateFromItsCachedTiersAndLoad(t *testing.T) {
	t.Parallel()
	_, prod := inProcess(t, prometheus.NewRegistry())
	req := &request.Request{TokenIDs: make([]uint32, 4000), SLO: request.SLO{TTFT: 100 * time.Millisecond}}
	cands := candidates(time.Now())
	if err := prod.Produce(context.Background(), req, cands); err != nil {
		t.Fatal(err)
	}
	hit, cold := info(t, cands[0]), info(t, cands[1])
	if !hit.TTFTValid || !hit.TPOTValid || hit.Quantile != 0.9 {
		t.Fatalf("hit: %+v", hit)
	}
	if !(hit.TTFTMean < cold.TTFTMean) {
		t.Errorf("the endpoint holding 3840 of 4000 tokens is predicted %.1fms, no faster than the cold one (%.1fms)", hit.TTFTMean, cold.TTFTMean)
	}
	if !hit.HasTTFTSLO || hit.TTFTHeadroom != 100-hit.TTFT || hit.HasTPOTSLO {
		t.Errorf("hit's headroom: %+v", hit)
	}
	if !hit.MeetsSLO() || cold.MeetsSLO() {
		t.Errorf("a 200ms cold prefill against a 100ms SLO: hit meets %v, cold meets %v", hit.MeetsSLO(), cold.MeetsSLO())
	}
	v, _ := cands[1].Get(predictedlatency.InputKey)
	if in := v.(*predict.Input); !in.MetricsStale || in.InputTokens != 4000 || in.Uncached() != 4000 {
		t.Errorf("the cold candidate's input: %+v", in)
	}
	v, _ = cands[0].Get(predictedlatency.InputKey)
	if in := v.(*predict.Input); in.GPUTokens != 3200 || in.CPUTokens != 640 || in.Running != 1 {
		t.Errorf("the hit candidate's input: %+v", in)
	}
}

func TestAMatchCountsAsCachedAsFarAsItsStreamIsTrusted(t *testing.T) {
	t.Parallel()
	tests := []struct {
		state datalayer.StreamState
		// wantGPU is the 3200 GPU-held tokens credited as cached.
		wantGPU int
	}{
		{datalayer.StreamExact, 3200},
		{datalayer.StreamPartial, 3200},
		{datalayer.StreamRecovering, 2400},
		{datalayer.StreamUncertain, 1600},
		{datalayer.StreamNone, 1600},
	}
	_, prod := inProcess(t, nil)
	var prevTTFT float64
	for _, tt := range tests {
		t.Run(tt.state.String(), func(t *testing.T) {
			c := datalayer.NewCandidate(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000"}, datalayer.Metrics{UpdateTime: time.Now()}, tt.state)
			var byTier [events.NumTiers]int
			byTier[events.TierGPU] = 200
			c.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
				MatchBlocks: 200, TotalBlocks: 250, BlockSizeTokens: 16, MatchTokens: 3200, BlocksByTier: byTier, State: tt.state})
			if err := prod.Produce(context.Background(), &request.Request{TokenIDs: make([]uint32, 4000)}, []*datalayer.Candidate{c}); err != nil {
				t.Fatal(err)
			}
			v, _ := c.Get(predictedlatency.InputKey)
			if in := v.(*predict.Input); in.GPUTokens != tt.wantGPU || in.Uncached() != 4000-tt.wantGPU {
				t.Errorf("input %+v, want %d tokens credited as held in GPU", in, tt.wantGPU)
			}
			if got := info(t, c).TTFTMean; got < prevTTFT {
				t.Errorf("TTFT %.2fms, less than a more trusted stream's %.2fms", got, prevTTFT)
			} else {
				prevTTFT = got
			}
		})
	}
}

// failing is a backend whose predictions fail, as an unreachable sidecar's.
type failing struct{ observed int }

func (f *failing) PredictAll(context.Context, []string, []predict.Input, []predict.Prediction) error {
	return errors.New("sidecar down")
}
func (f *failing) Observe(predict.Sample) { f.observed++ }
func (f *failing) Quantile() float64      { return 0.9 }

func TestAFailedBackendLeavesThePredictionsInvalid(t *testing.T) {
	t.Parallel()
	prod, err := predictedlatency.New("", &failing{}, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	cands := candidates(time.Now())
	if err := prod.Produce(context.Background(), &request.Request{TokenIDs: make([]uint32, 10)}, cands); err == nil {
		t.Error("a failed backend's error was swallowed")
	}
	if i := info(t, cands[0]); i.TTFTValid || i.TPOTValid || i.TTFT != 0 {
		t.Errorf("after a failure: %+v", i)
	}
}

func TestTheProducerLearnsFromThePickedEndpointsResponse(t *testing.T) {
	t.Parallel()
	var learned []predict.Sample
	p, err := predict.New(predict.Options{Synchronous: true, Record: func(s predict.Sample) { learned = append(learned, s) }})
	if err != nil {
		t.Fatal(err)
	}
	p.AddEndpoint("10.0.0.1:8000", "")
	reg := prometheus.NewRegistry()
	prod, err := predictedlatency.New("", predictedlatency.InProcess{P: p}, 2*time.Second, reg)
	if err != nil {
		t.Fatal(err)
	}
	req := &request.Request{Model: "m", TokenIDs: make([]uint32, 4000), SLO: request.SLO{TTFT: 10 * time.Millisecond}}
	cands := candidates(time.Now())
	if err := prod.Produce(context.Background(), req, cands); err != nil {
		t.Fatal(err)
	}
	start := time.Unix(100, 0)
	resp := &request.Response{Endpoint: "10.0.0.1:8000", Status: 200, Streamed: true, Start: start,
		FirstByte: start.Add(50 * time.Millisecond), End: start.Add(250 * time.Millisecond),
		CompletionTokens: 21, RequestedModel: "m", Picked: cands[0]}
	prod.ObserveResponse(context.Background(), req, resp)
	if got := p.Observations("10.0.0.1:8000"); got != 1 {
		t.Errorf("the predictor learned %d observations, want 1", got)
	}
	// What an evaluation replays the trace by: when the request was
	// predicted, and when its outcome was known.
	if len(learned) != 1 || !learned[0].Start.Equal(resp.Start) || !learned[0].End.Equal(resp.End) ||
		learned[0].TTFTMs != 50 || learned[0].TPOTMs != 10 {
		t.Errorf("learned %+v, want one sample from %v to %v, TTFT 50ms, TPOT 10ms", learned, resp.Start, resp.End)
	}
	if v := testkit.Value(t, reg, "inference_objective_request_slo_violation_total", "type", "ttft"); v != 1 {
		t.Errorf("TTFT SLO violations = %v, want 1 (50ms against 10ms)", v)
	}
	if n := testkit.HistCount(t, reg, "inference_objective_request_predicted_ttft_seconds"); n != 1 {
		t.Errorf("predicted TTFT observed %d times, want 1", n)
	}
	// A failed response, or one without a pick, teaches nothing.
	prod.ObserveResponse(context.Background(), req, &request.Response{Endpoint: "10.0.0.1:8000", Status: 503, Picked: cands[0]})
	prod.ObserveResponse(context.Background(), req, &request.Response{Endpoint: "10.0.0.1:8000", Status: 200, Streamed: true})
	if got := p.Observations("10.0.0.1:8000"); got != 1 {
		t.Errorf("after two unusable responses the predictor has %d observations, want 1", got)
	}
	prod.ForgetEndpoint("10.0.0.1:8000")
}

func TestPredictingARequestAllocatesNothingWhenItsCandidatesMemoryIsReused(t *testing.T) {
	p, prod := inProcess(t, prometheus.NewRegistry())
	for _, tt := range []struct {
		candidates, tokens int
		set                bool
	}{{1, 1024, true}, {64, 1024, true}, {64, 32768, true}, {64, 8192, false}} {
		var set *datalayer.CandidateSet
		if tt.set {
			set = new(datalayer.CandidateSet)
		}
		cands := manyCandidatesIn(p, tt.candidates, tt.tokens, set)
		req := &request.Request{TokenIDs: make([]uint32, tt.tokens), SLO: request.SLO{TTFT: time.Second}}
		allocs := testing.AllocsPerRun(50, func() {
			if err := prod.Produce(context.Background(), req, cands); err != nil {
				t.Fatal(err)
			}
		})
		// In a CandidateSet, what is published is in the set's memory,
		// made once; without one, the inputs and the predictions are a
		// slice each. The backend's scratch is pooled (under the race
		// detector a pool drops items at random, and its two slices may be
		// made again).
		want := 0.0
		if !tt.set {
			want = 2
		}
		if raceEnabled {
			want += 2
		}
		if allocs > want {
			t.Errorf("%d candidates, %d tokens, in a set %v: %v allocations per request, want at most %v", tt.candidates, tt.tokens, tt.set, allocs, want)
		}
		if i := info(t, cands[len(cands)-1]); !i.TTFTValid || !i.HasTTFTSLO {
			t.Errorf("%d candidates: the last one's prediction is %+v", tt.candidates, i)
		}
	}
}

// A candidate's recent ends reach the predictor as how long before the
// request's arrival each came.
func TestTheInputCarriesTheRecentEndsAges(t *testing.T) {
	t.Parallel()
	_, prod := inProcess(t, prometheus.NewRegistry())
	now := time.Now()
	req := &request.Request{TokenIDs: make([]uint32, 400), Arrival: now}
	cands := candidates(now)
	cands[0].InFlight.Ended = [datalayer.EndedKept]int64{now.Add(-50 * time.Millisecond).UnixNano(), now.Add(-300 * time.Millisecond).UnixNano()}
	if err := prod.Produce(context.Background(), req, cands); err != nil {
		t.Fatal(err)
	}
	v, _ := cands[0].Get(predictedlatency.InputKey)
	in := v.(*predict.Input)
	if in.EndedN != 2 || in.EndedAgoMs[0] != 50 || in.EndedAgoMs[1] != 300 {
		t.Errorf("the ends' ages: %d known, %v; want 50 and 300 ms", in.EndedN, in.EndedAgoMs)
	}
	if v, _ := cands[1].Get(predictedlatency.InputKey); v.(*predict.Input).EndedN != 0 {
		t.Errorf("a candidate with no ends has %d", v.(*predict.Input).EndedN)
	}
}

// sharing is a candidate whose engine is prefilling, for a request this
// EPP sent it moments ago, the prompt's first 160 of 164 blocks: the index
// holds them only speculatively, and that prefill, predicted done by
// doneBy, is the queue ahead.
func sharing(now time.Time, name, addr string, speculative int, doneBy time.Time) *datalayer.Candidate {
	c := datalayer.NewCandidate(&datalayer.Endpoint{Name: name, Address: addr}, datalayer.Metrics{RunningRequests: 1, UpdateTime: now}, datalayer.StreamExact)
	c.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
		MatchBlocks: speculative, SpeculativeBlocks: speculative, TotalBlocks: 164, BlockSizeTokens: 16, Exact: true, State: datalayer.StreamExact})
	c.InFlight = datalayer.InFlight{
		Prefilling: 1, PrefillTokens: 2624, PrefillDoneBy: doneBy.UnixNano(), OldestPrefill: now.Add(-5 * time.Millisecond).UnixNano(),
		Ahead:      enginesched.Ahead{Steps: 1, PrefillTokens: 2624, PrefillContext: 2624 * 2624},
		ReplayedAt: now.Add(-5 * time.Millisecond).UnixNano(),
	}
	return c
}

func TestARequestWhosePrefixIsBeingPrefilledThereIsPredictedAsCachedAfterTheWait(t *testing.T) {
	t.Parallel()
	_, prod := inProcess(t, nil)
	now := time.Now()
	doneBy := now.Add(60 * time.Millisecond)
	req := &request.Request{TokenIDs: make([]uint32, 2624), Arrival: now}
	held := sharing(now, "held", "10.0.0.3:8000", 0, doneBy)
	var byTier [events.NumTiers]int
	byTier[events.TierGPU] = 160
	held.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
		MatchBlocks: 160, TotalBlocks: 164, BlockSizeTokens: 16, BlocksByTier: byTier, Exact: true, State: datalayer.StreamExact})
	cands := []*datalayer.Candidate{
		sharing(now, "sharing", "10.0.0.1:8000", 160, doneBy),
		// The same queue, but the prefill ahead is another prompt's.
		sharing(now, "other", "10.0.0.2:8000", 0, doneBy),
		// The same queue, the prefix already held.
		held,
	}
	if err := prod.Produce(context.Background(), req, cands); err != nil {
		t.Fatal(err)
	}
	shared, other, cached := info(t, cands[0]), info(t, cands[1]), info(t, cands[2])
	// Its own engine time is its 64-token tail.
	if shared.TTFTAlone != cached.TTFTAlone || !(shared.TTFTAlone < other.TTFTAlone/4) {
		t.Errorf("alone: %.1fms sharing the prefix being computed, %.1fms with it held, %.1fms for the whole prompt", shared.TTFTAlone, cached.TTFTAlone, other.TTFTAlone)
	}
	// Behind the prefill computing its prefix, it waits as much as behind
	// any other and then finds the prefix cached.
	if shared.TTFTMean != cached.TTFTMean || shared.TTFT != cached.TTFT {
		t.Errorf("sharing the prefix being computed: %.1fms (p90 %.1fms); with it held, the same queue: %.1fms (p90 %.1fms)", shared.TTFTMean, shared.TTFT, cached.TTFTMean, cached.TTFT)
	}
	if !(shared.TTFT < other.TTFT) {
		t.Errorf("behind another prompt's prefill: p90 %.1fms, sharing its prefix: p90 %.1fms", other.TTFT, shared.TTFT)
	}
}

func TestAPodOfRanksIsPredictedOnTheRankARankPickNames(t *testing.T) {
	t.Parallel()
	_, prod := inProcess(t, nil)
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "pod", Address: "10.0.0.1:8000"})
	ds.SetMetrics("pod", datalayer.Metrics{WaitingQueueSize: 8, RunningRequests: 12, DataParallelRanks: 4, UpdateTime: time.Now()})
	// Rank 2 holds the prefix and has one request decoding; rank 1 has a
	// long prefill queued and nothing cached.
	busy := ds.Dispatch("pod", time.Now(), 6000, 6000, 0)
	busy.OnRank(1)
	dec := ds.Dispatch("pod", time.Now(), 100, 900, 0)
	dec.OnRank(2)
	dec.FirstToken(time.Now())
	c := ds.Candidates(nil)[0]
	ranks := []datalayer.RankPrefix{
		{Rank: 1, State: datalayer.StreamExact},
		{Rank: 2, MatchBlocks: 200, State: datalayer.StreamExact},
		{Rank: 3, MatchBlocks: 240, State: datalayer.StreamUncertain},
	}
	var byTier [events.NumTiers]int
	byTier[events.TierGPU], byTier[events.TierCPU] = 200, 40
	c.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
		MatchBlocks: 240, TotalBlocks: 250, BlockSizeTokens: 16, BlocksByTier: byTier, State: datalayer.StreamUncertain, Ranks: &ranks})
	if err := prod.Produce(context.Background(), &request.Request{TokenIDs: make([]uint32, 4000)}, []*datalayer.Candidate{c}); err != nil {
		t.Fatal(err)
	}
	v, _ := c.Get(predictedlatency.InputKey)
	in := v.(*predict.Input)
	want := predict.Input{InputTokens: 4000, GPUTokens: 3200, Decoding: 1, DecodeTokens: 900, Waiting: 2, Running: 3}
	got := predict.Input{InputTokens: in.InputTokens, GPUTokens: in.GPUTokens, CPUTokens: in.CPUTokens, Prefilling: in.Prefilling,
		PrefillTokens: in.PrefillTokens, Decoding: in.Decoding, DecodeTokens: in.DecodeTokens, Waiting: in.Waiting, Running: in.Running}
	if got != want || in.Ahead != (enginesched.Ahead{}) {
		t.Fatalf("input %+v, want rank 2's: %+v", got, want)
	}
	busy.Done()
	dec.Done()
}
