package datalayer

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/testkit"
)

// clock is a test's hand-moved clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// outlierPool is a datastore of n endpoints, a0:1 … a<n-1>:1, with
// outlier detection as o says on a clock of the test's.
func outlierPool(t *testing.T, n int, o OutlierDetection) (*Datastore, *clock, *prometheus.Registry, *testkit.LogBuffer) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ds := NewDatastore(reg)
	for i := range n {
		ds.Upsert(ep(fmt.Sprintf("p%d", i), fmt.Sprintf("a%d:1", i)))
	}
	c := &clock{t: time.Unix(1000, 0)}
	logs := &testkit.LogBuffer{}
	o.Now, o.Logger = c.now, slog.New(slog.NewTextHandler(logs, nil))
	ds.SetOutlierDetection(o)
	return ds, c, reg, logs
}

func candidateAddrs(ds *Datastore) []string {
	var out []string
	for _, c := range ds.Candidates(nil) {
		out = append(out, c.Address)
	}
	return out
}

func report(ds *Datastore, addr string, o Outcome, n int) {
	for range n {
		ds.ReportOutcome(addr, o)
	}
}

func TestOutlierConsecutiveFailuresEject(t *testing.T) {
	t.Parallel()
	for _, o := range []Outcome{Outcome5xx, OutcomeConnect, OutcomeImplausible} {
		t.Run(o.String()+" failures in a row past the threshold eject the endpoint", func(t *testing.T) {
			t.Parallel()
			ds, _, reg, logs := outlierPool(t, 4, OutlierDetection{Consecutive5xx: 3})
			report(ds, "a1:1", o, 2)
			ds.ReportOutcome("a1:1", OutcomeSuccess)
			report(ds, "a1:1", o, 2)
			if ds.Ejected("a1:1") {
				t.Fatal("ejected after failures a success interrupted: the count must be consecutive")
			}
			if got := candidateAddrs(ds); len(got) != 4 {
				t.Fatalf("candidates %v, want all four", got)
			}
			ds.ReportOutcome("a1:1", o)
			if !ds.Ejected("a1:1") {
				t.Fatal("three failures in a row did not eject")
			}
			if got := candidateAddrs(ds); slices.Contains(got, "a1:1") || len(got) != 3 {
				t.Fatalf("candidates %v, want the three others", got)
			}
			if v := testkit.Value(t, reg, "kvroute_outlier_ejections_total", "reason", o.String()); v != 1 {
				t.Fatalf("ejections_total{reason=%s} = %v, want 1", o, v)
			}
			if v := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "ejected"); v != 1 {
				t.Fatalf("endpoints{state=ejected} = %v, want 1", v)
			}
			if v := testkit.Value(t, reg, "kvroute_outlier_failures_total", "endpoint", "a1:1", "reason", o.String()); v != 5 {
				t.Fatalf("failures_total = %v, want 5", v)
			}
			if n := strings.Count(logs.String(), "endpoint ejected from picking"); n != 1 {
				t.Fatalf("%d ejection log lines, want exactly 1:\n%s", n, logs)
			}
		})
	}
}

func TestOutlierIgnoresWhatSaysNothingOfTheEndpoint(t *testing.T) {
	t.Parallel()
	ds, _, _, _ := outlierPool(t, 2, OutlierDetection{Consecutive5xx: 2})
	ds.ReportOutcome("a0:1", Outcome5xx)
	report(ds, "a0:1", OutcomeNone, 10) // clients that left, 4xx
	ds.ReportOutcome("a0:1", Outcome5xx)
	if !ds.Ejected("a0:1") {
		t.Fatal("outcomes that say nothing of the endpoint broke its run of failures")
	}
	ds.ReportOutcome("nowhere:1", OutcomeLiar) // not in the pool: ignored
}

func TestOutlierLiarIsEjectedAtOnce(t *testing.T) {
	t.Parallel()
	ds, _, reg, _ := outlierPool(t, 3, OutlierDetection{})
	ds.ReportOutcome("a2:1", OutcomeLiar)
	if !ds.Ejected("a2:1") {
		t.Fatal("one impossible answer did not eject")
	}
	if v := testkit.Value(t, reg, "kvroute_outlier_ejections_total", "reason", "liar"); v != 1 {
		t.Fatalf("ejections_total{reason=liar} = %v, want 1", v)
	}
}

