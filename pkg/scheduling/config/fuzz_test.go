package config_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
)

// FuzzLoad feeds arbitrary configuration text to the loader: it must
// return an error or a complete, runnable configuration, and never panic.
func FuzzLoad(f *testing.F) {
	for _, seed := range []string{
		"",
		config.DefaultConfigText,
		"plugins: [{type: queue-scorer}, {type: softmax-picker, parameters: {temperature: 0.2, maxNumOfEndpoints: 2}}]",
		"plugins: [{type: approx-prefix-cache-producer, parameters: {blockSizeTokens: 16}}, {type: prefix-cache-scorer}]",
		"plugins: [{name: d, type: utilization-detector, parameters: {metricsStalenessThreshold: 1s}}]\nsaturationDetector: {pluginRef: d}",
		"schedulingProfiles: [{name: p, plugins: [{pluginRef: x, weight: 1e308}]}]",
		"plugins: [{type: prefill-cost-scorer, parameters: {tierWeights: {gpu: 1, cpu: .5}}}]",
		"plugins: [{type: latency-scorer, parameters: {evictionWeight: 2, evictionWindow: 3s}}]",
		"featureGates: [dataLayer, dataLayer]",
		"plugins: {type: queue-scorer}",
		"{\"plugins\": [{\"type\": \"queue-scorer\", \"parameters\": null}]}",
		"plugins: [{type: max-score-picker, parameters: [1, 2]}]",
		"- - - :",
		"plugins: [{type: saturation-filter, parameters: {kvThreshold: .nan}}]",
		// An upstream prefix scorer beside the precise producer, its
		// parameters rewritten by the loader.
		"plugins: [{type: precise-prefix-cache-producer}, {type: prefix-cache-scorer, parameters: {matchLengthWeight: 0.5}}]",
		"plugins: [{type: precise-prefix-cache-producer}, {type: prefix-cache-scorer, parameters: [1]}]",
		"plugins: [{type: prefix-cache-scorer, parameters: {mode: cache_tracking, routingHistory: true}}]",
	} {
		f.Add([]byte(seed))
	}
	// Every upstream configuration of the corpus, and a decision tree that
	// refers to itself.
	files, _ := filepath.Glob("testdata/upstream/*.yaml")
	for _, file := range files {
		if text, err := os.ReadFile(file); err == nil {
			f.Add(text)
		}
	}
	f.Add([]byte("plugins: [{name: t, type: decision-tree-filter, parameters: {current: {pluginRef: t}}}]"))
	// Disaggregated serving: deciders named before and after, profiles
	// missing, a handler whose stages are one profile.
	for _, seed := range []string{
		"plugins: [{type: disagg-profile-handler, parameters: {deciders: {prefill: d}}}, {name: d, type: predicted-latency-pd-decider, parameters: {minGain: 0.99, maxLocalPrefillLength: 1}}]\nschedulingProfiles: [{name: decode}, {name: prefill}]",
		"plugins: [{type: always-disagg-pd-decider}, {type: disagg-profile-handler, parameters: {profiles: {decode: x, prefill: x}, deciders: {prefill: always-disagg-pd-decider}, fallback: refuse}}]\nschedulingProfiles: [{name: x}]",
		"plugins: [{type: pd-profile-handler, parameters: {threshold: 3, decodeProfile: p}}]\nschedulingProfiles: [{name: p}, {name: prefill}]",
		"plugins: [{type: disagg-profile-handler, parameters: {stageOrder: PREFILL_FIRST, onlyWithPrefillPods: true}}]\nschedulingProfiles: [{name: prefill}, {name: encode}]",
	} {
		f.Add([]byte(seed))
	}
	f.Add([]byte("featureGates: [flowControl]\nplugins: [{name: rr, type: round-robin-fairness-policy}]\nflowControl: {maxBytes: 1Gi, maxRequests: 1e3, defaultRequestTTL: 1s, priorityBands: [{priority: 1, fairnessPolicyRef: rr, maxRequests: 9, ttftTarget: 250ms}], defaultPriorityBand: {ttftTarget: 2s}}"))
	r := registryWithProducerF(f)
	pool := func() []*datalayer.Candidate {
		role := func(r string) map[string]string { return map[string]string{datalayer.RoleLabel: r} }
		return schedtest.Cands(
			schedtest.C{Name: "d", Labels: role("decode"), Prefix: schedtest.Info(4, 1, 1, 0, 0)},
			schedtest.C{Name: "p", Labels: role("prefill"), Prefix: schedtest.Info(4, 0, 0, 0, 0)},
			schedtest.C{Name: "e", Labels: role("encode")},
			schedtest.C{Name: "b", Labels: role("both")},
		)
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		l, err := r.Load(text, &config.Handle{Spec: schedtest.NopSpeculator{}})
		if err != nil {
			return
		}
		if l.Handler == nil || l.Detector == nil || len(l.Profiles) == 0 {
			t.Fatalf("loaded without handler, detector or profiles: %+v", l)
		}
		for _, p := range l.Profiles {
			if p.Picker == nil {
				t.Fatalf("profile %q loaded without a picker", p.Name)
			}
			for _, s := range p.Scorers {
				if !(s.Weight >= 0) {
					t.Fatalf("profile %q: scorer weight %v", p.Name, s.Weight)
				}
			}
		}
		// What loads must also schedule without panicking, over a pool
		// with every role.
		s, err := scheduling.New(l.SchedulerOptions())
		if err != nil {
			return
		}
		req := &request.Request{ID: "f", Model: "m", TokenIDs: make([]uint32, 64)}
		if res, err := s.Schedule(context.Background(), req, pool()); err == nil && len(res.Targets()) == 0 {
			t.Fatalf("a result without a target: %+v", res)
		}
	})
}

func registryWithProducerF(f *testing.F) *config.Registry { return registryWithProducer(f) }
