package disagg_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/disagg"
)

// load makes a scheduler of a configuration's text, its metrics in reg.
func load(t *testing.T, text string, reg *prometheus.Registry) *scheduling.Scheduler {
	t.Helper()
	h := &config.Handle{Spec: schedtest.NopSpeculator{}}
	if reg != nil {
		h.Reg = reg
	}
	l, err := config.NewInTreeRegistry().Load([]byte(text), h)
	if err != nil {
		t.Fatal(err)
	}
	s, err := scheduling.New(l.SchedulerOptions())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const pdProfiles = `
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]
- name: decode
  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]
`

const pdPlugins = `
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
`

// prefixDeciderConfig is a handler splitting by upstream's threshold
// decider at 16 uncached tokens.
const prefixDeciderConfig = pdPlugins + `
- type: disagg-profile-handler
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 16}
` + pdProfiles

func role(r string) map[string]string { return map[string]string{bylabel.RoleLabel: r} }

// fleet is a decode pod d holding held of a 100-token prompt's 6 blocks,
// and the pods more describes.
func fleet(held int, more ...schedtest.C) []*datalayer.Candidate {
	cs := append([]schedtest.C{{Name: "d", Labels: role(bylabel.RoleDecode), Prefix: schedtest.Info(6, held, 0, 0, 0)}}, more...)
	return schedtest.Cands(cs...)
}

var prefillPod = schedtest.C{Name: "p", Labels: role(bylabel.RolePrefill), Prefix: schedtest.Info(6, 0, 0, 0, 0)}

func prompt(n int) *request.Request {
	return &request.Request{ID: "r", Model: "m", TokenIDs: make([]uint32, n)}
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, want := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == k && lp.GetValue() == want)
				}
				if !found {
					continue next
				}
			}
			v += m.GetCounter().GetValue()
		}
	}
	return v
}

func TestTheDeciderSplitsOnTheDecodePodsMatchAndTheDecisionIsCounted(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := load(t, prefixDeciderConfig, reg)
	res, err := s.Schedule(context.Background(), prompt(100), fleet(0, prefillPod))
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.PrefillDecode || res.Targets()[0].Name != "d" || res.Prefill().Name != "p" || res.Reason != framework.ReasonUncached {
		t.Errorf("cold: %s (%s), decode %s, prefill %v", res.Decision, res.Reason, res.Targets()[0].Name, res.Prefill())
	}
	res, err = s.Schedule(context.Background(), prompt(100), fleet(6, prefillPod))
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.DecodeOnly || res.Prefill() != nil || res.Reason != framework.ReasonCached {
		t.Errorf("cached: %s (%s), prefill %v", res.Decision, res.Reason, res.Prefill())
	}
	if _, ok := res.Profiles["prefill"]; ok {
		t.Error("a decode-only result carries a prefill profile's result")
	}
	for _, c := range []struct{ decision, reason string }{{"prefill-decode", "uncached"}, {"decode-only", "cached"}} {
		if got := counter(t, reg, disagg.DecisionMetric, map[string]string{"decision_type": c.decision, "reason": c.reason,
			"plugin_type": "disagg-profile-handler", "plugin_name": "disagg-profile-handler", "model_name": "m"}); got != 1 {
			t.Errorf("%s/%s counted %v times, want 1", c.decision, c.reason, got)
		}
	}
}

func TestASplitWithNoPrefillPodFallsBackLoudly(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		fallback string
		refused  bool
	}{{"", false}, {"decode-only", false}, {"refuse", true}} {
		t.Run("fallback "+tt.fallback, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			params := `{deciders: {prefill: always-disagg-pd-decider}}`
			if tt.fallback != "" {
				params = `{deciders: {prefill: always-disagg-pd-decider}, fallback: ` + tt.fallback + `}`
			}
			s := load(t, pdPlugins+"- type: always-disagg-pd-decider\n- type: disagg-profile-handler\n  parameters: "+params+"\n"+pdProfiles, reg)
			// The prefill pod has left: the prefill profile's filter keeps none.
			res, err := s.Schedule(context.Background(), prompt(100), fleet(0))
			want := "decode-only"
			if tt.refused {
				want = "refuse"
				if !errors.Is(err, framework.ErrNoCandidates) || !errors.Is(err, disagg.ErrNoStagePod) || !strings.Contains(err.Error(), "no prefill pod is ready") {
					t.Fatalf("err = %v, want a refusal saying no prefill pod is ready", err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if res.Decision != framework.DecodeOnly || res.Reason != framework.ReasonNoPrefillPod || res.Prefill() != nil {
					t.Errorf("%s (%s), prefill %v; want decode-only for want of a prefill pod", res.Decision, res.Reason, res.Prefill())
				}
				if got := counter(t, reg, disagg.DecisionMetric, map[string]string{"decision_type": "decode-only", "reason": "no-prefill-pod"}); got != 1 {
					t.Errorf("decision counted %v times", got)
				}
			}
			if got := counter(t, reg, disagg.FallbackMetric, map[string]string{"stage": "prefill", "fallback": want}); got != 1 {
				t.Errorf("fallback %s counted %v times, want 1", want, got)
			}
		})
	}
}

