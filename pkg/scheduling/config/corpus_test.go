package config_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// corpusCase is what one upstream configuration file must load as: the
// profiles its author wrote, each as shape reports it, or the refusal that
// names the plugin kvroute cannot honour and what to use instead.
type corpusCase struct {
	profiles map[string][]string
	refusal  string
	check    func(t *testing.T, l *config.Loaded)
}

// upstreamCorpus covers testdata/upstream, real configurations from the
// Gateway API Inference Extension (v0.5 to v1.5), llm-d's inference
// scheduler (v0.2 to v0.8) and llm-d's router (v0.9, v0.10, main); each
// file's first line names its source.
var upstreamCorpus = map[string]corpusCase{
	// llm-d's data-parallel configuration: its one profile, each rank an
	// endpoint of its own port.
	"llmd-v0.8.0-dp-epp-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"gie-v0.5.1-conformance-plugins.yaml": {profiles: map[string][]string{
		"conformance-profile": {"filter:header-based-testing-filter/header-based-testing-filter", "picker:max-score-picker/max-score-picker"},
	}},
	"gie-v0.5.1-e2e-default-plugins.yaml": {profiles: map[string][]string{
		"default": {"filter:low-latency-filter/decision-tree-filter", "picker:random-picker/random-picker"},
	}},
	"gie-v0.5.1-e2e-plugins-v2.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*1", "scorer:kv-cache-scorer/kv-cache-utilization-scorer*1", "scorer:prefix-cache-scorer/prefix-cache-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"gie-v1.0.2-chart-default-plugins.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*1", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*1", "scorer:prefix-cache-scorer/prefix-cache-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"gie-v1.3.1-config-text-prefix-example.yaml": {profiles: map[string][]string{
		"default": {"scorer:prefix-cache-scorer/prefix-cache-scorer*50", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"gie-v1.3.1-config-text-saturation-inline.yaml": {profiles: map[string][]string{
		"default": {"picker:max-score-picker/max-score-picker"},
	}, check: wantThresholds(saturationdetector.Thresholds{QueueDepth: 8, KVCacheUtil: 0.75}, 150*time.Millisecond)},
	"gie-v1.4.0-chart-default-plugins.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"gie-v1.5.0-chart-default-plugins.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"gie-v1.5.0-config-text-utilization-detector.yaml": {profiles: map[string][]string{
		"default": {"picker:max-score-picker/max-score-picker"},
	}, check: wantThresholds(saturationdetector.Thresholds{QueueDepth: 8, KVCacheUtil: 0.8}, 0)},
	"gie-v1.5.0-integration-default-config.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*1", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*1", "scorer:prefix-cache-scorer/prefix-cache-scorer*1", "scorer:lora-affinity-scorer/lora-affinity-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"llmd-v0.2.1-epp-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"llmd-v0.2.1-epp-prefix-cache-tracking-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "scorer:kv-cache-scorer/kv-cache-utilization-scorer*1", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-v0.2.1-epp-prefix-estimate-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:load-aware-scorer/load-aware-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"llmd-v0.3.2-epp-precise-prefix-cache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*2", "scorer:kv-cache-scorer/kv-cache-utilization-scorer*1", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-v0.3.2-sim-epp-kvcache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*10", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-v0.4.0-sim-epp-no-hit-lru.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:no-hit-lru-scorer/no-hit-lru-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer", "postpick:no-hit-lru-scorer/no-hit-lru-scorer"},
	}},
	"llmd-v0.5.1-sim-epp-kvcache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*10", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-v0.6.1-sim-epp-no-hit-lru.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*2", "scorer:no-hit-lru-scorer/no-hit-lru-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:no-hit-lru-scorer/no-hit-lru-scorer"},
	}},
	"llmd-v0.7.1-sim-epp-external-tokenizer-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*10", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-v0.8.0-epp-estimate-prefix-cache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*1", "scorer:load-aware-scorer/load-aware-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"llmd-v0.8.0-epp-precise-prefix-cache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*1", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
	}},
	"gie-v1.5.0-chart-latency-predictor.yaml": {profiles: map[string][]string{
		"default": {"filter:strict-affinity-filter/prefix-cache-affinity-filter", "filter:slo-headroom-tier-filter/slo-headroom-tier-filter", "filter:loose-affinity-filter/prefix-cache-affinity-filter",
			"scorer:latency-scorer/latency-scorer*1", "picker:weighted-random-picker/weighted-random-picker"},
	}},
	"llmd-main-guide-precise-disaggregated-tokenization.yaml": {profiles: map[string][]string{
		"default": {"scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*3", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:active-request-scorer/active-request-scorer*2", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-main-guide-optimized-baseline.yaml": {profiles: map[string][]string{
		"default": {"filter:prefix-cache-affinity-filter/prefix-cache-affinity-filter", "scorer:token-load-scorer/token-load-scorer*1", "picker:max-score-picker/max-score-picker"},
	}},
	"llmd-main-guide-slo-aware.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*1", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*1", "picker:max-score-picker/max-score-picker"},
		"slo":     {"scorer:prefix-cache-scorer/prefix-cache-scorer*1", "scorer:slo-scorer/latency-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}, check: func(t *testing.T, l *config.Loaded) {
		wantHandler("slo-aware-profile-handler")(t, l)
		wantLeastHeadroom(t, l, "slo", "slo-scorer")
	}},
	"refused-gie-v1.5.0-conformance-plugins.yaml":                {refusal: `plugin "destination-endpoint-served-verifier": unsupported upstream plugin type "destination-endpoint-served-verifier": the conformance tests' echo of the served endpoint in a response header of its own; kvroute's standalone proxy returns x-gateway-destination-endpoint-served itself, and its ext_proc server sets no response headers`},
	"refused-router-main-chart-triton.yaml":                      {refusal: `invalid plugin parameters: plugin "core-metrics-extractor" (type core-metrics-extractor): parameter defaultEngine: kvroute reads vLLM's metric names; another engine's cannot be selected`},
	"refused-router-v0.10.0-epp-burst-prefix-cache-config.yaml":  {refusal: `plugin "burst-prefix-cache-producer": unsupported upstream plugin type "burst-prefix-cache-producer": use speculative-prefix-recorder, which makes a burst of same-prefix requests follow its first pick`},
	"refused-router-v0.10.0-epp-mm-embeddings-cache-config.yaml": {refusal: `plugin "mm-embeddings-cache-producer": unsupported upstream plugin type "mm-embeddings-cache-producer": kvroute does not track multimodal encoder caches`},
	"router-v0.10.0-perf-precise-prefix.yaml": {profiles: map[string][]string{
		"default": {"scorer:active-request-scorer/active-request-scorer*4", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:no-hit-lru-scorer/no-hit-lru-scorer*2", "picker:max-score-picker/max-score-picker",
			"postpick:no-hit-lru-scorer/no-hit-lru-scorer", "postpick:speculative-prefix-recorder/speculative-prefix-recorder"},
	}},
	"refused-router-v0.10.0-probabilistic-admitter-epp-config.yaml": {refusal: `plugin "probabilistic-admitter": unsupported upstream plugin type "probabilistic-admitter": use utilization-detector, which sheds sheddable requests when every candidate is saturated`},
	"refused-router-v0.10.0-sim-epp-gpu-config.yaml":                {refusal: `plugin "gpu-utilization-filter": unsupported upstream plugin type "endpoint-attribute-filter": kvroute filters on vLLM's metrics (saturation-filter), not arbitrary endpoint attributes`},
	"router-main-chart-default-plugins.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"router-v0.10.0-soft-reflective-ceiling-epp-config.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}, check: func(t *testing.T, l *config.Loaded) {
		// The gate on with upstream's defaults: no global limit, FCFS
		// within a flow, global-strict across flows.
		want := &config.FlowControl{DefaultBand: config.FlowBand{Ordering: "fcfs-ordering-policy", Fairness: "global-strict-fairness-policy"}}
		if !reflect.DeepEqual(l.FlowControl, want) {
			t.Errorf("flow control = %+v, want %+v", l.FlowControl, want)
		}
		if !slices.ContainsFunc(l.Notes, func(n string) bool {
			return strings.HasPrefix(n, "flowControl.usageLimitPolicyPluginRef soft-reflective-ceiling-policy:")
		}) {
			t.Errorf("no note of the usage-limit policy kvroute does its own way: %q", l.Notes)
		}
	}},
	"router-v0.10.0-default-config.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*1", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*1", "scorer:prefix-cache-scorer/prefix-cache-scorer*1", "scorer:lora-affinity-scorer/lora-affinity-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"router-v0.10.0-epp-estimate-prefix-cache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*1", "scorer:load-aware-scorer/load-aware-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"router-v0.10.0-epp-precise-prefix-cache-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*1", "scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"},
	}},
	"router-v0.10.0-perf-optimized-baseline.yaml": {profiles: map[string][]string{
		"default": {"scorer:queue-scorer/queue-scorer*2", "scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2", "scorer:prefix-cache-scorer/prefix-cache-scorer*3", "scorer:no-hit-lru-scorer/no-hit-lru-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer", "postpick:no-hit-lru-scorer/no-hit-lru-scorer"},
	}},
	"router-v0.10.0-sim-epp-tokenizer-vllm-http-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*10", "picker:max-score-picker/max-score-picker"},
	}},
	"router-v0.9.0-sim-epp-config.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "picker:max-score-picker/max-score-picker", "postpick:prefix-cache-scorer/prefix-cache-scorer"},
	}},
	"router-v0.9.0-sim-epp-no-hit-lru.yaml": {profiles: map[string][]string{
		"default": {"filter:decode-filter/decode-filter", "scorer:prefix-cache-scorer/prefix-cache-scorer*2", "scorer:no-hit-lru-scorer/no-hit-lru-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:no-hit-lru-scorer/no-hit-lru-scorer"},
	}},
}

