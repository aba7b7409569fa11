package latencyslo_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/admitter/latencyslo"
)

func predicted(name string, ttft float64, slo time.Duration) *datalayer.Candidate {
	c := schedtest.C{Name: name}.Build()
	c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{TTFTValid: true, TPOTValid: true, Quantile: 0.9,
		TTFT: ttft, HasTTFTSLO: true, TTFTHeadroom: float64(slo.Milliseconds()) - ttft})
	return c
}

func TestASheddableRequestNoEndpointCanServeInTimeIsRefused(t *testing.T) {
	t.Parallel()
	p, err := latencyslo.Factory("a", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := p.(framework.Admitter)
	slo := 200 * time.Millisecond
	late := []*datalayer.Candidate{predicted("a", 450, slo), predicted("b", 300, slo)}
	tests := []struct {
		name    string
		req     *request.Request
		cands   []*datalayer.Candidate
		refused bool
	}{
		{"sheddable, every endpoint predicted late: refused", &request.Request{Priority: -1, SLO: request.SLO{TTFT: slo}}, late, true},
		{"sheddable, one endpoint in time: admitted", &request.Request{Priority: -1, SLO: request.SLO{TTFT: slo}},
			[]*datalayer.Candidate{predicted("a", 450, slo), predicted("b", 150, slo)}, false},
		{"not sheddable: admitted however late", &request.Request{SLO: request.SLO{TTFT: slo}}, late, false},
		{"sheddable without an SLO: admitted", &request.Request{Priority: -1}, late, false},
		{"no valid prediction at all: admitted", &request.Request{Priority: -1, SLO: request.SLO{TTFT: slo}},
			[]*datalayer.Candidate{schedtest.C{Name: "x"}.Build()}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := a.Admit(context.Background(), tt.req, tt.cands)
			if !tt.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !errors.Is(err, framework.ErrShed) {
				t.Fatalf("err = %v, want ErrShed", err)
			}
			if want := "no endpoint is predicted to meet its TTFT SLO of 200ms (the best predicted p90 is 300ms)"; !strings.Contains(err.Error(), want) {
				t.Errorf("reason = %q, want it to say %q", err, want)
			}
		})
	}
}
