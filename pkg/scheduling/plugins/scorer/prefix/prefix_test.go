package prefix_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefix"
)

func TestScoreIsMatchOverTotalWhateverTheTier(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		c    schedtest.C
		want float64
	}{
		{"a full GPU match scores 1", schedtest.C{Name: "a", Prefix: schedtest.Info(8, 8, 0, 0, 0)}, 1},
		{"CPU and storage blocks count fully", schedtest.C{Name: "a", Prefix: schedtest.Info(8, 0, 2, 2, 0)}, 0.5},
		{"speculative blocks count as matched", schedtest.C{Name: "a", Prefix: schedtest.Info(8, 1, 0, 0, 1)}, 0.25},
		{"no full block scores 0", schedtest.C{Name: "a", Prefix: schedtest.Info(0, 0, 0, 0, 0)}, 0},
		{"no prefix info scores 0", schedtest.C{Name: "a"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := []float64{-1}
			prefix.New("p").Score(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(tt.c), out)
			if out[0] != tt.want {
				t.Errorf("score = %v, want %v", out[0], tt.want)
			}
		})
	}
}

func TestMatchLengthBlendsInHowLongTheMatchIs(t *testing.T) {
	t.Parallel()
	s, err := prefix.Factory("p", json.RawMessage(`{"matchLengthWeight":0.5,"matchLengthScaleTokens":1024,"routingHistory":false}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	// 16-token blocks: 32 of 64 held is 512 tokens, half the scale, so the
	// length scores 0.25 and the ratio 0.5; 64 of 64 is past the scale.
	schedtest.RunScoreCases(t, s.(framework.Scorer), []schedtest.ScoreCase{
		{Name: "half the prompt, half the scale", Cands: []schedtest.C{{Name: "a", Prefix: schedtest.Info(64, 32, 0, 0, 0)}}, Want: []float64{0.5*0.25 + 0.5*0.5}},
		{Name: "a match past the scale counts in full", Cands: []schedtest.C{{Name: "a", Prefix: schedtest.Info(128, 64, 0, 0, 0)}}, Want: []float64{0.5*1 + 0.5*0.5}},
		{Name: "no match scores 0", Cands: []schedtest.C{{Name: "a", Prefix: schedtest.Info(64, 0, 0, 0, 0)}}, Want: []float64{0}},
	})
}

func TestMatchLengthParametersAreChecked(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		`{"matchLengthWeight":1.5}`:                            `invalid plugin parameters: plugin "p" (type prefix-cache-scorer): matchLengthWeight = 1.5, want it in [0, 1]`,
		`{"matchLengthWeight":0.5,"matchLengthScaleTokens":0}`: `invalid plugin parameters: plugin "p" (type prefix-cache-scorer): matchLengthScaleTokens = 0, want > 0 with a match-length weight`,
	} {
		if _, err := prefix.Factory("p", json.RawMessage(raw), nil); err == nil || err.Error() != want {
			t.Errorf("%s: err = %v, want %s", raw, err, want)
		}
	}
}

func TestFactoryRefusesUnknownParameters(t *testing.T) {
	t.Parallel()
	if _, err := prefix.Factory("p", json.RawMessage(`{}`), &config.Handle{Spec: schedtest.NopSpeculator{}}); err != nil {
		t.Fatalf("empty parameters: %v", err)
	}
	_, err := prefix.Factory("p", json.RawMessage(`{"blockSize":16}`), nil)
	want := `invalid plugin parameters: plugin "p" (type prefix-cache-scorer): json: unknown field "blockSize"`
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}

func TestTheRoutingHistoryScoresWhereItSaysMoreThanTheCache(t *testing.T) {
	t.Parallel()
	s, err := prefix.Factory("p", nil, &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		held   int
		routed *datalayer.RoutedPrefix
		want   float64
	}{
		{"a prefix sent there and evicted since scores as sent", 0, &datalayer.RoutedPrefix{Blocks: 8, TotalBlocks: 8}, 1},
		{"held blocks the history does not know of score as held", 6, &datalayer.RoutedPrefix{Blocks: 2, TotalBlocks: 8}, 0.75},
		{"without a routed answer the holdings score", 4, nil, 0.5},
		{"nothing held nor sent scores 0", 0, &datalayer.RoutedPrefix{TotalBlocks: 8}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cands := schedtest.Cands(schedtest.C{Name: "a", Prefix: schedtest.Info(8, tt.held, 0, 0, 0)})
			if tt.routed != nil {
				cands[0].Put(datalayer.RoutedPrefixKey, *tt.routed)
			}
			out := []float64{-1}
			s.(framework.Scorer).Score(context.Background(), schedtest.Cycle(), &request.Request{}, cands, out)
			if out[0] != tt.want {
				t.Errorf("score = %v, want %v", out[0], tt.want)
			}
		})
	}
}

// history keeps the routing history in a real approximate index.
type history struct {
	schedtest.NopSpeculator
	x *approx.Index
}

func (h history) RecordHistory(addr string, hashes []uint64) { h.x.Record(addr, hashes) }

func TestEachPrimaryPickIsRecordedInTheRoutingHistory(t *testing.T) {
	t.Parallel()
	x := approx.New(0, nil)
	p, err := prefix.Factory("p", nil, &config.Handle{Spec: history{x: x}})
	if err != nil {
		t.Fatal(err)
	}
	pp, ok := p.(framework.PostPick)
	if !ok {
		t.Fatalf("%T records no picks", p)
	}
	keys := []uint64{11, 12, 13}
	cands := schedtest.Cands(schedtest.C{Name: "a"}, schedtest.C{Name: "b"})
	for _, c := range cands {
		c.Put(framework.RequestBlockKeysKey, keys)
	}
	pp.PostPick(context.Background(), schedtest.Cycle(), &request.Request{}, &framework.ProfileResult{Picked: []*datalayer.Candidate{cands[1], cands[0]}})
	out := make([]int, 2)
	x.Match(keys, []string{cands[0].Address, cands[1].Address}, out)
	if out[0] != 0 || out[1] != 3 {
		t.Errorf("history matches a %d and b %d blocks, want only the primary pick b, all 3", out[0], out[1])
	}

	off, err := prefix.Factory("p", json.RawMessage(`{"routingHistory":false}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := off.(framework.PostPick); ok {
		t.Error("without the routing history the scorer still records picks")
	}
	if _, err := prefix.Factory("p", nil, nil); err == nil {
		t.Error("the routing history loaded in a process that keeps none")
	}
}
