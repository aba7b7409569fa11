package config_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
)

// pdCorpus are upstream's disaggregated-serving files: each loads, and
// splits requests as upstream would, checked by scheduling requests over a
// pool of a decode, a prefill and an encode pod.
var pdCorpus = map[string]corpusCase{
	"llmd-v0.2.1-pd-epp-config.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}, check: wantSplits("pd-profile-handler",
		// No threshold: 0, which splits every request.
		pdCase{"a cold prompt is split", 100, 0, false, framework.PrefillDecode},
		pdCase{"a prompt the decode pod holds whole is split too", 96, 6, false, framework.PrefillDecode},
	)},
	"llmd-guide-v0.5-pd-disaggregation-values.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
	}, check: wantSplits("pd-profile-handler",
		pdCase{"threshold 0 splits a cold prompt", 100, 0, false, framework.PrefillDecode},
		pdCase{"threshold 0 splits a cached prompt", 96, 6, false, framework.PrefillDecode},
	)},
	"router-v0.10.0-pd-epp-config.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}, check: wantSplits("disagg-profile-handler",
		// nonCachedTokens 16; the decider is named before it is defined.
		pdCase{"100 uncached tokens are split", 100, 0, false, framework.PrefillDecode},
		pdCase{"4 uncached tokens stay on the decode pod", 100, 6, false, framework.DecodeOnly},
		pdCase{"16 uncached tokens are split", 112, 6, false, framework.PrefillDecode},
	)},
	"router-main-sim-pd-epp-config.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}, check: wantSplits("disagg-profile-handler",
		pdCase{"100 uncached tokens are split", 100, 0, false, framework.PrefillDecode},
		pdCase{"4 uncached tokens stay on the decode pod", 100, 6, false, framework.DecodeOnly},
	)},
	"router-main-sim-e-pd-epp-config.yaml": {profiles: map[string][]string{
		"encode": {"filter:encode-filter/encode-filter", "picker:max-score-picker/max-score-picker"},
		"decode": {"filter:decode-filter/decode-filter", "picker:max-score-picker/max-score-picker"},
	}, check: wantSplits("disagg-profile-handler",
		pdCase{"a request with an image is encoded apart", 100, 0, true, framework.EncodeDecode},
		pdCase{"a text request is not", 100, 0, false, framework.DecodeOnly},
	)},
	// llm-d's wide-EP guide with DP-aware scheduling: each rank its own
	// vLLM API server on its own port (the pool's targetPorts 8000-8007),
	// so each rank is an endpoint of its own, <pod>-rank-<i>.
	"llmd-guide-main-wide-ep-dp-aware-values.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "scorer:active-request-scorer/active-request-scorer*2", "scorer:queue-scorer/queue-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:active-request-scorer/active-request-scorer*1", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
	}, check: wantSplits("disagg-profile-handler",
		pdCase{"always-disagg splits a cold prompt", 100, 0, false, framework.PrefillDecode},
	)},
	"router-main-pd-topology-epp-config.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "filter:topology-affinity-filter/topology-affinity-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:queue-scorer/queue-scorer*1", "scorer:topology-affinity-scorer/topology-affinity-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}, check: wantPrefillNearDecode},
	"llmd-guide-main-pd-disaggregation-values.yaml": {profiles: map[string][]string{
		"prefill": {"filter:prefill-filter/prefill-filter", "filter:prefix-cache-affinity-filter/prefix-cache-affinity-filter", "scorer:token-load-scorer/token-load-scorer*1", "picker:max-score-picker/max-score-picker"},
		"decode":  {"filter:decode-filter/decode-filter", "scorer:active-request-scorer/active-request-scorer*1", "picker:max-score-picker/max-score-picker"},
	}, check: wantSplits("disagg-profile-handler",
		pdCase{"always-disagg splits a cold prompt", 100, 0, false, framework.PrefillDecode},
		pdCase{"and a prompt the decode pod holds", 96, 6, false, framework.PrefillDecode},
	)},
}

// pdCase is one request scheduled over a loaded P/D configuration: its
// prompt length, how many 16-token blocks of it the decode pod holds,
// whether it has an image, and the decision wanted.
type pdCase struct {
	name       string
	tokens     int
	heldBlocks int
	multimodal bool
	want       framework.Decision
}

