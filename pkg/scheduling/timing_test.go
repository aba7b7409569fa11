package scheduling_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
)

// Plugins that do nothing but spend the time they are given, to see under
// which name the scheduler observes it.

type slowFilter struct {
	named
	d time.Duration
}

func (f slowFilter) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	time.Sleep(f.d)
	return cands
}

type slowScorer struct {
	named
	d time.Duration
}

func (slowScorer) Category() framework.ScorerCategory { return framework.Balance }
func (s slowScorer) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, _ []*datalayer.Candidate, out []float64) {
	time.Sleep(s.d)
	for i := range out {
		out[i] = 0.5
	}
}

type slowPicker struct {
	named
	d time.Duration
}

func (p slowPicker) Pick(_ context.Context, _ *framework.CycleState, scored []framework.ScoredCandidate) *framework.ProfileResult {
	time.Sleep(p.d)
	return &framework.ProfileResult{Picked: []*datalayer.Candidate{scored[0].Candidate}}
}

type slowPostPick struct {
	named
	d time.Duration
}

func (p slowPostPick) PostPick(context.Context, *framework.CycleState, *request.Request, *framework.ProfileResult) {
	time.Sleep(p.d)
}

type slowAdmitter struct {
	named
	d time.Duration
}

func (a slowAdmitter) Admit(context.Context, *request.Request, []*datalayer.Candidate) error {
	time.Sleep(a.d)
	return nil
}

// everyProfile runs every profile not yet run, all in its first round,
// and answers with the first profile's pick.
type everyProfile struct {
	named
	d time.Duration
}

func (h everyProfile) Pick(_ context.Context, _ *framework.CycleState, _ *request.Request, ps []*framework.Profile, rs map[string]*framework.ProfileResult) []*framework.Profile {
	time.Sleep(h.d)
	if len(rs) > 0 {
		return nil
	}
	return ps
}

func (h everyProfile) ProcessResults(_ context.Context, _ *framework.CycleState, _ *request.Request, rs map[string]*framework.ProfileResult) (*framework.Result, error) {
	return &framework.Result{PrimaryProfile: "a", Profiles: rs}, nil
}

// pluginTimings are the plugin_duration_seconds series: sample count and
// sum by extension point and plugin name.
func pluginTimings(t *testing.T, reg *prometheus.Registry) map[string]struct {
	n   uint64
	sum float64
} {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]struct {
		n   uint64
		sum float64
	}{}
	for _, mf := range mfs {
		if mf.GetName() != "inference_extension_plugin_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var point, name string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "extension_point":
					point = lp.GetValue()
				case "plugin_name":
					name = lp.GetValue()
				}
			}
			out[point+"/"+name] = struct {
				n   uint64
				sum float64
			}{m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()}
		}
	}
	return out
}

