package always_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/always"
)

func TestAlwaysDisaggPDSplitsEveryRequest(t *testing.T) {
	t.Parallel()
	p, err := always.PDFactory("a", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []*request.Request{{}, {TokenIDs: make([]uint32, 100000)}} {
		if v := p.(framework.Decider).Disaggregate(context.Background(), schedtest.Cycle(), req, nil); !v.Split || v.Reason != framework.ReasonAlways {
			t.Errorf("verdict %+v", v)
		}
	}
}

func TestTheMultimodalDeciderSplitsOnlyRequestsWithMediaParts(t *testing.T) {
	t.Parallel()
	p, err := always.MultimodalFactory("m", json.RawMessage(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		req   request.Request
		split bool
	}{
		{"a chat request with an image part", request.Request{API: request.APIChatCompletions, NoReproduciblePrefix: true}, true},
		{"a text chat request", request.Request{API: request.APIChatCompletions}, false},
		{"a completion given as embeddings has nothing to encode", request.Request{API: request.APICompletions, NoReproduciblePrefix: true}, false},
	}
	for _, tt := range tests {
		if v := p.(framework.Decider).Disaggregate(context.Background(), schedtest.Cycle(), &tt.req, nil); v.Split != tt.split {
			t.Errorf("%s: verdict %+v, want split %v", tt.name, v, tt.split)
		}
	}
}

func TestTheUnconditionalDecidersTakeNoParameters(t *testing.T) {
	t.Parallel()
	for _, f := range []framework.Factory{always.PDFactory, always.MultimodalFactory} {
		if _, err := f("x", json.RawMessage(`{"nonCachedTokens": 1}`), nil); !errors.Is(err, framework.ErrInvalidParams) {
			t.Errorf("err = %v, want ErrInvalidParams", err)
		}
	}
}
