package envoy

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Load is a benchmark's traffic: N requests whose bodies are
// drawn from Bodies, each split into 16 KiB chunks as Envoy forwards them,
// sent by Workers concurrent streams. With Interval set, request i is due
// at start + i*Interval (open loop) and its latency counts from then if it
// went out late, so a stall is not hidden by the requests it delays;
// without it every worker sends its next request as soon as the last is
// answered.
type Load struct {
	// Path is every request's :path (/v1/completions when empty).
	Path     string
	Bodies   [][]byte
	N        int
	Workers  int
	Interval time.Duration
}

// LoadResult is what a Load measured: the latencies of the requests
// answered with a pick, sorted, and how many were not.
type LoadResult struct {
	Latencies []time.Duration
	Failures  int
	Elapsed   time.Duration
}

// Quantile returns the q-quantile of the latencies (0 with none).
func (r LoadResult) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	return r.Latencies[min(len(r.Latencies)-1, int(q*float64(len(r.Latencies))))]
}

// Run sends the load through c and waits for every answer.
func (l Load) Run(c *Client) LoadResult {
	var (
		next     atomic.Int64
		mu       sync.Mutex
		lat      = make([]time.Duration, 0, l.N)
		failures atomic.Int64
		wg       sync.WaitGroup
	)
	path := l.Path
	if path == "" {
		path = "/v1/completions"
	}
	start := time.Now()
	for w := range max(l.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var mine []time.Duration
			for {
				i := next.Add(1) - 1
				if i >= int64(l.N) {
					break
				}
				body := l.Bodies[r.IntN(len(l.Bodies))]
				t0 := time.Now()
				if l.Interval > 0 {
					// A request its worker was too busy to send on time
					// counts from when it was due; one the worker slept
					// for counts from when the worker woke, so that the
					// timer's lateness (up to a millisecond when the
					// process is idle) is not charged to the server.
					due := start.Add(time.Duration(i) * l.Interval)
					if d := time.Until(due); d > 0 {
						time.Sleep(d)
						t0 = time.Now()
					} else {
						t0 = due
					}
				}
				res, err := c.Do(context.Background(), Request{
					Path: path, Body: body, Chunks: len(body)/16384 + 1,
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
	slices.Sort(lat)
	return LoadResult{Latencies: lat, Failures: int(failures.Load()), Elapsed: time.Since(start)}
}