func TestAPodServingBothStagesIsNotSentItsOwnPrefill(t *testing.T) {
	t.Parallel()
	s := load(t, pdPlugins+"- type: always-disagg-pd-decider\n- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}}\n"+pdProfiles, nil)
	both := schedtest.Cands(schedtest.C{Name: "b", Labels: role(bylabel.RoleBoth), Prefix: schedtest.Info(6, 0, 0, 0, 0)})
	res, err := s.Schedule(context.Background(), prompt(100), both)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.DecodeOnly || res.Reason != disagg.ReasonSamePod || res.Prefill() != nil {
		t.Errorf("%s (%s), prefill %v", res.Decision, res.Reason, res.Prefill())
	}
}

func TestEncodeAndPrefillStagesTogether(t *testing.T) {
	t.Parallel()
	s := load(t, pdPlugins+`
- type: encode-filter
- type: always-disagg-pd-decider
- type: always-disagg-multimodal-decider
- type: disagg-profile-handler
  parameters: {deciders: {prefill: always-disagg-pd-decider, encode: always-disagg-multimodal-decider}}
`+pdProfiles+`
- name: encode
  plugins: [{pluginRef: encode-filter}, {pluginRef: max-score-picker}]
`, nil)
	cands := fleet(0, prefillPod,
		schedtest.C{Name: "e1", Labels: role(bylabel.RoleEncode)})
	req := &request.Request{ID: "r", Model: "m", API: request.APIChatCompletions, NoReproduciblePrefix: true, Prompt: strings.Repeat("x", 400)}
	res, err := s.Schedule(context.Background(), req, cands)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.EncodePrefillDecode || res.Prefill().Name != "p" || len(res.Encoders()) != 1 || res.Encoders()[0].Name != "e1" {
		t.Errorf("%s: prefill %v, encoders %v", res.Decision, res.Prefill(), res.Encoders())
	}
	res, err = s.Schedule(context.Background(), prompt(100), fleet(0, prefillPod, schedtest.C{Name: "e1", Labels: role(bylabel.RoleEncode)}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.PrefillDecode || res.Encoders() != nil {
		t.Errorf("a text request: %s, encoders %v", res.Decision, res.Encoders())
	}
}

func TestPrefillFirstPrefillsEveryRequestApart(t *testing.T) {
	t.Parallel()
	s := load(t, pdPlugins+"- type: disagg-profile-handler\n  parameters: {stageOrder: prefill_first}\n"+pdProfiles, nil)
	res, err := s.Schedule(context.Background(), prompt(100), fleet(6, prefillPod))
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.PrefillDecode || res.Reason != framework.ReasonPrefillFirst || res.Prefill().Name != "p" || res.Targets()[0].Name != "d" {
		t.Errorf("%s (%s): decode %s, prefill %v", res.Decision, res.Reason, res.Targets()[0].Name, res.Prefill())
	}
}

func TestEachLaterStageIsPlacedNearTheEarlierPick(t *testing.T) {
	t.Parallel()
	at := func(host, rack string) datalayer.Topology { return datalayer.Topology{Host: host, Rack: rack} }
	const plugins = `
plugins:
- type: prefill-filter
- type: decode-filter
- type: queue-scorer
- type: max-score-picker
- type: always-disagg-pd-decider
- type: topology-affinity-filter
  parameters: {minAffinity: rack}
`
	// The first stage's queues pick its pod in rack r2; the second
	// stage's queues prefer r1, which the filter overrules.
	pool := schedtest.Cands(
		schedtest.C{Name: "d-r1", Labels: role(bylabel.RoleDecode), Topology: at("h1", "r1"), Queue: 3},
		schedtest.C{Name: "d-r2", Labels: role(bylabel.RoleDecode), Topology: at("h2", "r2"), Queue: 3},
		schedtest.C{Name: "p-r1", Labels: role(bylabel.RolePrefill), Topology: at("h3", "r1"), Queue: 3},
		schedtest.C{Name: "p-r2", Labels: role(bylabel.RolePrefill), Topology: at("h4", "r2"), Queue: 3},
	)
	for _, tc := range []struct {
		name, handler, profiles string
		first                   string // the first stage's pod, made the least loaded
		wantDecode, wantPrefill string
	}{
		{"decode first: prefill in the decode pick's rack",
			"- type: disagg-profile-handler\n  parameters: {deciders: {prefill: always-disagg-pd-decider}}\n",
			"- name: prefill\n  plugins: [{pluginRef: prefill-filter}, {pluginRef: topology-affinity-filter}, {pluginRef: queue-scorer}]\n- name: decode\n  plugins: [{pluginRef: decode-filter}, {pluginRef: queue-scorer}]\n",
			"d-r2", "d-r2", "p-r2"},
		{"prefill first: decode in the prefill pick's rack",
			"- type: disagg-profile-handler\n  parameters: {stageOrder: prefill-first}\n",
			"- name: prefill\n  plugins: [{pluginRef: prefill-filter}, {pluginRef: queue-scorer}]\n- name: decode\n  plugins: [{pluginRef: decode-filter}, {pluginRef: topology-affinity-filter}, {pluginRef: queue-scorer}]\n",
			"p-r2", "d-r2", "p-r2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := config.NewInTreeRegistry().Load([]byte(plugins+tc.handler+"schedulingProfiles:\n"+tc.profiles), &config.Handle{Spec: schedtest.NopSpeculator{}})
			if err != nil {
				t.Fatal(err)
			}
			opts := l.SchedulerOptions()
			// The queues decide: the cycle reads them as fresh.
			opts.Now = func() time.Time { return schedtest.Now }
			s, err := scheduling.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range pool {
				c.Metrics = &datalayer.Metrics{WaitingQueueSize: 3, UpdateTime: c.Metrics.UpdateTime}
				switch {
				case c.Name == tc.first:
					c.Metrics.WaitingQueueSize = 0
				case strings.HasSuffix(c.Name, "r1"):
					c.Metrics.WaitingQueueSize = 1
				}
			}
			res, err := s.Schedule(context.Background(), prompt(100), pool)
			if err != nil {
				t.Fatal(err)
			}
			if p := res.Prefill(); res.Targets()[0].Name != tc.wantDecode || p == nil || p.Name != tc.wantPrefill {
				t.Fatalf("%s (%s): decode %s, prefill %v; want %s, %s", res.Decision, res.Reason, res.Targets()[0].Name, p, tc.wantDecode, tc.wantPrefill)
			}
		})
	}
}

func TestHandlerParametersAsUpstreamReadsThem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		plugin string
		err    string
	}{
		{"the deprecated flat form names the decider", "{type: disagg-profile-handler, parameters: {prefillDeciderPluginName: always-disagg-pd-decider, decodeProfile: decode}}", ""},
		{"pd-profile-handler's deciderPluginName alias", "{type: disagg-profile-handler, parameters: {deciderPluginName: always-disagg-pd-decider}}", ""},
		{"nested and flat together are refused", "{type: disagg-profile-handler, parameters: {deciders: {prefill: always-disagg-pd-decider}, decodeProfile: decode}}", "not both"},
		{"a prefill decider with prefill-first is refused", "{type: disagg-profile-handler, parameters: {stageOrder: prefill-first, deciders: {prefill: always-disagg-pd-decider}}}", "cannot be used with stageOrder prefill-first"},
		{"an unknown stage order is refused", "{type: disagg-profile-handler, parameters: {stageOrder: sideways}}", `stageOrder "sideways"`},
		{"an unknown fallback is refused", "{type: disagg-profile-handler, parameters: {fallback: retry}}", `fallback "retry"`},
		{"a decider the file does not define is refused", "{type: disagg-profile-handler, parameters: {deciders: {prefill: nowhere}}}", `names plugin "nowhere", which the configuration does not define`},
		{"a plugin that is not a decider is refused", "{type: disagg-profile-handler, parameters: {deciders: {prefill: queue-scorer}}}", "which is not a decider"},
		{"two stages on one profile are refused", "{type: disagg-profile-handler, parameters: {profiles: {decode: decode, prefill: decode}}}", "must be three different profiles"},
		{"pd-profile-handler's negative threshold is refused", "{type: pd-profile-handler, parameters: {threshold: -1}}", "threshold = -1"},
		{"pd-profile-handler's data-parallel port is not needed: each rank is its own endpoint", "{type: pd-profile-handler, parameters: {primaryPort: 8200}}", ""},
		{"pd-profile-handler's block size is not needed", "{type: pd-profile-handler, parameters: {threshold: 10, hashBlockSize: 5, prefixPluginName: p}}", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text := pdPlugins + "- type: always-disagg-pd-decider\n- " + tt.plugin + "\n" + pdProfiles
			_, err := config.NewInTreeRegistry().Load([]byte(text), nil)
			if tt.err == "" && err != nil {
				t.Fatal(err)
			}
			if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err = %v, want one saying %q", err, tt.err)
			}
		})
	}
}

