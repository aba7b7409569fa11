package epp

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/hftokenizer"
)

func TestRequestPathTokenizesConfiguredModelsInProcess(t *testing.T) {
	t.Parallel()
	tok, err := hftokenizer.Load("../requestpath/tokenize/hftokenizer/testdata/tiny", hftokenizer.Options{})
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
				Tokenize: tc.remote, Tokenizers: map[string]*hftokenizer.Tokenizer{"m": tok}, TokenizerDriftEvery: -1,
			}}}
			local, ok := e.newTokenizer().(*hftokenizer.Local)
			if !ok {
				t.Fatalf("request path tokenizer is %T, want *hftokenizer.Local", e.newTokenizer())
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