// timedScheduler is two profiles under everyProfile: a with two filters,
// two scorers, a picker and two post-picks; b whose filter leaves nothing.
// slow names the plugin that sleeps for d.
func timedScheduler(t *testing.T, reg *prometheus.Registry, slow string, d time.Duration) *scheduling.Scheduler {
	t.Helper()
	dur := func(name string) time.Duration {
		if name == slow {
			return d
		}
		return 0
	}
	a := &framework.Profile{
		Name:      "a",
		Filters:   []framework.Filter{slowFilter{named{"fa1"}, dur("fa1")}, slowFilter{named{"fa2"}, dur("fa2")}},
		Scorers:   []framework.WeightedScorer{{Scorer: slowScorer{named{"sa1"}, dur("sa1")}, Weight: 1}, {Scorer: slowScorer{named{"sa2"}, dur("sa2")}, Weight: 1}},
		Picker:    slowPicker{named{"pa"}, dur("pa")},
		PostPicks: []framework.PostPick{slowPostPick{named{"qa1"}, dur("qa1")}, slowPostPick{named{"qa2"}, dur("qa2")}},
	}
	b := &framework.Profile{
		Name:      "b",
		Filters:   []framework.Filter{dropAll{named{"fb"}}},
		Picker:    slowPicker{named{"pb"}, dur("pb")},
		PostPicks: []framework.PostPick{slowPostPick{named{"qb"}, dur("qb")}},
	}
	s, err := scheduling.New(scheduling.Options{
		Profiles:   []*framework.Profile{a, b},
		Handler:    everyProfile{named{"h"}, dur("h")},
		Admitters:  []framework.Admitter{slowAdmitter{named{"adm"}, dur("adm")}},
		Now:        func() time.Time { return schedtest.Now },
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestEveryPluginCallIsObservedOnceUnderItsExtensionPoint(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	s := timedScheduler(t, reg, "", 0)
	const cycles = 3
	for range cycles {
		if _, err := s.Schedule(context.Background(), req("r"), schedtest.Cands(schedtest.C{Name: "x"}, schedtest.C{Name: "y"})); err != nil {
			t.Fatal(err)
		}
	}
	// The handler is called twice to pick (its second answer ends the
	// cycle) and once for the results; profile b's filter leaves nothing,
	// so its picker and post-pick never run.
	want := map[string]uint64{
		"admitter/adm": cycles, "profile_handler/h": 3 * cycles,
		"filter/fa1": cycles, "filter/fa2": cycles, "filter/fb": cycles,
		"scorer/sa1": cycles, "scorer/sa2": cycles,
		"picker/pa": cycles, "picker/pb": 0,
		"post_pick/qa1": cycles, "post_pick/qa2": cycles, "post_pick/qb": 0,
	}
	got := pluginTimings(t, reg)
	if len(got) != len(want) {
		t.Errorf("%d series, want %d: %v", len(got), len(want), got)
	}
	for k, n := range want {
		if g := got[k]; g.n != n || g.sum < 0 || math.IsNaN(g.sum) {
			t.Errorf("%s: %d observations summing to %v, want %d", k, g.n, g.sum, n)
		}
	}
}

func TestThePluginThatSpendsTheTimeIsTheOneItIsObservedUnder(t *testing.T) {
	t.Parallel()
	// Calls are timed one after another off shared clock readings: a call's
	// time must not land on its neighbour's series.
	const d = 2 * time.Millisecond
	for _, slow := range []string{"adm", "h", "fa1", "fa2", "sa1", "sa2", "pa", "qa1", "qa2"} {
		t.Run(slow, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			s := timedScheduler(t, reg, slow, d)
			if _, err := s.Schedule(context.Background(), req("r"), schedtest.Cands(schedtest.C{Name: "x"})); err != nil {
				t.Fatal(err)
			}
			found := false
			for k, g := range pluginTimings(t, reg) {
				if strings.HasSuffix(k, "/"+slow) {
					found = true
					if g.sum < d.Seconds() {
						t.Errorf("%s slept %v and was observed for %vs in all", k, d, g.sum)
					}
				}
			}
			if !found {
				t.Errorf("no series for %s", slow)
			}
		})
	}
}

// peek is a scorer that reports whether the output it was handed held
// anything but zeros, then fills it.
type peek struct {
	named
	dirty *int
}

func (peek) Category() framework.ScorerCategory { return framework.Balance }
func (p peek) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, _ []*datalayer.Candidate, out []float64) {
	for _, v := range out {
		if v != 0 {
			*p.dirty++
			break
		}
	}
	for i := range out {
		out[i] = 0.7
	}
}

// boom fills its output, then panics while armed.
type boom struct {
	named
	armed *bool
}

func (boom) Category() framework.ScorerCategory { return framework.Balance }
func (b boom) Score(_ context.Context, _ *framework.CycleState, _ *request.Request, _ []*datalayer.Candidate, out []float64) {
	for i := range out {
		out[i] = 1
	}
	if *b.armed {
		panic("boom")
	}
}

func TestEveryScorerIsHandedAClearedOutput(t *testing.T) {
	t.Parallel()
	dirty, armed := 0, false
	p := func(name string) framework.WeightedScorer {
		return framework.WeightedScorer{Scorer: peek{named{name}, &dirty}, Weight: 1}
	}
	s, err := scheduling.New(scheduling.Options{
		Profiles: []*framework.Profile{
			{Name: "a", Scorers: []framework.WeightedScorer{p("a1"), p("a2")}, Picker: slowPicker{named: named{"pa"}}},
			{Name: "b", Scorers: []framework.WeightedScorer{p("b1"), {Scorer: boom{named{"boom"}, &armed}, Weight: 1}}, Picker: slowPicker{named: named{"pb"}}},
		},
		Handler: everyProfile{named: named{"h"}},
		Now:     func() time.Time { return schedtest.Now },
	})
	if err != nil {
		t.Fatal(err)
	}
	cands := func(n int) []*datalayer.Candidate {
		cs := make([]schedtest.C, n)
		for i := range cs {
			cs[i].Name = fmt.Sprint("pod-", i)
		}
		return schedtest.Cands(cs...)
	}
	schedule := func(n int) (panicked bool) {
		defer func() { panicked = recover() != nil }()
		if _, err := s.Schedule(context.Background(), req("r"), cands(n)); err != nil {
			t.Fatal(err)
		}
		return false
	}
	// After another scorer, another profile, a larger and a smaller fleet,
	// and a scorer that panicked with its output filled (the request path
	// recovers a panic and goes on serving).
	for i, n := range []int{4, 8, 3, 8} {
		if i == 2 {
			armed = true
			if !schedule(n) {
				t.Fatal("the armed scorer did not panic")
			}
			armed = false
		}
		schedule(n)
	}
	if dirty != 0 {
		t.Errorf("%d scorer calls were handed an output holding another's scores", dirty)
	}
}
