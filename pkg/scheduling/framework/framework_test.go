package framework_test

import (
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

func TestDecodeParams(t *testing.T) {
	t.Parallel()
	type params struct {
		N int `json:"n"`
	}
	tests := []struct {
		name    string
		raw     string
		want    int
		wantErr string
	}{
		{"absent parameters keep the defaults", "", 7, ""},
		{"null parameters keep the defaults", " null ", 7, ""},
		{"a known field is decoded", `{"n": 3}`, 3, ""},
		{"an unknown field is named", `{"m": 3}`, 0, `invalid plugin parameters: plugin "x" (type t): json: unknown field "m"`},
		{"trailing data is refused", `{"n": 3} {}`, 0, `invalid plugin parameters: plugin "x" (type t): trailing data after parameters`},
		{"a non-object is refused", `[1]`, 0, `invalid plugin parameters: plugin "x" (type t): json: cannot unmarshal array into Go value of type framework_test.params`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := params{N: 7}
			err := framework.DecodeParams("t", "x", json.RawMessage(tt.raw), &p)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr || !errors.Is(err, framework.ErrInvalidParams) {
					t.Fatalf("err = %v, want %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || p.N != tt.want {
				t.Fatalf("n = %d, err = %v; want %d", p.N, err, tt.want)
			}
		})
	}
}

func TestCycleState(t *testing.T) {
	t.Parallel()
	now := time.Unix(100, 0)
	a, b := framework.NewCycleState(now, 1, 2), framework.NewCycleState(now, 1, 2)
	if a.Now() != now {
		t.Errorf("Now() = %v", a.Now())
	}
	if a.Rand().Uint64() != b.Rand().Uint64() {
		t.Error("equal seeds gave different random streams")
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { a.Write("k", i) })
	}
	wg.Wait()
	if _, ok := a.Read("k"); !ok {
		t.Error("written value not read back")
	}
	if _, ok := a.Read("missing"); ok {
		t.Error("read a value never written")
	}
}

func TestResultTargets(t *testing.T) {
	t.Parallel()
	c := datalayer.NewCandidate(&datalayer.Endpoint{Name: "a"}, datalayer.Metrics{}, datalayer.StreamNone)
	r := &framework.Result{PrimaryProfile: "p", Profiles: map[string]*framework.ProfileResult{"p": {Picked: []*datalayer.Candidate{c}}}}
	if got := r.Targets(); len(got) != 1 || got[0] != c {
		t.Errorf("Targets() = %v", got)
	}
	if got := (*framework.Result)(nil).Targets(); got != nil {
		t.Errorf("nil result Targets() = %v", got)
	}
	for cat, want := range map[framework.ScorerCategory]string{framework.Affinity: "affinity", framework.Distribution: "distribution", framework.Balance: "balance", 9: "unknown"} {
		if cat.String() != want {
			t.Errorf("%d.String() = %s, want %s", cat, cat, want)
		}
	}
}

func TestASplitResultNamesItsPrefillAndEncodePicks(t *testing.T) {
	t.Parallel()
	mk := func(n string) *datalayer.Candidate {
		return datalayer.NewCandidate(&datalayer.Endpoint{Name: n}, datalayer.Metrics{}, datalayer.StreamNone)
	}
	d, p, e := mk("d"), mk("p"), mk("e")
	r := &framework.Result{PrimaryProfile: "decode", PrefillProfile: "prefill", EncodeProfile: "encode",
		Profiles: map[string]*framework.ProfileResult{"decode": {Picked: []*datalayer.Candidate{d}}, "prefill": {Picked: []*datalayer.Candidate{p}}, "encode": {Picked: []*datalayer.Candidate{e}}}}
	if r.Targets()[0] != d || r.Prefill() != p || len(r.Encoders()) != 1 || r.Encoders()[0] != e {
		t.Errorf("targets %v, prefill %v, encoders %v", r.Targets(), r.Prefill(), r.Encoders())
	}
	decodeOnly := &framework.Result{PrimaryProfile: "decode", Profiles: r.Profiles}
	if decodeOnly.Prefill() != nil || decodeOnly.Encoders() != nil || (*framework.Result)(nil).Prefill() != nil {
		t.Error("a result that names no prefill or encode profile has a prefill or encode pick")
	}
	emptyPrefill := &framework.Result{PrimaryProfile: "decode", PrefillProfile: "prefill", Profiles: map[string]*framework.ProfileResult{"prefill": {}}}
	if emptyPrefill.Prefill() != nil {
		t.Error("a prefill profile that picked nobody has a pick")
	}
	for _, tt := range []struct {
		encode, prefill bool
		want            framework.Decision
	}{{false, false, "decode-only"}, {false, true, "prefill-decode"}, {true, false, "encode-decode"}, {true, true, "encode-prefill-decode"}} {
		if got := framework.DecisionOf(tt.encode, tt.prefill); got != tt.want {
			t.Errorf("DecisionOf(%v, %v) = %s, want %s", tt.encode, tt.prefill, got, tt.want)
		}
	}
}