func TestPDProfileHandlersThresholdAndDecider(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		params  string
		extra   string
		held    int
		decided framework.Decision
	}{
		{"threshold 0 splits a cached prompt", "{threshold: 0}", "", 6, framework.PrefillDecode},
		{"threshold 10 keeps 4 uncached tokens local", "{threshold: 10}", "", 6, framework.DecodeOnly},
		{"threshold 10 splits 100 uncached tokens", "{threshold: 10}", "", 0, framework.PrefillDecode},
		{"no parameters and no prefix-based-pd-decider split always", "{}", "", 6, framework.PrefillDecode},
		{"no parameters take the plugin named prefix-based-pd-decider", "{}", "- {type: prefix-based-pd-decider, parameters: {nonCachedTokens: 10}}\n", 6, framework.DecodeOnly},
		{"deciderPluginName names the decider", "{deciderPluginName: always-disagg-pd-decider}", "- type: always-disagg-pd-decider\n", 6, framework.PrefillDecode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			s := load(t, pdPlugins+tt.extra+"- {type: pd-profile-handler, parameters: "+tt.params+"}\n"+pdProfiles, reg)
			res, err := s.Schedule(context.Background(), prompt(100), fleet(tt.held, prefillPod))
			if err != nil {
				t.Fatal(err)
			}
			if res.Decision != tt.decided {
				t.Errorf("%s (%s), want %s", res.Decision, res.Reason, tt.decided)
			}
			// Counted under the name upstream's pd-profile-handler uses.
			if got := counter(t, reg, disagg.PDDecisionMetric, map[string]string{"decision_type": string(tt.decided), "plugin_type": "pd-profile-handler"}); got != 1 {
				t.Errorf("%s counted %v times", disagg.PDDecisionMetric, got)
			}
		})
	}
}