func TestOutlierBackoffGrowsAndIsCapped(t *testing.T) {
	t.Parallel()
	ds, c, _, _ := outlierPool(t, 4, OutlierDetection{
		Consecutive5xx: 1, BaseEjectionTime: 10 * time.Second, MaxEjectionTime: 25 * time.Second, Interval: time.Minute,
	})
	for i, want := range []time.Duration{10 * time.Second, 20 * time.Second, 25 * time.Second, 25 * time.Second} {
		ds.ReportOutcome("a0:1", Outcome5xx)
		if !ds.Ejected("a0:1") {
			t.Fatalf("ejection %d: not ejected", i+1)
		}
		c.advance(want - time.Millisecond)
		if !ds.Ejected("a0:1") || slices.Contains(candidateAddrs(ds), "a0:1") {
			t.Fatalf("ejection %d: back before its %v were up", i+1, want)
		}
		c.advance(time.Millisecond)
		if !slices.Contains(candidateAddrs(ds), "a0:1") {
			t.Fatalf("ejection %d: not back on probation after %v", i+1, want)
		}
		// A failure on probation ejects again at once, for longer.
	}
}

func TestOutlierHealthyIntervalsForgiveEjections(t *testing.T) {
	t.Parallel()
	ds, c, _, _ := outlierPool(t, 4, OutlierDetection{
		Consecutive5xx: 1, BaseEjectionTime: 10 * time.Second, Interval: time.Minute,
		ProbationShare: 1, ProbationSuccesses: 1,
	})
	ds.ReportOutcome("a0:1", Outcome5xx) // 1st: 10s
	c.advance(10 * time.Second)
	ds.ReportOutcome("a0:1", Outcome5xx) // on probation: 2nd, 20s
	c.advance(20 * time.Second)
	ds.ReportOutcome("a0:1", OutcomeSuccess) // healthy again
	c.advance(2 * time.Minute)               // two intervals: both forgiven
	ds.ReportOutcome("a0:1", Outcome5xx)
	c.advance(10 * time.Second)
	if ds.Ejected("a0:1") {
		t.Fatal("after two healthy intervals the next ejection was not the base time again")
	}
}

func TestOutlierProbation(t *testing.T) {
	t.Parallel()
	ds, c, reg, _ := outlierPool(t, 4, OutlierDetection{
		Consecutive5xx: 1, BaseEjectionTime: time.Second, ProbationShare: 0.25, ProbationSuccesses: 3,
	})
	ds.ReportOutcome("a3:1", Outcome5xx)
	c.advance(time.Second)
	in := 0
	for range 40 {
		if slices.Contains(candidateAddrs(ds), "a3:1") {
			in++
		}
	}
	if in != 10 {
		t.Fatalf("on probation with a share of 0.25, a candidate for %d of 40 requests, want 10", in)
	}
	if v := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "probation"); v != 1 {
		t.Fatalf("endpoints{state=probation} = %v, want 1", v)
	}
	report(ds, "a3:1", OutcomeSuccess, 2)
	if got := candidateAddrs(ds); !slices.Contains(got, "a3:1") {
		t.Fatal("the turn after 40 requests should include it")
	}
	if slices.Contains(candidateAddrs(ds), "a3:1") {
		t.Fatal("still on probation after 2 of 3 successes, yet a candidate twice in a row")
	}
	ds.ReportOutcome("a3:1", OutcomeSuccess)
	for range 5 {
		if !slices.Contains(candidateAddrs(ds), "a3:1") {
			t.Fatal("3 successes in a row did not end probation")
		}
	}
	if v := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "probation"); v != 0 {
		t.Fatalf("endpoints{state=probation} = %v after probation ended, want 0", v)
	}
}

func TestOutlierMaxEjectionPercent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		pool, pct int
		want      int
	}{
		{"half of a pool of four may be ejected", 4, 50, 2},
		{"a pool of two may lose one, whatever the share", 2, 10, 1},
		{"a pool of one never loses its endpoint", 1, 100, 0},
		{"ten percent of ten is one", 10, 10, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ds, _, reg, _ := outlierPool(t, tc.pool, OutlierDetection{Consecutive5xx: 1, MaxEjectionPercent: tc.pct})
			for i := range tc.pool {
				ds.ReportOutcome(fmt.Sprintf("a%d:1", i), Outcome5xx)
			}
			if got := len(candidateAddrs(ds)); got != tc.pool-tc.want {
				t.Fatalf("%d candidates after every endpoint failed, want %d", got, tc.pool-tc.want)
			}
			if v := testkit.Value(t, reg, "kvroute_outlier_ejections_overflow_total"); int(v) != tc.pool-tc.want {
				t.Fatalf("ejections_overflow_total = %v, want %d", v, tc.pool-tc.want)
			}
		})
	}
}

func TestOutlierNeverEmptiesTheCandidates(t *testing.T) {
	t.Parallel()
	ds, _, _, _ := outlierPool(t, 3, OutlierDetection{Consecutive5xx: 1, MaxEjectionPercent: 100})
	for i := range 3 {
		ds.ReportOutcome(fmt.Sprintf("a%d:1", i), Outcome5xx)
	}
	if got := candidateAddrs(ds); len(got) != 3 {
		t.Fatalf("with every endpoint ejected, candidates %v, want all of them rather than none", got)
	}
	only := func(e *Endpoint) bool { return e.Address == "a1:1" }
	if got := ds.Candidates(only); len(got) != 1 {
		t.Fatalf("a subset of ejected endpoints gave %d candidates, want its one", len(got))
	}
}

