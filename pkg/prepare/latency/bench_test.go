package latency_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/framework/request"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare/latency"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkProduce measures predicting one request's latency on each of
// its candidates with the in-process predictor, publishing included: CPU
// ns per request and per candidate, and allocations per request.
func BenchmarkProduce(b *testing.B) {
	for _, n := range []int{16, 64} {
		b.Run(fmt.Sprintf("%d candidates", n), func(b *testing.B) {
			p, err := predict.New(predict.Options{Synchronous: true})
			if err != nil {
				b.Fatal(err)
			}
			prod, err := latency.New("", latency.InProcess{P: p}, 2*time.Second, nil)
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			cands := make([]*datalayer.Candidate, n)
			for i := range cands {
				addr := fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250)
				p.AddEndpoint(addr, "")
				cands[i] = datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr},
					datalayer.Metrics{RunningRequests: i % 4, UpdateTime: now}, datalayer.StreamExact)
				var byTier [events.NumTiers]int
				byTier[events.TierGPU] = i * 8
				cands[i].Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{
					MatchBlocks: i * 8, TotalBlocks: 512, BlockSizeTokens: 16, BlocksByTier: byTier, State: datalayer.StreamExact})
			}
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
