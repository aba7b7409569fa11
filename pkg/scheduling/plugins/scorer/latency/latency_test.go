package latency_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/latency"
)

// cand is a candidate with a prediction of ttft (quantile ttftQ) and, for
// a request with a TTFT SLO of slo ms, the headroom against it.
func cand(name string, ttft, ttftQ, slo float64) *datalayer.Candidate {
	c := schedtest.C{Name: name}.Build()
	info := datalayer.LatencyPredictionInfo{TTFTValid: true, TPOTValid: true, TTFTMean: ttft, TTFT: ttftQ, TPOTMean: 10, TPOT: 12, Quantile: 0.9}
	if slo > 0 {
		info.HasTTFTSLO, info.TTFTHeadroom = true, slo-ttftQ
	}
	c.Put(datalayer.LatencyPredictionInfoKey, info)
	return c
}

func score(t *testing.T, params string, req *request.Request, cands []*datalayer.Candidate) []float64 {
	t.Helper()
	p, err := latency.Factory("l", json.RawMessage(params), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, len(cands))
	p.(framework.Scorer).Score(context.Background(), framework.NewCycleState(schedtest.Now, 1, 2), req, cands, out)
	return out
}

func TestTheLeastPredictedLatencyScoresHighest(t *testing.T) {
	t.Parallel()
	noPred := schedtest.C{Name: "none"}.Build()
	got := score(t, "", &request.Request{}, []*datalayer.Candidate{cand("a", 99, 150, 0), cand("b", 49, 300, 0), noPred})
	if got[1] != 1 || got[0] != 0.5 || got[2] != 0 {
		t.Errorf("scores = %v, want 0.5 for 99ms, 1 for 49ms (the least mean), 0 without a prediction", got)
	}
	got = score(t, `{"use":"quantile"}`, &request.Request{}, []*datalayer.Candidate{cand("a", 99, 149, 0), cand("b", 49, 299, 0)})
	if got[0] != 1 || got[1] != 0.5 {
		t.Errorf("by quantile: %v, want the lower p90 to win", got)
	}
	got = score(t, `{"tpotWeight":100}`, &request.Request{}, []*datalayer.Candidate{cand("a", 99, 150, 0), cand("b", 49, 300, 0)})
	if got[0] >= 1 || got[1] != 1 {
		t.Errorf("with the TPOT weighed: %v", got)
	}
}

func TestTheHeadroomStrategiesRankByTheSLO(t *testing.T) {
	t.Parallel()
	req := &request.Request{SLO: request.SLO{TTFT: 200 * time.Millisecond}}
	tight, loose, late := cand("tight", 180, 190, 200), cand("loose", 20, 40, 200), cand("late", 300, 400, 200)
	cands := []*datalayer.Candidate{tight, loose, late}
	least := score(t, `{"strategy":"least"}`, req, cands)
	if !(least[0] > least[1] && least[1] > 0.5 && least[2] < 0.5) {
		t.Errorf("least headroom: %v, want the tight fit first, then the loose one, the late one below both", least)
	}
	most := score(t, `{"strategy":"most-headroom"}`, req, cands)
	if !(most[1] > most[0] && most[0] > 0.5 && most[2] < 0.5) {
		t.Errorf("most headroom: %v, want the loose one first", most)
	}
	noSLO := score(t, `{"strategy":"least"}`, &request.Request{}, cands)
	if noSLO[1] != 1 {
		t.Errorf("without an SLO the headroom strategy falls back to least latency: %v", noSLO)
	}
}

func TestBadParametersAreRefused(t *testing.T) {
	t.Parallel()
	for _, p := range []string{`{"strategy":"fastest"}`, `{"use":"median"}`, `{"tpotWeight":-1}`, `{"weight":1}`, `{"evictionWeight":-1}`, `{"evictionWindow":"0s"}`, `{"evictionWindow":"soon"}`} {
		if _, err := latency.Factory("l", json.RawMessage(p), nil); err == nil {
			t.Errorf("%s was accepted", p)
		}
	}
}

// placed is an endpoint of a placement scenario: what its cache holds and
// the families this EPP sent it.
type placed struct {
	name     string
	held     int
	families []uint64
	res      datalayer.Residency
}

