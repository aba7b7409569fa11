package latencyinfo_test

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/latencyinfo"
)

func TestRefReadsThePublishedPredictionInPlace(t *testing.T) {
	t.Parallel()
	cand := func() *datalayer.Candidate {
		return datalayer.NewCandidate(&datalayer.Endpoint{Name: "e", Address: "10.0.0.1:8000"}, datalayer.Metrics{}, 0)
	}
	c := cand()
	if got := latencyinfo.Ref(c); got != nil {
		t.Errorf("no prediction: %+v, want nil", got)
	}
	p := &datalayer.LatencyPredictionInfo{TTFTValid: true, TTFTMean: 42}
	c.Put(datalayer.LatencyPredictionInfoKey, p)
	if got := latencyinfo.Ref(c); got != p {
		t.Errorf("a published pointer: %p, want the same %p", got, p)
	}
	v := cand()
	v.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{TTFTValid: true, TTFTMean: 7})
	if got := latencyinfo.Ref(v); got == nil || got.TTFTMean != 7 || !got.TTFTValid {
		t.Errorf("a published value: %+v, want its copy", got)
	}
	n := cand()
	n.Put(datalayer.LatencyPredictionInfoKey, (*datalayer.LatencyPredictionInfo)(nil))
	if got := latencyinfo.Ref(n); got != nil {
		t.Errorf("a nil pointer: %+v, want nil", got)
	}
}
