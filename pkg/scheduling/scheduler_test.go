package scheduling_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// newScheduler loads text (the default config when empty) and builds a
// scheduler at schedtest.Now with the given seed.
func newScheduler(t testing.TB, text string, seed uint64, reg prometheus.Registerer) *scheduling.Scheduler {
	t.Helper()
	l, err := config.NewInTreeRegistry().Load([]byte(text), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		t.Fatalf("load config: %v", err)
	}
	opts := l.SchedulerOptions()
	opts.Rand = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	opts.Now = func() time.Time { return schedtest.Now }
	opts.Registerer = reg
	s, err := scheduling.New(opts)
	if err != nil {
		t.Fatalf("new scheduler: %v", err)
	}
	return s
}

func req(id string) *request.Request {
	return &request.Request{ID: id, Model: "m", TokenIDs: make([]uint32, 2048)}
}

func primary(t *testing.T, s *scheduling.Scheduler, r *request.Request, cands []*datalayer.Candidate) string {
	t.Helper()
	res, err := s.Schedule(context.Background(), r, cands)
	if err != nil {
		t.Fatalf("Schedule: %v", err)
	}
	return res.Targets()[0].Name
}

// evenPool is eight pods under the same moderate load, none holding the prefix.
func evenPool() []schedtest.C {
	cs := make([]schedtest.C, 8)
	for i := range cs {
		cs[i] = schedtest.C{Name: fmt.Sprintf("pod-%d", i), Queue: 1, Running: 6, KV: 0.4, Prefix: schedtest.Info(128, 0, 0, 0, 0)}
	}
	return cs
}

func TestDefaultProfileFollowsTheCache(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func([]schedtest.C)
		want   string
	}{
		{"the pod holding the prefix on GPU is picked", func(cs []schedtest.C) {
			cs[5].Prefix = schedtest.Info(128, 128, 0, 0, 0)
		}, "pod-5"},
		{"a GPU hit beats an equally long CPU hit", func(cs []schedtest.C) {
			cs[2].Prefix = schedtest.Info(128, 0, 128, 0, 0)
			cs[6].Prefix = schedtest.Info(128, 128, 0, 0, 0)
		}, "pod-6"},
		{"a longer CPU hit beats a short GPU hit", func(cs []schedtest.C) {
			cs[2].Prefix = schedtest.Info(128, 0, 120, 0, 0)
			cs[6].Prefix = schedtest.Info(128, 40, 0, 0, 0)
		}, "pod-2"},
		{"a cache hit outweighs a slightly busier queue", func(cs []schedtest.C) {
			cs[3].Prefix = schedtest.Info(128, 128, 0, 0, 0)
			cs[3].Queue = 3
		}, "pod-3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			for seed := range uint64(20) {
				cs := evenPool()
				tt.modify(cs)
				s := newScheduler(t, config.UpstreamWeightsConfigText, seed, nil)
				if got := primary(t, s, req("r"), schedtest.Cands(cs...)); got != tt.want {
					t.Fatalf("seed %d: picked %s, want %s", seed, got, tt.want)
				}
			}
		})
	}
}

const loadAwareConfig = `
plugins:
- type: precise-prefix-cache-scorer
- type: prefill-cost-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 1
  - pluginRef: prefill-cost-scorer
    weight: 2
`

const saturationFilterConfig = `
plugins:
- type: saturation-filter
- type: precise-prefix-cache-scorer
`