// placeFamilies sends nFamilies prefix families of blocks blocks each, a
// new one every 100ms, to endpoints of capacity blocks, picking by the
// scorer with params; each family's next request follows its first to the
// endpoint that caches it. Each endpoint is predicted a little slower than
// the one before it, so that pure least latency sends every new family to
// the first. It returns the families each endpoint got.
func placeFamilies(t *testing.T, params string, endpoints, capacity, nFamilies, blocks int) []*placed {
	t.Helper()
	eps := make([]*placed, endpoints)
	for i := range eps {
		eps[i] = &placed{name: string(rune('a' + i))}
	}
	now := schedtest.Now
	for f := range nFamilies {
		first := uint64(f + 1)
		keys := make([]uint64, blocks)
		keys[0] = first
		cands := make([]*datalayer.Candidate, len(eps))
		for i, ep := range eps {
			prefix := &datalayer.PrefixCacheInfo{TotalBlocks: blocks, BlockSizeTokens: schedtest.BlockSize, State: datalayer.StreamExact, Exact: true}
			c := schedtest.C{Name: ep.name, Prefix: prefix}.Build()
			m := *c.Metrics
			m.NumGPUBlocks = capacity
			c.Metrics, c.GPUBlocks, c.Residency = &m, ep.held, &ep.res
			alone := 200.0
			ttft := alone + 5*float64(i)
			c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{
				TTFTValid: true, TPOTValid: true, TTFTMean: ttft, TTFT: ttft * 1.2, TTFTAlone: alone, TPOTMean: 10, TPOT: 12, Quantile: 0.9})
			c.Put(framework.RequestBlockKeysKey, keys)
			cands[i] = c
		}
		out := score(t, params, &request.Request{Arrival: now}, cands)
		best := 0
		for i := range out {
			if out[i] > out[best] {
				best = i
			}
		}
		ep := eps[best]
		ep.families = append(ep.families, first)
		ep.held = min(ep.held+blocks, capacity)
		ep.res.Touch(first, blocks, now.UnixNano())
		ep.res.Touch(first, blocks, now.Add(50*time.Millisecond).UnixNano())
		now = now.Add(100 * time.Millisecond)
	}
	return eps
}

func TestNoEndpointGetsMoreFamiliesThanItsCacheHoldsWhileAnotherHasRoom(t *testing.T) {
	t.Parallel()
	const endpoints, capacity, families, blocks = 4, 400, 8, 164
	fits := capacity / blocks
	for _, ep := range placeFamilies(t, "", endpoints, capacity, families, blocks) {
		if len(ep.families) > fits {
			t.Errorf("endpoint %s got families %v, more than the %d its %d blocks hold, while others had room", ep.name, ep.families, fits, capacity)
		}
	}
	// Without the term, the least predicted latency alone piles them up:
	// the scenario is one where the term decides.
	pile := placeFamilies(t, `{"evictionWeight":0}`, endpoints, capacity, families, blocks)
	if len(pile[0].families) <= fits {
		t.Errorf("without the eviction term endpoint a got %v: the scenario does not test the term", pile[0].families)
	}
}

func TestAFullCacheOfColdFamiliesCostsNothingToEvict(t *testing.T) {
	t.Parallel()
	prefix := &datalayer.PrefixCacheInfo{TotalBlocks: 100, BlockSizeTokens: schedtest.BlockSize, State: datalayer.StreamExact, Exact: true}
	mk := func(name string, ttft float64, lastUse time.Time) *datalayer.Candidate {
		c := schedtest.C{Name: name, Prefix: prefix}.Build()
		m := *c.Metrics
		m.NumGPUBlocks = 400
		res := &datalayer.Residency{}
		res.Touch(99, 400, lastUse.Add(-time.Second).UnixNano())
		res.Touch(99, 400, lastUse.UnixNano())
		c.Metrics, c.GPUBlocks, c.Residency = &m, 400, res
		c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{
			TTFTValid: true, TPOTValid: true, TTFTMean: ttft, TTFT: ttft, TTFTAlone: 100, TPOTMean: 10, TPOT: 12, Quantile: 0.9})
		return c
	}
	req := &request.Request{Arrival: schedtest.Now}
	// Both full; a's family was asked for a second ago, b's ten minutes ago.
	got := score(t, "", req, []*datalayer.Candidate{mk("a", 100, schedtest.Now.Add(-time.Second)), mk("b", 110, schedtest.Now.Add(-10*time.Minute))})
	if got[1] != 1 || got[0] >= got[1] {
		t.Errorf("scores = %v: want b, whose cache is full of a cold family, over a, which would evict a hot one", got)
	}
	got = score(t, "", req, []*datalayer.Candidate{mk("a", 100, schedtest.Now.Add(-20*time.Minute)), mk("b", 110, schedtest.Now.Add(-10*time.Minute))})
	if got[0] != 1 {
		t.Errorf("scores = %v: with both families cold, the least latency wins", got)
	}
	// Both full of families as hot: each would evict as much as the
	// other, and only the latency tells them apart, as without the term.
	hot := []*datalayer.Candidate{mk("a", 100, schedtest.Now), mk("b", 110, schedtest.Now)}
	got, without := score(t, "", req, hot), score(t, `{"evictionWeight":0}`, req, hot)
	if got[0] != without[0] || got[1] != without[1] {
		t.Errorf("scores = %v, want %v: where every candidate evicts alike, the term changes nothing", got, without)
	}
}