func TestModelLabelsAreBounded(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := load(t, pdPlugins+"- type: disagg-profile-handler\n"+pdProfiles, reg)
	for i := range 100 {
		req := prompt(10)
		req.Model = "model-" + strings.Repeat("x", i)
		if _, err := s.Schedule(context.Background(), req, fleet(0, prefillPod)); err != nil {
			t.Fatal(err)
		}
	}
	if got := counter(t, reg, disagg.DecisionMetric, map[string]string{"model_name": "other"}); got != 36 {
		t.Errorf("%v decisions counted under other, want the 36 past the first 64 models", got)
	}
}

func TestTheDefaultConfigurationSplitsOnlyInAPoolWithPrefillPods(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := load(t, config.DefaultConfigText, reg)
	plain := schedtest.Cands(
		schedtest.C{Name: "a", Prefix: schedtest.Info(250, 0, 0, 0, 0)},
		schedtest.C{Name: "b", Prefix: schedtest.Info(250, 0, 0, 0, 0)},
	)
	res, err := s.Schedule(context.Background(), prompt(4000), plain)
	if err != nil {
		t.Fatal(err)
	}
	if res.PrimaryProfile != "default" || len(res.Profiles) != 1 || res.Decision != "" || res.Prefill() != nil {
		t.Errorf("a pool without prefill pods: %+v, want the default profile's pick alone", res)
	}
	if got := counter(t, reg, disagg.DecisionMetric, nil); got != 0 {
		t.Errorf("%v decisions counted in a pool that cannot split", got)
	}
	// Without predictions the decider's threshold (2048 uncached tokens)
	// decides.
	pd := schedtest.Cands(
		schedtest.C{Name: "d", Labels: role(bylabel.RoleDecode), Prefix: schedtest.Info(250, 0, 0, 0, 0)},
		schedtest.C{Name: "p", Labels: role(bylabel.RolePrefill), Prefix: schedtest.Info(250, 0, 0, 0, 0)},
	)
	res, err = s.Schedule(context.Background(), prompt(4000), pd)
	if err != nil {
		t.Fatal(err)
	}
	if res.Decision != framework.PrefillDecode || res.Targets()[0].Name != "d" || res.Prefill().Name != "p" {
		t.Errorf("a cold prompt in a P/D pool: %s (%s), decode %s, prefill %v", res.Decision, res.Reason, res.Targets()[0].Name, res.Prefill())
	}
	if got := counter(t, reg, disagg.DecisionMetric, map[string]string{"decision_type": "prefill-decode", "plugin_type": "disagg-profile-handler"}); got != 1 {
		t.Errorf("prefill-decode counted %v times", got)
	}
}
