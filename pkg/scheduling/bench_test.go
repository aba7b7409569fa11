package scheduling_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
)

// BenchmarkSchedule runs full cycles of upstream's weights on the precise
// scorer (precise prefix 3, queue 2, KV usage 2, max-score picker) over a
// busy pool. The default profile, with its predictor, is measured with
// its producers in pkg/epp's BenchmarkRoutePredicted.
func BenchmarkSchedule(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("candidates=%d", n), func(b *testing.B) {
			s := newScheduler(b, config.UpstreamWeightsConfigText, 1, nil)
			cands := schedtest.Fleet(n)
			r := req("bench")
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Schedule(ctx, r, cands); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/candidate")
		})
	}
}
