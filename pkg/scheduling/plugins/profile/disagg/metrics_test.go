package disagg_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/disagg"
)

func TestDecisionsFromManyGoroutinesAreEachCountedOnceUnderTheirLabels(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := load(t, prefixDeciderConfig, reg)
	// Each goroutine's requests alternate between a cold decode pod (split)
	// and a warm one (decode-only), over models of their own and none.
	const goroutines, rounds = 8, 50
	models := []string{"", "m0", "m1", "m2"}
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range rounds {
				req := prompt(100)
				req.Model = models[(g+i)%len(models)]
				held := 0
				if i%2 == 1 {
					held = 6
				}
				if _, err := s.Schedule(context.Background(), req, fleet(held, prefillPod)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for _, model := range []string{"unknown", "m0", "m1", "m2"} {
		for _, c := range []struct{ decision, reason string }{{"prefill-decode", "uncached"}, {"decode-only", "cached"}} {
			want := float64(goroutines * rounds / len(models) / 2)
			if got := counter(t, reg, disagg.DecisionMetric, map[string]string{"model_name": model, "decision_type": c.decision, "reason": c.reason}); got != want {
				t.Errorf("model %s, %s/%s: counted %v, want %v", model, c.decision, c.reason, got, want)
			}
		}
	}
	if got, want := counter(t, reg, disagg.DecisionMetric, nil), float64(goroutines*rounds); got != want {
		t.Errorf("%v decisions counted in all, want %v", got, want)
	}
}

func TestTwoHandlersCountUnderTheirOwnNames(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	text := func(name string) string {
		return pdPlugins + fmt.Sprintf(`
- type: disagg-profile-handler
  name: %s
  parameters: {deciders: {prefill: prefix-based-pd-decider}}
- type: prefix-based-pd-decider
  parameters: {nonCachedTokens: 16}
`, name) + pdProfiles
	}
	// Two configurations in one process share the counters, not the
	// series a handler binds.
	a, b := load(t, text("a"), reg), load(t, text("b"), reg)
	for i, s := range []*scheduling.Scheduler{a, b, b} {
		if _, err := s.Schedule(context.Background(), prompt(100), fleet(0, prefillPod)); err != nil {
			t.Fatalf("scheduler %d: %v", i, err)
		}
	}
	for name, want := range map[string]float64{"a": 1, "b": 2} {
		if got := counter(t, reg, disagg.DecisionMetric, map[string]string{"plugin_name": name, "model_name": "m", "decision_type": "prefill-decode"}); got != want {
			t.Errorf("handler %s counted %v decisions, want %v", name, got, want)
		}
	}
}