func TestLoadAwareSchedulingMovesOffASaturatedPod(t *testing.T) {
	t.Parallel()
	// pod-0 holds the whole prefix but is drowning; pod-1 is cold and idle.
	pool := func() []*datalayer.Candidate {
		return schedtest.Cands(
			schedtest.C{Name: "pod-0", Queue: 12, Running: 30, KV: 0.7, Prefix: schedtest.Info(128, 128, 0, 0, 0)},
			schedtest.C{Name: "pod-1", Queue: 0, Running: 2, KV: 0.1, Prefix: schedtest.Info(128, 0, 0, 0, 0)},
		)
	}
	tests := []struct {
		name, config, want string
	}{
		{"the prefix scorer alone stays with the cache", "plugins: [{type: precise-prefix-cache-scorer}]", "pod-0"},
		{"the prefill-cost scorer moves the request to the idle pod", loadAwareConfig, "pod-1"},
		{"the saturation filter moves the request to the idle pod", saturationFilterConfig, "pod-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := primary(t, newScheduler(t, tt.config, 1, nil), req("r"), pool()); got != tt.want {
				t.Errorf("picked %s, want %s", got, tt.want)
			}
		})
	}

	// The same cost scorer keeps a request on the cache when the cached pod
	// is only mildly busier: the hit saves more than the queue costs.
	mild := schedtest.Cands(
		schedtest.C{Name: "pod-0", Queue: 1, Running: 8, Prefix: schedtest.Info(128, 128, 0, 0, 0)},
		schedtest.C{Name: "pod-1", Queue: 0, Running: 2, Prefix: schedtest.Info(128, 0, 0, 0, 0)},
	)
	if got := primary(t, newScheduler(t, loadAwareConfig, 1, nil), req("r"), mild); got != "pod-0" {
		t.Errorf("mildly busier cached pod: picked %s, want pod-0", got)
	}
}

// randomPool draws a pool of 1 to 40 candidates with random load, freshness
// and prefix holdings.
func randomPool(r *rand.Rand) []*datalayer.Candidate {
	n := 1 + r.IntN(40)
	cs := make([]schedtest.C, n)
	for i := range cs {
		total := r.IntN(200)
		gpu := r.IntN(total + 1)
		cpu := r.IntN(total - gpu + 1)
		cs[i] = schedtest.C{
			Name: fmt.Sprintf("pod-%d", i), Queue: r.IntN(12), Running: r.IntN(64), KV: r.Float64() * 1.1,
			Stale: r.IntN(5) == 0, NeverScraped: r.IntN(20) == 0,
			Prefix:   schedtest.Info(total, gpu, cpu, r.IntN(total-gpu-cpu+1), 0),
			Active:   []string{"ad-1"}[:r.IntN(2)],
			MaxLoRAs: r.IntN(3),
		}
		if r.IntN(6) == 0 {
			cs[i].Prefix = nil
		}
	}
	return schedtest.Cands(cs...)
}

var propertyConfigs = []string{
	"",
	loadAwareConfig,
	saturationFilterConfig,
	`
plugins:
- type: lora-affinity-filter
- type: saturation-filter
- {type: queue-scorer}
- {type: kv-cache-utilization-scorer}
- {type: running-requests-scorer}
- {type: prefix-cache-scorer}
- {type: weighted-random-picker, parameters: {maxNumOfEndpoints: 3}}
`,
	`
plugins:
- {type: precise-prefix-cache-scorer}
- {type: softmax-picker, parameters: {temperature: 0.3, maxNumOfEndpoints: 2}}
`,
	`
plugins:
- {type: queue-scorer}
- {type: random-picker, parameters: {maxNumOfEndpoints: 4}}
`,
	`
plugins:
- {type: precise-prefix-cache-scorer}
- {type: max-score-picker, parameters: {maxNumOfEndpoints: 5}}
`,
}

func TestPicksAreAlwaysDistinctCandidates(t *testing.T) {
	t.Parallel()
	for ci, text := range propertyConfigs {
		t.Run(fmt.Sprintf("config %d", ci), func(t *testing.T) {
			t.Parallel()
			s := newScheduler(t, text, uint64(ci), nil)
			r := rand.New(rand.NewPCG(uint64(ci), 42))
			for iter := range 500 {
				cands := randomPool(r)
				rq := req(fmt.Sprint(iter))
				rq.Priority = r.IntN(3) - 1
				if r.IntN(2) == 0 {
					rq.LoRA = "ad-1"
				}
				res, err := s.Schedule(context.Background(), rq, cands)
				if errors.Is(err, scheduling.ErrShed) {
					continue
				}
				if err != nil {
					t.Fatalf("iteration %d: %v", iter, err)
				}
				picked := res.Targets()
				if len(picked) == 0 {
					t.Fatalf("iteration %d: nothing picked from %d candidates", iter, len(cands))
				}
				for i, p := range picked {
					if !slices.Contains(cands, p) {
						t.Fatalf("iteration %d: picked %s, which is not a candidate", iter, p.Name)
					}
					if slices.Contains(picked[:i], p) {
						t.Fatalf("iteration %d: picked %s twice", iter, p.Name)
					}
				}
			}
		})
	}
}

