package epp

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/localtokenizer"
	"github.com/kvroute/kvroute/pkg/tokenizer"

	"github.com/kvroute/kvroute/pkg/sim"
)

func TestRequestPathTokenizesConfiguredModelsInProcess(t *testing.T) {
	t.Parallel()
	tok, err := tokenizer.Load("../tokenizer/testdata/tiny", tokenizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		remote bool
	}{
		{"with /tokenize on, a local tokenizer sits in front of it", true},
		{"with /tokenize off, the local tokenizer stands alone", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := &EPP{reg: prometheus.NewRegistry(), opts: Options{RequestPath: RequestPathOptions{
				Tokenize: tc.remote, Tokenizers: map[string]*tokenizer.Tokenizer{"m": tok}, TokenizerDriftEvery: -1,
			}}}
			local, ok := e.newTokenizer().(*localtokenizer.Local)
			if !ok {
				t.Fatalf("request path tokenizer is %T, want *localtokenizer.Local", e.newTokenizer())
			}
			defer local.Close()
			req := &request.Request{API: request.APICompletions, Model: "m", Prompt: "hello world!", AddSpecialTokens: true}
			got, err := local.Tokenize(context.Background(), req)
			want, _ := tok.Encode(req.Prompt, true)
			if err != nil || !slices.Equal(got, want) {
				t.Fatalf("Tokenize = %v, %v; want %v", got, err, want)
			}
			if !tc.remote {
				other := &request.Request{API: request.APICompletions, Model: "other", Prompt: "x"}
				if _, err := local.Tokenize(context.Background(), other); !errors.Is(err, tokenize.ErrUnsupported) {
					t.Fatalf("other model without a fallback: err %v, want tokenize.ErrUnsupported", err)
				}
			}
		})
	}
}

func TestAGivenTokenizerGoesBeforeTheConfiguredOnes(t *testing.T) {
	t.Parallel()
	tok, err := tokenizer.Load("../tokenizer/testdata/tiny", tokenizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &EPP{reg: prometheus.NewRegistry(), opts: Options{RequestPath: RequestPathOptions{
		Tokenizers: map[string]*tokenizer.Tokenizer{"m": tok}, TokenizerDriftEvery: -1,
		Tokenizer: simkit.Tokenizer{Model: "sim-model"},
	}}}
	tz := e.newTokenizer()
	defer tz.(interface{ Close() }).Close()
	ctx := context.Background()
	simReq := &request.Request{API: request.APICompletions, Model: "sim-model", Prompt: "hello world hello"}
	if got, err := tz.Tokenize(ctx, simReq); err != nil || !slices.Equal(got, sim.Tokenize(simReq.Prompt)) {
		t.Errorf("the given tokenizer's model: %v, %v; want the simulator's ids", got, err)
	}
	req := &request.Request{API: request.APICompletions, Model: "m", Prompt: "hello world!", AddSpecialTokens: true}
	want, _ := tok.Encode(req.Prompt, true)
	if got, err := tz.Tokenize(ctx, req); err != nil || !slices.Equal(got, want) {
		t.Errorf("a configured model: %v, %v; want the in-process tokenizer's %v", got, err, want)
	}
	e.opts.RequestPath.Tokenizers = nil
	if _, ok := e.newTokenizer().(simkit.Tokenizer); !ok {
		t.Errorf("with nothing else configured the request path tokenizer is %T, want the given one alone", e.newTokenizer())
	}
}
