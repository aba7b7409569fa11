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
	for _, p := range []string{`{"strategy":"fastest"}`, `{"use":"median"}`, `{"tpotWeight":-1}`, `{"weight":1}`} {
		if _, err := latency.Factory("l", json.RawMessage(p), nil); err == nil {
			t.Errorf("%s was accepted", p)
		}
	}
}