func TestOutlierStateFollowsMembership(t *testing.T) {
	t.Parallel()
	ds, _, reg, _ := outlierPool(t, 3, OutlierDetection{Consecutive5xx: 1})
	ds.ReportOutcome("a0:1", Outcome5xx)
	ds.Upsert(&Endpoint{Name: "p0", Address: "a0:1", Pod: "p0", Model: "m", Labels: map[string]string{"x": "y"}})
	if !ds.Ejected("a0:1") {
		t.Fatal("replacing an endpoint at the same address forgot its ejection")
	}
	ds.Remove("p0")
	if v := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "ejected"); v != 0 {
		t.Fatalf("endpoints{state=ejected} = %v after the ejected endpoint left, want 0", v)
	}
	if f := testkit.Family(t, reg, "kvroute_outlier_failures_total"); f != nil && len(f.GetMetric()) != 0 {
		t.Fatalf("the departed endpoint's failure series remain: %v", f.GetMetric())
	}
	ds.Upsert(ep("p0", "a0:1"))
	if ds.Ejected("a0:1") || len(candidateAddrs(ds)) != 3 {
		t.Fatal("an endpoint that came back after leaving is still ejected")
	}
}

func TestOutlierGaugeEndsWithTheEjectionInAnIdlePool(t *testing.T) {
	t.Parallel()
	ds, c, reg, _ := outlierPool(t, 3, OutlierDetection{Consecutive5xx: 1, BaseEjectionTime: time.Minute})
	ds.ReportOutcome("a1:1", Outcome5xx)
	if v := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "ejected"); v != 1 {
		t.Fatalf("endpoints{state=ejected} = %v during the ejection, want 1", v)
	}
	// No request meets the endpoint once its ejection is over.
	c.advance(time.Hour)
	ejected := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "ejected")
	probation := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "probation")
	if ejected != 0 || probation != 1 {
		t.Fatalf("an hour after a minute's ejection with no request since: ejected %v, probation %v; want 0 and 1", ejected, probation)
	}
	if ds.Ejected("a1:1") {
		t.Fatal("Ejected says the run-out ejection is still on")
	}
}

func TestOutlierOutcomeRacingRemovalLeavesNoTrace(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ds := NewDatastore(reg)
	ds.Upsert(ep("p0", "a0:1"))
	ds.Upsert(ep("p1", "a1:1"))
	ds.Upsert(ep("p2", "a2:1"))
	var once sync.Once
	ds.SetOutlierDetection(OutlierDetection{Logger: slog.New(slog.DiscardHandler), Now: func() time.Time {
		// The endpoint leaves after the outcome found it, before it counts.
		once.Do(func() { ds.Remove("p0") })
		return time.Unix(1000, 0)
	}})
	ds.ReportOutcome("a0:1", OutcomeLiar)
	if v := testkit.Value(t, reg, "kvroute_outlier_endpoints", "state", "ejected"); v != 0 {
		t.Fatalf("endpoints{state=ejected} = %v after the endpoint left, want 0", v)
	}
	if n := ds.unhealthy.Load(); n != 0 {
		t.Fatalf("%d endpoints counted unhealthy after the only one reported left, want 0", n)
	}
	if f := testkit.Family(t, reg, "kvroute_outlier_failures_total"); f != nil && len(f.GetMetric()) != 0 {
		t.Fatalf("the departed endpoint's failure series remain: %v", f.GetMetric())
	}
}

func TestOutlierDisabled(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("p0", "a0:1"))
	ds.Upsert(ep("p1", "a1:1"))
	report(ds, "a0:1", OutcomeLiar, 10) // never configured: ignored
	ds.SetOutlierDetection(OutlierDetection{Disabled: true})
	report(ds, "a0:1", Outcome5xx, 10)
	if ds.Ejected("a0:1") || len(ds.Candidates(nil)) != 2 {
		t.Fatal("outlier detection that is off ejected an endpoint")
	}
}

func BenchmarkCandidatesWithOutlierDetection(b *testing.B) {
	for _, tc := range []struct {
		name        string
		on, ejected bool
	}{{"off", false, false}, {"on", true, false}, {"on,one-ejected", true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			ds := NewDatastore(nil)
			for i := range 64 {
				ds.Upsert(ep(fmt.Sprintf("p%02d", i), fmt.Sprintf("a%d:1", i)))
			}
			if tc.on {
				ds.SetOutlierDetection(OutlierDetection{Consecutive5xx: 1, BaseEjectionTime: time.Hour,
					Logger: slog.New(slog.DiscardHandler)})
			}
			if tc.ejected {
				ds.ReportOutcome("a0:1", Outcome5xx)
			}
			var set CandidateSet
			b.ReportAllocs()
			for b.Loop() {
				ds.CandidatesInto(&set, nil)
			}
		})
	}
}
