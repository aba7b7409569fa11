package nohitlru_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/nohitlru"
)

// cycle scores cands and, as the scheduler would, runs the post-pick with
// the endpoint pick; it returns the scores.
func cycle(s *nohitlru.Scorer, cands []*datalayer.Candidate, pick int) []float64 {
	cs := schedtest.Cycle()
	out := make([]float64, len(cands))
	s.Score(context.Background(), cs, &request.Request{}, cands, out)
	s.PostPick(context.Background(), cs, &request.Request{}, &framework.ProfileResult{Picked: []*datalayer.Candidate{cands[pick]}})
	return out
}

func cold(names ...string) []*datalayer.Candidate {
	cs := make([]schedtest.C, len(names))
	for i, n := range names {
		cs[i] = schedtest.C{Name: n, Prefix: schedtest.Info(8, 0, 0, 0, 0)}
	}
	return schedtest.Cands(cs...)
}

func TestColdRequestsSpreadLeastRecentlyUsedFirst(t *testing.T) {
	t.Parallel()
	s := nohitlru.New("n", nohitlru.Params{})
	// Nothing given a cold request yet: the order of the candidates ranks.
	if got, want := cycle(s, cold("a", "b", "c"), 0), []float64{1, 0.5, 0}; !slices.Equal(got, want) {
		t.Fatalf("first scores = %v, want %v", got, want)
	}
	// a was just given one: b and c now come first, a last.
	if got, want := cycle(s, cold("a", "b", "c"), 1), []float64{0, 1, 0.5}; !slices.Equal(got, want) {
		t.Fatalf("second scores = %v, want %v", got, want)
	}
	// c never had one; a had one before b.
	if got, want := cycle(s, cold("a", "b", "c"), 2), []float64{0.5, 0, 1}; !slices.Equal(got, want) {
		t.Fatalf("third scores = %v, want %v", got, want)
	}
}

func TestAWarmRequestLeavesTheChoiceToOthers(t *testing.T) {
	t.Parallel()
	s := nohitlru.New("n", nohitlru.Params{})
	warm := schedtest.Cands(schedtest.C{Name: "a", Prefix: schedtest.Info(8, 3, 0, 0, 0)}, schedtest.C{Name: "b", Prefix: schedtest.Info(8, 0, 0, 0, 0)})
	if got, want := cycle(s, warm, 1), []float64{0.5, 0.5}; !slices.Equal(got, want) {
		t.Fatalf("warm scores = %v, want %v", got, want)
	}
	// The warm pick was not remembered: b still ranks by candidate order.
	if got, want := cycle(s, cold("b", "a"), 0), []float64{1, 0}; !slices.Equal(got, want) {
		t.Fatalf("cold scores after a warm pick = %v, want %v", got, want)
	}
}

func TestTheLRUIsBounded(t *testing.T) {
	t.Parallel()
	p, err := nohitlru.Factory("n", json.RawMessage(`{"lruSize":1}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := p.(*nohitlru.Scorer)
	cycle(s, cold("a", "b"), 0)
	cycle(s, cold("a", "b"), 1)
	// Only b is remembered: a counts as never given one.
	if got, want := cycle(s, cold("b", "a"), 0), []float64{0, 1}; !slices.Equal(got, want) {
		t.Fatalf("scores = %v, want %v", got, want)
	}
	if _, err := nohitlru.Factory("n", json.RawMessage(`{"size":1}`), nil); err == nil {
		t.Error("an unknown parameter was accepted")
	}
}
