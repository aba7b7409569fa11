package prefixmatch_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkProduce measures the producer's whole answer for an 8k-token
// request over 64 candidates (block keys, the index lookup, publishing),
// as the ext_proc path meets it: each engine holds its own 32k-token
// prefix, each request asks for 8k tokens of one of them (all but the last
// block held), the next request another, and with "cold" a buffer four
// times the size of L2 is written between requests (not timed), as parsing
// a request's body does.
func BenchmarkProduce(b *testing.B) {
	const endpoints, blockSize, heldBlocks, askedTokens = 64, 16, 2048, 8192
	for _, cold := range []bool{false, true} {
		name := "8k tokens/64 candidates/warm"
		if cold {
			name = "8k tokens/64 candidates/cold"
		}
		b.Run(name, func(b *testing.B) {
			ix := index.New(index.Options{}, nil)
			cands := make([]*datalayer.Candidate, endpoints)
			reqs := make([]*request.Request, endpoints)
			for i := range cands {
				addr := fmt.Sprintf("10.3.%d.%d:8000", i/250, i%250)
				ix.AddEndpoint(addr)
				prompt := make([]uint32, heldBlocks*blockSize)
				for j := range prompt {
					prompt[j] = uint32(i*len(prompt) + j)
				}
				store(ix, addr, "m", blockSize, heldBlocks, prompt)
				asked := append(prompt[:askedTokens-blockSize:askedTokens-blockSize], make([]uint32, blockSize)...)
				for j := askedTokens - blockSize; j < askedTokens; j++ {
					asked[j] = 1<<30 + uint32(j)
				}
				reqs[i] = &request.Request{Model: "m", TokenIDs: asked}
				cands[i] = datalayer.NewCandidate(&datalayer.Endpoint{Name: addr, Address: addr, Model: "m"},
					datalayer.Metrics{BlockSize: blockSize}, datalayer.StreamExact)
			}
			p := prefixmatch.New("", prefixmatch.Params{}, ix, nil)
			ctx := context.Background()
			flush := make([]byte, 8<<20)
			// Timed by hand around each call, the flush left out: the
			// timer's own stop and start read the memory statistics.
			var wall, cpu time.Duration
			var each []time.Duration
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if cold {
					for j := 0; j < len(flush); j += 64 {
						flush[j]++
					}
				}
				cpu0, t0 := testkit.CPUTime(), time.Now()
				if err := p.Produce(ctx, reqs[i%endpoints], cands); err != nil {
					b.Fatal(err)
				}
				d := time.Since(t0)
				wall += d
				cpu += testkit.CPUTime() - cpu0
				each = append(each, d)
			}
			holder := (b.N - 1) % endpoints
			v, _ := cands[holder].Get(datalayer.PrefixCacheMatchInfoKey)
			if got := v.(datalayer.PrefixCacheInfo).MatchBlocks; got != askedTokens/blockSize-1 {
				b.Fatalf("the holder matches %d blocks, want %d", got, askedTokens/blockSize-1)
			}
			b.ReportMetric(float64(wall.Nanoseconds())/float64(b.N), "ns/op")
			b.ReportMetric(float64(wall.Nanoseconds())/1e3/float64(b.N), "µs/request")
			// The median resists the shared machine's preemptions, which
			// the mean takes in.
			slices.Sort(each)
			b.ReportMetric(float64(each[len(each)/2].Nanoseconds())/1e3, "p50-µs/request")
			if cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/request")
			}
		})
	}
}
