package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/blockpool"
	"github.com/kvroute/kvroute/pkg/extproc"
	"github.com/kvroute/kvroute/pkg/extproc/extproctest"
)

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
	f := extproctest.StartFleet(b, extproctest.FleetOptions{
		Endpoints: endpoints, BlockSize: blockSize, GPUBlocks: 4096,
		NoTokenizer: true, ScrapeInterval: time.Second,
	})
	prefixes := make([][]uint32, endpoints)
	for i, s := range f.Servers {
		p := make([]uint32, prefixLen)
		for j := range p {
			p[j] = uint32(i*prefixLen + j)
		}
		prefixes[i] = p
		if _, err := s.Engine.Serve(blockpool.Request{Tokens: p}); err != nil {
			b.Fatal(err)
		}
	}
	for i, s := range f.Servers {
		f.WaitHeld(b, s.Addr, prefixes[i])
	}
	_, c, _ := startServer(b, f.Director, extproc.Options{Plaintext: true})

	for _, size := range []int{1024, 8192, 32768} {
		bodies := make([][]byte, endpoints)
		for i, p := range prefixes {
			prompt := append(slices.Clone(p[:size-16]), make([]uint32, 16)...)
			for j := size - 16; j < size; j++ {
				prompt[j] = uint32(1<<30 + j)
			}
			bodies[i], _ = json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
		}
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

func runLoad(b *testing.B, c *extproctest.Client, bodies [][]byte, workers int, paced bool) {
	var (
		next     atomic.Int64
		mu       sync.Mutex
		lat      = make([]time.Duration, 0, b.N)
		failures atomic.Int64
		wg       sync.WaitGroup
	)
	b.ResetTimer()
	start, cpu := time.Now(), cpuTime()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []time.Duration
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					break
				}
				body := bodies[r.IntN(len(bodies))]
				t0 := time.Now()
				if paced {
					t0 = start.Add(time.Duration(i) * time.Millisecond)
					time.Sleep(time.Until(t0))
				}
				res, err := c.Do(context.Background(), extproctest.Request{
					Path: "/v1/completions", Body: body, Chunks: len(body)/16384 + 1,
				}, nil)
				if err != nil || res.Immediate != nil {
					failures.Add(1)
					continue
				}
				mine = append(mine, time.Since(t0))
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed, used := time.Since(start), cpuTime()-cpu
	b.StopTimer()
	if n := failures.Load(); n > 0 {
		b.Fatalf("%d of %d requests failed", n, b.N)
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds())
	}
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
	// CPU per request, the load generator's and the fleet's included: on a
	// shared machine this is steadier than latency, and it is what decides
	// whether 1000 req/s fits on two cores.
	b.ReportMetric(float64(used.Microseconds())/float64(b.N), "cpu-µs/req")
}
