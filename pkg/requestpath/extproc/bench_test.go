package extproc_test

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// The EPP's command sets gRPC's default buffer pool to the server's, as a
// deployed EPP runs; so do these benchmarks and the tests beside them.
func init() { experimental.SetDefaultBufferPool(extproc.BufferPool()) }

// BenchmarkExtProcOverhead measures what routing adds to a request: the
// request phase of an ext_proc stream (headers, the body in 16 KiB chunks,
// the pick, the body passed back) through the real gRPC server on
// loopback, with prompts given as token ids (no tokenization) against an
// index fed by 64 engines, each holding a different 32k-token prefix.
// "serial" sends one request at a time: the overhead with no queueing.
// "closed64" keeps 64 requests in flight and reports the throughput reached;
// "rate1000" sends 1000 requests/s (up to 64 in flight) and measures each
// latency from its scheduled start, so a stall is not hidden by the
// requests it delays.
func BenchmarkExtProcOverhead(b *testing.B) {
	const (
		endpoints = 64
		blockSize = 16
		prefixLen = 32768
	)
	f := fleet.Start(b, fleet.Options{
		Endpoints: endpoints, BlockSize: blockSize, GPUBlocks: 4096,
		NoTokenizer: true, ScrapeInterval: time.Second,
	})
	prefixes := f.FillPrefixes(b, prefixLen)
	for i, s := range f.Servers {
		f.WaitHeld(b, s.Addr, prefixes[i])
	}
	_, c, _ := startServer(b, f.Director, extproc.Options{Plaintext: true})

	for _, size := range []int{1024, 8192, 32768} {
		bodies := fleet.PrefixBodies(prefixes, size)
		for _, mode := range []struct {
			name    string
			workers int
			paced   bool
		}{{"serial", 1, false}, {"closed64", 64, false}, {"rate1000", 64, true}} {
			b.Run(fmt.Sprintf("tokens=%d/%s", size, mode.name), func(b *testing.B) {
				runLoad(b, c, bodies, mode.workers, mode.paced)
			})
		}
	}
}

func runLoad(b *testing.B, c *envoy.Client, bodies [][]byte, workers int, paced bool) {
	l := envoy.Load{Bodies: bodies, N: b.N, Workers: workers}
	if paced {
		l.Interval = time.Millisecond
	}
	b.ResetTimer()
	cpu := testkit.CPUTime()
	res := l.Run(c)
	used := testkit.CPUTime() - cpu
	b.StopTimer()
	if res.Failures > 0 {
		b.Fatalf("%d of %d requests failed", res.Failures, b.N)
	}
	b.ReportMetric(float64(res.Quantile(0.50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(res.Quantile(0.99).Microseconds()), "p99-µs")
	b.ReportMetric(float64(b.N)/res.Elapsed.Seconds(), "req/s")
	// CPU per request, the load generator's and the fleet's included: on a
	// shared machine this is steadier than latency, and it is what decides
	// whether 1000 req/s fits on two cores.
	b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/req")
}