func TestUpstreamCorpusLoadsAsWritten(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("testdata/upstream/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	loadable, sources := 0, map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		tc, ok := upstreamCorpus[name]
		if pd, isPD := pdCorpus[name]; isPD && !ok {
			tc, ok = pd, true
		}
		if !ok {
			t.Errorf("%s has no expectation", name)
			continue
		}
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := strings.Cut(string(text), "\n")
		src, ok := strings.CutPrefix(first, "# Source: github.com/")
		if !ok {
			t.Errorf("%s does not name its source on its first line", name)
		}
		repo, _, _ := strings.Cut(src, " ")
		sources[repo] = true
		if strings.HasPrefix(name, "refused-") != (tc.refusal != "") {
			t.Errorf("%s: refused files are named refused-*", name)
		}
		t.Run(name, func(t *testing.T) {
			l, err := registryWithProducer(t).Load(text, &config.Handle{Spec: schedtest.NopSpeculator{}})
			if tc.refusal != "" {
				if err == nil || err.Error() != "load config: "+tc.refusal {
					t.Fatalf("err = %v\nwant  load config: %s", err, tc.refusal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]string{}
			for _, p := range l.Profiles {
				got[p.Name] = shape(p)
			}
			for p, want := range tc.profiles {
				if !slices.Equal(got[p], want) {
					t.Errorf("profile %s = %q\nwant %q", p, got[p], want)
				}
			}
			if len(got) != len(tc.profiles) {
				t.Errorf("profiles = %v, want %d", got, len(tc.profiles))
			}
			// The data every plugin reads has a producer.
			if _, err := prepare.BuildGraph(l.Plugins); err != nil {
				t.Errorf("BuildGraph: %v", err)
			}
			if tc.check != nil {
				tc.check(t, l)
			}
		})
		if tc.refusal == "" {
			loadable++
		}
	}
	for name := range pdCorpus {
		if _, err := os.Stat(filepath.Join("testdata/upstream", name)); err != nil {
			t.Errorf("expectation for a missing file: %v", err)
		}
	}
	for name := range upstreamCorpus {
		if _, err := os.Stat(filepath.Join("testdata/upstream", name)); err != nil {
			t.Errorf("expectation for a missing file: %v", err)
		}
	}
	if loadable < 20 {
		t.Errorf("%d loadable files, want at least 20", loadable)
	}
	if len(sources) < 10 {
		t.Errorf("sources %v: want several releases of each upstream project", sources)
	}
}

// wantHandler checks the profile handler the file names.
func wantHandler(typ string) func(t *testing.T, l *config.Loaded) {
	return func(t *testing.T, l *config.Loaded) {
		t.Helper()
		if got := l.Handler.TypedName().Type; got != typ {
			t.Errorf("profile handler %s, want %s", got, typ)
		}
	}
}

// wantLeastHeadroom checks that the scorer called name in profile scores
// as upstream's slo-scorer by default: of two candidates predicted to
// meet the request's SLO, the one with less headroom higher, though the
// other is faster.
func wantLeastHeadroom(t *testing.T, l *config.Loaded, profile, name string) {
	t.Helper()
	for _, p := range l.Profiles {
		if p.Name != profile {
			continue
		}
		for _, ws := range p.Scorers {
			if ws.TypedName().Name != name {
				continue
			}
			tight, fast := schedtest.C{Name: "tight"}.Build(), schedtest.C{Name: "fast"}.Build()
			tight.Put(datalayer.LatencyPredictionInfoKey, &datalayer.LatencyPredictionInfo{TTFTValid: true, HasTTFTSLO: true, TTFT: 90, TTFTMean: 80, TTFTHeadroom: 10})
			fast.Put(datalayer.LatencyPredictionInfoKey, &datalayer.LatencyPredictionInfo{TTFTValid: true, HasTTFTSLO: true, TTFT: 20, TTFTMean: 15, TTFTHeadroom: 80})
			out := make([]float64, 2)
			req := &request.Request{SLO: request.SLO{TTFT: 100 * time.Millisecond}}
			ws.Score(context.Background(), framework.NewCycleState(schedtest.Now, 1, 2), req, []*datalayer.Candidate{tight, fast}, out)
			if !(out[0] > out[1]) {
				t.Errorf("%s scored the candidate with 10ms of headroom %v and the one with 80ms %v: want the first higher", name, out[0], out[1])
			}
			return
		}
	}
	t.Errorf("no scorer %s in profile %s", name, profile)
}

// wantThresholds checks the detector admission uses.
func wantThresholds(want saturationdetector.Thresholds, staleAfter time.Duration) func(t *testing.T, l *config.Loaded) {
	return func(t *testing.T, l *config.Loaded) {
		t.Helper()
		if got := l.Detector.Thresholds(); got != want {
			t.Errorf("thresholds = %+v, want %+v", got, want)
		}
		if staleAfter == 0 {
			return
		}
		now := time.Unix(1000, 0)
		cand := func(age time.Duration) []*datalayer.Candidate {
			return []*datalayer.Candidate{datalayer.NewCandidate(&datalayer.Endpoint{Name: "a"}, datalayer.Metrics{UpdateTime: now.Add(-age)}, datalayer.StreamExact)}
		}
		if l.Detector.AllSaturated(cand(staleAfter-time.Millisecond), now) || !l.Detector.AllSaturated(cand(staleAfter+time.Millisecond), now) {
			t.Errorf("metrics go stale at another age than %v", staleAfter)
		}
	}
}

// TestEveryUpstreamTypeIsClassified compares the loader's table with the
// types upstream registers (testdata/upstream-types.txt): none missing,
// none invented.
func TestEveryUpstreamTypeIsClassified(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("testdata/upstream-types.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, line := range strings.Split(string(text), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			want = append(want, line)
		}
	}
	var got []string
	for _, u := range config.UpstreamTypes() {
		got = append(got, u.Name)
		if u.Seen == "" || u.Why == "" && u.Class != config.Honoured {
			t.Errorf("%s: no releases or no reason", u.Name)
		}
		for _, p := range u.Params {
			if p.Why == "" {
				t.Errorf("%s: parameter %s has no reason", u.Name, p.Name)
			}
		}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		for _, n := range want {
			if !slices.Contains(got, n) {
				t.Errorf("upstream type %s is not classified", n)
			}
		}
		for _, n := range got {
			if !slices.Contains(want, n) {
				t.Errorf("%s is classified but upstream registers no such type", n)
			}
		}
	}
}
