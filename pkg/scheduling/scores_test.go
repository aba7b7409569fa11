package scheduling_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
)

// keeping is newScheduler with KeepScores as asked.
func keeping(t testing.TB, keep bool) *scheduling.Scheduler {
	t.Helper()
	l, err := config.NewInTreeRegistry().Load([]byte(config.UpstreamWeightsConfigText), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		t.Fatal(err)
	}
	opts := l.SchedulerOptions()
	opts.Rand = rand.New(rand.NewPCG(1, 2))
	opts.Now = func() time.Time { return schedtest.Now }
	opts.KeepScores = keep
	s, err := scheduling.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestScoresAreKeptForEveryCandidateOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	cands := schedtest.Cands(
		schedtest.C{Name: "a", Queue: 0, KV: 0.1, Prefix: schedtest.Info(8, 8, 0, 0, 0)},
		schedtest.C{Name: "b", Queue: 4, KV: 0.5, Prefix: schedtest.Info(8, 0, 0, 0, 0)},
		schedtest.C{Name: "c", Queue: 2, KV: 0.3, Prefix: schedtest.Info(8, 4, 0, 0, 0)},
	)
	res, err := keeping(t, true).Schedule(context.Background(), req("r"), cands)
	if err != nil {
		t.Fatal(err)
	}
	scored := res.Profiles[res.PrimaryProfile].Scored
	if len(scored) != len(cands) {
		t.Fatalf("%d scored, want every one of the %d candidates", len(scored), len(cands))
	}
	best := scored[0]
	for _, s := range scored {
		if s.Score < 0 || math.IsNaN(s.Score) {
			t.Errorf("%s scored %v", s.Name, s.Score)
		}
		if s.Score > best.Score {
			best = s
		}
	}
	if picked := res.Targets()[0]; picked != best.Candidate {
		t.Errorf("picked %s, but %s scored highest (%v)", picked.Name, best.Name, best.Score)
	}
	res, err = keeping(t, false).Schedule(context.Background(), req("r"), cands)
	if err != nil {
		t.Fatal(err)
	}
	if s := res.Profiles[res.PrimaryProfile].Scored; s != nil {
		t.Errorf("scores kept without KeepScores: %v", s)
	}
}

// BenchmarkScheduleKeepingScores measures what --emit-endpoint-scores
// costs a cycle: turns of cycles without and with kept scores over the
// same 64 candidates, reported as the ratio of their times.
func BenchmarkScheduleKeepingScores(b *testing.B) {
	off, on := keeping(b, false), keeping(b, true)
	cands := schedtest.Fleet(64)
	r := req("bench")
	ctx := context.Background()
	var tOff, tOn time.Duration
	b.ReportAllocs()
	turn := 0
	for b.Loop() {
		// Each goes first in every other turn, so that neither pays
		// alone for what the other leaves behind (cache, garbage).
		first, second, tFirst, tSecond := off, on, &tOff, &tOn
		if turn%2 == 1 {
			first, second, tFirst, tSecond = on, off, &tOn, &tOff
		}
		turn++
		t0 := time.Now()
		if _, err := first.Schedule(ctx, r, cands); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := second.Schedule(ctx, r, cands); err != nil {
			b.Fatal(err)
		}
		*tFirst += t1.Sub(t0)
		*tSecond += time.Since(t1)
	}
	b.ReportMetric(float64(tOff.Nanoseconds())/float64(b.N), "ns/cycle-without")
	b.ReportMetric(float64(tOn.Nanoseconds())/float64(b.N), "ns/cycle-with")
	b.ReportMetric(float64(tOn)/float64(tOff), "with/without")
}