// Picking a split request's prefill pod after its decode pod, each prefill
// pod's cost adds the transfer of the blocks the decode pod lacks over the
// link of their distance: at equal predictions the pod in the decode pod's
// rack wins, and it loses to one across racks whose prediction is shorter
// by more than the transfer it saves.
func TestAPrefillPickWeighsTheTransferToTheDecodePod(t *testing.T) {
	t.Parallel()
	rack := func(host, r string) datalayer.Topology { return datalayer.Topology{Host: host, Rack: r, Zone: "z"} }
	role := func(r string) map[string]string { return map[string]string{datalayer.RoleLabel: r} }
	prefill := func(name, r string, ttft float64) *datalayer.Candidate {
		c := schedtest.C{Name: name, Labels: role("prefill"), Topology: rack(name, r)}.Build()
		c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{TTFTValid: true, TPOTValid: true, TTFTMean: ttft, TTFT: ttft, TPOTMean: 10, TPOT: 10, Quantile: 0.9})
		return c
	}
	// The decode pod holds 2 of the prompt's 64 blocks: 62 blocks of 16
	// tokens, 131072 bytes a token, move. Within the rack (25 GB/s and
	// 0.5 ms by default) that is 5.7 ms; across racks, in one zone
	// (12.5 GB/s, 1 ms), 11.4 ms.
	decode := schedtest.C{Name: "decode", Labels: role("decode"), Topology: rack("decode", "r1"),
		Prefix: &datalayer.PrefixCacheInfo{MatchBlocks: 2, MatchTokens: 32, TotalBlocks: 64, BlockSizeTokens: 16, State: datalayer.StreamExact}}.Build()
	req := &request.Request{TokenIDs: make([]uint32, 1024)}
	run := func(cands ...*datalayer.Candidate) []float64 {
		p, err := latency.Factory("l", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cs := framework.NewCycleState(schedtest.Now, 1, 2)
		cs.Write(framework.PeerEndpointKey, decode)
		out := make([]float64, len(cands))
		p.(framework.Scorer).Score(context.Background(), cs, req, cands, out)
		return out
	}
	if got := run(prefill("far", "r2", 40), prefill("near", "r1", 40)); !(got[1] > got[0]) {
		t.Errorf("equal predictions: scores %v, want the decode pod's rack first", got)
	}
	if got := run(prefill("far", "r2", 40), prefill("near", "r1", 44)); !(got[1] > got[0]) {
		t.Errorf("the near pod 4 ms slower, saving 5.7 ms of transfer: scores %v, want it first", got)
	}
	if got := run(prefill("far", "r2", 40), prefill("near", "r1", 48)); !(got[0] > got[1]) {
		t.Errorf("the near pod 8 ms slower, saving 5.7 ms of transfer: scores %v, want the far one first", got)
	}
	// Without the decode pick (no split, or the decode profile itself),
	// distance plays no part.
	p, _ := latency.Factory("l", nil, nil)
	out := make([]float64, 2)
	p.(framework.Scorer).Score(context.Background(), framework.NewCycleState(schedtest.Now, 1, 2), req, []*datalayer.Candidate{prefill("far", "r2", 40), prefill("near", "r1", 40)}, out)
	if out[0] != out[1] {
		t.Errorf("no decode pick: scores %v, want equal", out)
	}
}
