package predictedlatency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkProduce measures predicting one request's latency on each of
// its candidates with the in-process predictor, publishing included: CPU
// ns per request and per candidate, and allocations per request.
func BenchmarkProduce(b *testing.B) {
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("%d candidates", n), func(b *testing.B) {
			p, prod := inProcess(b, nil)
			cands := manyCandidatesIn(p, n, 8192, new(datalayer.CandidateSet))
			req := &request.Request{TokenIDs: make([]uint32, 8192), MaxTokens: 64, SLO: request.SLO{TTFT: time.Second}}
			b.ReportAllocs()
			cpu := testkit.CPUTime()
			for b.Loop() {
				if err := prod.Produce(context.Background(), req, cands); err != nil {
					b.Fatal(err)
				}
			}
			ns := float64((testkit.CPUTime() - cpu).Nanoseconds()) / float64(b.N)
			b.ReportMetric(ns/1e3, "cpu-µs/req")
			b.ReportMetric(ns/float64(n), "cpu-ns/candidate")
		})
	}
}
