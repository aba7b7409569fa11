package routinghistory_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/prepare/routinghistory"
	"github.com/kvroute/kvroute/pkg/request"
)

// BenchmarkProduceAndRecord measures what the routing history adds to a
// request of 512 blocks (8k tokens at 16) over 64 candidates: the answer
// for every candidate (each was sent its own 256-block prefix, the request
// shares one of them in full) and the record of the pick, as
// prefix-cache-scorer makes it (256 hashes, the history's cap).
func BenchmarkProduceAndRecord(b *testing.B) {
	const endpoints, blocks, recorded = 64, 512, 256
	x := approx.New(0, nil)
	cands := make([]*datalayer.Candidate, endpoints)
	keys := make([][]uint64, endpoints)
	for i := range cands {
		addr := fmt.Sprintf("10.3.0.%d:8000", i+1)
		keys[i] = make([]uint64, blocks)
		for j := range keys[i] {
			keys[i][j] = uint64(i)<<32 | uint64(j)
		}
		x.Record(addr, keys[i][:recorded])
		cands[i] = datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr, Model: "m"}, datalayer.Metrics{}, datalayer.StreamExact)
	}
	p := routinghistory.New("", x)
	ctx := context.Background()
	req := &request.Request{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		k := keys[i%endpoints]
		var boxed any = k // as the prefix producer publishes it: boxed once
		for _, c := range cands {
			c.Put(prefixmatch.RequestBlockKeysKey, boxed)
		}
		if err := p.Produce(ctx, req, cands); err != nil {
			b.Fatal(err)
		}
		x.Record(cands[i%endpoints].Address, k[:recorded])
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/endpoints, "ns/candidate")
}