// wantSplits schedules each case with the loaded configuration's handler
// (of type handler) over a decode pod d, a prefill pod p and an encode pod
// e, and checks the decision, the primary pick and the stage picks.
func wantSplits(handler string, cases ...pdCase) func(t *testing.T, l *config.Loaded) {
	return func(t *testing.T, l *config.Loaded) {
		t.Helper()
		if got := l.Handler.TypedName().Type; got != handler {
			t.Fatalf("profile handler %s, want %s", got, handler)
		}
		sched, err := scheduling.New(l.SchedulerOptions())
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range cases {
			ids := make([]uint32, tc.tokens)
			req := &request.Request{ID: tc.name, Model: "m", TokenIDs: ids, API: request.APICompletions}
			if tc.multimodal {
				req.API, req.NoReproduciblePrefix, req.TokenIDs = request.APIChatCompletions, true, nil
			}
			role := func(r string) map[string]string { return map[string]string{bylabel.RoleLabel: r} }
			total := tc.tokens / schedtest.BlockSize
			cands := schedtest.Cands(
				schedtest.C{Name: "d", Labels: role(bylabel.RoleDecode), Prefix: schedtest.Info(total, tc.heldBlocks, 0, 0, 0)},
				schedtest.C{Name: "p", Labels: role(bylabel.RolePrefill), Prefix: schedtest.Info(total, 0, 0, 0, 0)},
				schedtest.C{Name: "e", Labels: role(bylabel.RoleEncode), Prefix: schedtest.Info(total, 0, 0, 0, 0)},
			)
			res, err := sched.Schedule(context.Background(), req, cands)
			if err != nil {
				t.Errorf("%s: %v", tc.name, err)
				continue
			}
			if res.Decision != tc.want || res.Targets()[0].Name != "d" {
				t.Errorf("%s: decision %s (%s) to %s, want %s to d", tc.name, res.Decision, res.Reason, res.Targets()[0].Name, tc.want)
			}
			wantPrefill := tc.want == framework.PrefillDecode || tc.want == framework.EncodePrefillDecode
			if p := res.Prefill(); wantPrefill != (p != nil) || (p != nil && p.Name != "p") {
				t.Errorf("%s: prefill pick %v", tc.name, p)
			}
			wantEncode := tc.want == framework.EncodeDecode || tc.want == framework.EncodePrefillDecode
			if e := res.Encoders(); wantEncode != (len(e) > 0) || (len(e) > 0 && e[0].Name != "e") {
				t.Errorf("%s: encode picks %v", tc.name, e)
			}
		}
	}
}

// wantPrefillNearDecode schedules split requests over two racks, r1 and
// r2, of a decode and a prefill pod each, with the decode pick made by
// which decode pod holds the prompt's first blocks: the prefill pick is
// on the decode pick's host when a prefill pod is (minAffinity host),
// else in its rack (the scorer's 0.2 over equal queues), and follows the
// decode pick from rack to rack.
func wantPrefillNearDecode(t *testing.T, l *config.Loaded) {
	t.Helper()
	sched, err := scheduling.New(l.SchedulerOptions())
	if err != nil {
		t.Fatal(err)
	}
	role := func(r string) map[string]string { return map[string]string{bylabel.RoleLabel: r} }
	at := func(host, rack string) datalayer.Topology {
		return datalayer.Topology{Host: host, Rack: rack, Zone: "z1", Region: "g1"}
	}
	const tokens = 100
	total := tokens / schedtest.BlockSize
	pool := func(warm string, more ...schedtest.C) []schedtest.C {
		held := func(name string) int {
			if name == warm {
				return 2
			}
			return 0
		}
		return append([]schedtest.C{
			{Name: "d-r1", Labels: role(bylabel.RoleDecode), Topology: at("h1", "r1"), Prefix: schedtest.Info(total, held("d-r1"), 0, 0, 0)},
			{Name: "d-r2", Labels: role(bylabel.RoleDecode), Topology: at("h3", "r2"), Prefix: schedtest.Info(total, held("d-r2"), 0, 0, 0)},
			{Name: "p-r1", Labels: role(bylabel.RolePrefill), Topology: at("h2", "r1"), Prefix: schedtest.Info(total, 0, 0, 0, 0)},
			{Name: "p-r2", Labels: role(bylabel.RolePrefill), Topology: at("h4", "r2"), Prefix: schedtest.Info(total, 0, 0, 0, 0)},
		}, more...)
	}
	for _, tc := range []struct {
		name                  string
		cands                 []schedtest.C
		wantDecode, wantPfill string
	}{
		{"decode in r1: prefill in r1", pool("d-r1"), "d-r1", "p-r1"},
		{"decode in r2: prefill in r2", pool("d-r2"), "d-r2", "p-r2"},
		{"a prefill pod on the decode pod's host wins despite its queue", pool("d-r1",
			schedtest.C{Name: "p-h1", Labels: role(bylabel.RolePrefill), Topology: at("h1", "r1"), Queue: 5, Prefix: schedtest.Info(total, 0, 0, 0, 0)}), "d-r1", "p-h1"},
	} {
		req := &request.Request{ID: tc.name, Model: "m", TokenIDs: make([]uint32, tokens), API: request.APICompletions}
		res, err := sched.Schedule(context.Background(), req, schedtest.Cands(tc.cands...))
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		p := res.Prefill()
		if res.Decision != framework.PrefillDecode || res.Targets()[0].Name != tc.wantDecode || p == nil || p.Name != tc.wantPfill {
			t.Errorf("%s: decision %s (%s), decode %s, prefill %v; want prefill-decode, %s, %s", tc.name, res.Decision, res.Reason, res.Targets()[0].Name, p, tc.wantDecode, tc.wantPfill)
		}
	}
}