func TestAFixedSeedIsDeterministic(t *testing.T) {
	t.Parallel()
	run := func(seed uint64) []string {
		s := newScheduler(t, propertyConfigs[3], seed, nil)
		r := rand.New(rand.NewPCG(7, 7))
		var out []string
		for i := range 300 {
			res, err := s.Schedule(context.Background(), req(fmt.Sprint(i)), randomPool(r))
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, strings.Join(schedtest.Names(res.Targets()), ","))
		}
		return out
	}
	a, b, c := run(1), run(1), run(2)
	if !slices.Equal(a, b) {
		t.Error("the same seed gave different picks")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds gave identical picks over 300 weighted-random cycles")
	}
}

func TestAdmission(t *testing.T) {
	t.Parallel()
	saturated := []schedtest.C{{Name: "a", Queue: 9}, {Name: "b", KV: 0.9}}
	tests := []struct {
		name     string
		priority int
		cands    []schedtest.C
		wantErr  error
	}{
		{"a sheddable request is shed when every endpoint is saturated", -1, saturated, scheduling.ErrShed},
		{"a critical request is scheduled even then", 0, saturated, nil},
		{"a sheddable request is scheduled when one endpoint has room", -1,
			append(slices.Clone(saturated), schedtest.C{Name: "c", Queue: 1}), nil},
		{"stale metrics count as saturated for admission", -1,
			[]schedtest.C{{Name: "a", Queue: 9}, {Name: "b", Stale: true}}, scheduling.ErrShed},
		{"no candidates is ErrNoCandidates, whatever the priority", -1, nil, scheduling.ErrNoCandidates},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := req("r")
			r.Priority = tt.priority
			reg := prometheus.NewPedanticRegistry()
			res, err := newScheduler(t, config.UpstreamWeightsConfigText, 1, reg).Schedule(context.Background(), r, schedtest.Cands(tt.cands...))
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && len(res.Targets()) != 1 {
				t.Fatalf("targets = %v", schedtest.Names(res.Targets()))
			}
			status := "success"
			switch tt.wantErr {
			case scheduling.ErrShed:
				status = "shed"
			case scheduling.ErrNoCandidates:
				status = "no_candidates"
			}
			want := fmt.Sprintf(`
# HELP inference_extension_scheduler_attempts_total Scheduling cycles by outcome: success, no_candidates, shed, error.
# TYPE inference_extension_scheduler_attempts_total counter
inference_extension_scheduler_attempts_total{status="error"} 0
inference_extension_scheduler_attempts_total{status="no_candidates"} %d
inference_extension_scheduler_attempts_total{status="shed"} %d
inference_extension_scheduler_attempts_total{status="success"} %d
`, b2i(status == "no_candidates"), b2i(status == "shed"), b2i(status == "success"))
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "inference_extension_scheduler_attempts_total"); err != nil {
				t.Error(err)
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Test plugins that break their contracts, to show the scheduler holds the
// line whatever a plugin does.

type named struct{ n string }

func (p named) TypedName() plugin.TypedName { return plugin.TypedName{Type: "test-" + p.n, Name: p.n} }

type dropAll struct{ named }

func (dropAll) Filter(context.Context, *framework.CycleState, *request.Request, []*datalayer.Candidate) []*datalayer.Candidate {
	return nil
}

type wild struct{ named }

func (wild) Category() framework.ScorerCategory { return framework.Balance }
func (wild) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	vals := []float64{5, math.NaN(), -1, math.Inf(1), 0.25}
	for i := range cands {
		out[i] = vals[i%len(vals)]
	}
}

type capture struct {
	named
	got []float64
}

func (c *capture) Pick(_ context.Context, _ *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	for _, s := range scored {
		c.got = append(c.got, s.Score)
	}
	return &framework.ProfileResult{Picked: []*datalayer.Candidate{scored[0].Candidate}}
}

type outsider struct{ named }

func (outsider) Pick(context.Context, *framework.CycleState, []framework.ScoredCandidate) *framework.ProfileResult {
	return &framework.ProfileResult{Picked: schedtest.Cands(schedtest.C{Name: "stranger"})}
}

type twice struct{ named }

func (twice) Pick(_ context.Context, _ *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	return &framework.ProfileResult{Picked: []*datalayer.Candidate{scored[0].Candidate, scored[0].Candidate}}
}

// greedy keeps asking for every profile; the scheduler must still stop.
type greedy struct{ named }

func (greedy) Pick(_ context.Context, _ *framework.CycleState, _ *request.Request, ps []*framework.Profile, _ map[string]*framework.ProfileResult) []*framework.Profile {
	return ps
}

func (greedy) ProcessResults(_ context.Context, _ *framework.CycleState, _ *request.Request, rs map[string]*framework.ProfileResult) (*framework.Result, error) {
	return &framework.Result{PrimaryProfile: "b", Profiles: rs}, nil
}

func TestSchedulerEnforcesPluginContracts(t *testing.T) {
	t.Parallel()
	cands := func() []*datalayer.Candidate {
		return schedtest.Cands(schedtest.C{Name: "a"}, schedtest.C{Name: "b"}, schedtest.C{Name: "c"}, schedtest.C{Name: "d"}, schedtest.C{Name: "e"})
	}
	schedule := func(opts scheduling.Options) (*framework.Result, error) {
		opts.Now = func() time.Time { return schedtest.Now }
		s, err := scheduling.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		return s.Schedule(context.Background(), req("r"), cands())
	}

	t.Run("scores are clamped to [0,1] and NaN counts as 0 before weighting", func(t *testing.T) {
		t.Parallel()
		c := &capture{named: named{"capture"}}
		_, err := schedule(scheduling.Options{Profiles: []*framework.Profile{{
			Name: "p", Scorers: []framework.WeightedScorer{{Scorer: wild{named{"wild"}}, Weight: 2}}, Picker: c,
		}}})
		if err != nil {
			t.Fatal(err)
		}
		if want := []float64{2, 0, 0, 2, 0.5}; !slices.Equal(c.got, want) {
			t.Errorf("weighted scores = %v, want %v", c.got, want)
		}
	})
	t.Run("a filter that leaves nothing is ErrNoCandidates", func(t *testing.T) {
		t.Parallel()
		_, err := schedule(scheduling.Options{Profiles: []*framework.Profile{{
			Name: "p", Filters: []framework.Filter{dropAll{named{"drop"}}}, Picker: &capture{named: named{"c"}},
		}}})
		if !errors.Is(err, scheduling.ErrNoCandidates) {
			t.Errorf("err = %v, want ErrNoCandidates", err)
		}
	})
	t.Run("a pick outside the candidates is refused", func(t *testing.T) {
		t.Parallel()
		_, err := schedule(scheduling.Options{Profiles: []*framework.Profile{{Name: "p", Picker: outsider{named{"out"}}}}})
		if !errors.Is(err, scheduling.ErrBadPick) {
			t.Errorf("err = %v, want ErrBadPick", err)
		}
	})
	t.Run("the same endpoint picked twice is refused", func(t *testing.T) {
		t.Parallel()
		_, err := schedule(scheduling.Options{Profiles: []*framework.Profile{{Name: "p", Picker: twice{named{"twice"}}}}})
		if !errors.Is(err, scheduling.ErrBadPick) {
			t.Errorf("err = %v, want ErrBadPick", err)
		}
	})
	t.Run("a handler asking for profiles forever still ends", func(t *testing.T) {
		t.Parallel()
		res, err := schedule(scheduling.Options{
			Handler: greedy{named{"greedy"}},
			Profiles: []*framework.Profile{
				{Name: "a", Picker: &capture{named: named{"c1"}}},
				{Name: "b", Picker: &capture{named: named{"c2"}}},
			},
		})
		if err != nil || len(res.Profiles) != 2 || res.Targets()[0].Name != "a" {
			t.Errorf("result = %+v, %v", res, err)
		}
	})
	t.Run("a cancelled context ends the cycle", func(t *testing.T) {
		t.Parallel()
		s, err := scheduling.New(scheduling.Options{Profiles: []*framework.Profile{{Name: "p", Picker: &capture{named: named{"c"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := s.Schedule(ctx, req("r"), cands()); !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	})
}

func TestNewRefusesBadOptions(t *testing.T) {
	t.Parallel()
	p := func(name string) *framework.Profile {
		return &framework.Profile{Name: name, Picker: &capture{named: named{"c"}}}
	}
	tests := []struct {
		name string
		opts scheduling.Options
		want string
	}{
		{"no profiles", scheduling.Options{}, "scheduler needs at least one profile"},
		{"two profiles and no handler", scheduling.Options{Profiles: []*framework.Profile{p("a"), p("b")}}, "2 profiles need a profile handler"},
		{"duplicate profile names", scheduling.Options{Handler: greedy{}, Profiles: []*framework.Profile{p("a"), p("a")}}, `duplicate scheduler profile "a"`},
		{"a profile without a picker", scheduling.Options{Profiles: []*framework.Profile{{Name: "a"}}}, `scheduler profile "a" has no picker`},
		{"a negative weight", scheduling.Options{Profiles: []*framework.Profile{{Name: "a", Picker: &capture{}, Scorers: []framework.WeightedScorer{{Scorer: wild{named{"w"}}, Weight: -1}}}}},
			`scheduler profile "a": scorer w/test-w has weight -1, want a finite value ≥ 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := scheduling.New(tt.opts); err == nil || err.Error() != tt.want {
				t.Errorf("err = %v, want %s", err, tt.want)
			}
		})
	}
}

func TestConcurrentSchedulingIsSafe(t *testing.T) {
	t.Parallel()
	s := newScheduler(t, propertyConfigs[3], 3, prometheus.NewRegistry())
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for i := range 200 {
				cands := randomPool(r)
				res, err := s.Schedule(context.Background(), req(fmt.Sprint(g, i)), cands)
				if err != nil {
					t.Error(err)
					return
				}
				if !slices.Contains(cands, res.Targets()[0]) {
					t.Error("pick outside the candidates")
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestAnAdmitterInTheConfigurationShedsWithItsReason(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	s := newScheduler(t, `
plugins:
- type: latency-slo-admitter
- type: latency-scorer
`, 1, reg)
	late := func(name string) schedtest.C { return schedtest.C{Name: name} }
	cands := schedtest.Cands(late("a"), late("b"))
	for _, c := range cands {
		c.Put(datalayer.LatencyPredictionInfoKey, datalayer.LatencyPredictionInfo{TTFTValid: true, TTFT: 900, HasTTFTSLO: true, TTFTHeadroom: -800, Quantile: 0.9})
	}
	r := req("r")
	r.Priority, r.SLO.TTFT = -1, 100*time.Millisecond
	_, err := s.Schedule(context.Background(), r, cands)
	if !errors.Is(err, scheduling.ErrShed) || !strings.Contains(err.Error(), "no endpoint is predicted to meet its TTFT SLO") {
		t.Fatalf("err = %v, want a shed with the admitter's reason", err)
	}
	if v := testkit.Value(t, reg, "inference_extension_scheduler_attempts_total", "status", "shed"); v != 1 {
		t.Errorf("shed attempts = %v, want 1", v)
	}
	r.Priority = 0 // the same request, not sheddable: served
	if _, err := s.Schedule(context.Background(), r, cands); err != nil {
		t.Errorf("a critical request was refused: %v", err)
	}
}
