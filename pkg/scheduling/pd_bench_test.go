//go:build linux

package scheduling_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare/predictedlatency"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
)

// singleProfileText is the predicted-latency profile alone, under
// single-profile-handler: the decision a pool without prefill pods makes.
const singleProfileText = `
plugins:
- type: slo-headroom-tier-filter
- type: latency-scorer
  parameters: {use: quantile}
- type: latency-slo-admitter
- type: speculative-prefix-recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: speculative-prefix-recorder
`

// predictedPool is n endpoints, every fourth an idle prefill pod when pd
// is set, the rest decode pods with a queue (so that the decider splits);
// each holds a little of an 8000-token prompt, and the real predictor (its prior) has predicted the request's
// latency on each, as the predicted-latency producer does before
// scheduling.
func predictedPool(b *testing.B, n int, pd bool, r *request.Request) []*datalayer.Candidate {
	b.Helper()
	pred, err := predict.New(predict.Options{Synchronous: true})
	if err != nil {
		b.Fatal(err)
	}
	prod, err := predictedlatency.New("", predictedlatency.InProcess{P: pred}, time.Hour, nil)
	if err != nil {
		b.Fatal(err)
	}
	ds := datalayer.NewDatastore(nil)
	now := time.Now()
	for i := range n {
		name, addr := fmt.Sprintf("pod-%04d", i), fmt.Sprintf("10.0.%d.%d:8000", i/250, i%250)
		labels := map[string]string{}
		queue := 6 + i%5
		if pd {
			labels[bylabel.RoleLabel] = bylabel.RoleDecode
			if i%4 == 0 {
				labels[bylabel.RoleLabel], queue = bylabel.RolePrefill, 0
			}
		}
		pred.AddEndpoint(addr, "")
		ds.Upsert(&datalayer.Endpoint{Name: name, Address: addr, Model: "m", Labels: labels})
		ds.SetMetrics(name, datalayer.Metrics{WaitingQueueSize: queue, RunningRequests: 8, KVCacheUsage: 0.3, UpdateTime: now})
	}
	// In a set's memory, as the request path makes each request's
	// candidates (filters reuse it).
	cands := ds.CandidatesInto(new(datalayer.CandidateSet), nil)
	for i, c := range cands {
		held := (i * 7) % 40
		var byTier [events.NumTiers]int
		byTier[events.TierGPU] = held
		c.Stream = datalayer.StreamExact
		c.Put(datalayer.PrefixCacheMatchInfoKey, datalayer.PrefixCacheInfo{MatchBlocks: held, TotalBlocks: 500, BlockSizeTokens: 16,
			MatchTokens: held * 16, BlocksByTier: byTier, Exact: true, State: datalayer.StreamExact})
	}
	if err := prod.Produce(context.Background(), r, cands); err != nil {
		b.Fatal(err)
	}
	return cands
}

func loadScheduler(b *testing.B, text string) *scheduling.Scheduler {
	b.Helper()
	l, err := config.NewInTreeRegistry().Load([]byte(text), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		b.Fatal(err)
	}
	o := l.SchedulerOptions()
	o.Rand = rand.New(rand.NewPCG(1, 2))
	s, err := scheduling.New(o)
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkDisaggregatedDecision is the whole decision of the default
// configuration in a P/D pool (the decode pick, the predicted-latency
// decider over the prefill pods, the prefill pick) against the
// single-profile decision of the same predicted-latency profile over a
// pool of as many endpoints without roles, the two alternating in one
// loop; pd/single is the ratio of their CPU time per decision, measured on
// the benchmark's own thread.
func BenchmarkDisaggregatedDecision(b *testing.B) {
	for _, n := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			r := &request.Request{ID: "bench", Model: "m", TokenIDs: make([]uint32, 8000), MaxTokens: 128}
			single, pd := loadScheduler(b, singleProfileText), loadScheduler(b, config.DefaultConfigText)
			plain, roles := predictedPool(b, n, false, r), predictedPool(b, n, true, r)
			ctx := context.Background()
			res, err := pd.Schedule(ctx, r, roles)
			if err != nil {
				b.Fatal(err)
			}
			if res.Decision != framework.PrefillDecode {
				b.Fatalf("the P/D pool's decision is %s (%s); the benchmark wants the split path", res.Decision, res.Reason)
			}
			// CPU time of this thread: on a shared machine the wall clock
			// also counts the time other processes held the cores.
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var tSingle, tPD int64
			b.ReportAllocs()
			for b.Loop() {
				t0 := threadCPU(b)
				if _, err := single.Schedule(ctx, r, plain); err != nil {
					b.Fatal(err)
				}
				t1 := threadCPU(b)
				if _, err := pd.Schedule(ctx, r, roles); err != nil {
					b.Fatal(err)
				}
				t2 := threadCPU(b)
				tSingle, tPD = tSingle+t1-t0, tPD+t2-t1
			}
			b.ReportMetric(float64(tSingle)/float64(b.N), "cpu-ns/single")
			b.ReportMetric(float64(tPD)/float64(b.N), "cpu-ns/pd")
			b.ReportMetric(float64(tPD)/float64(tSingle), "pd/single")
		})
	}
}

// threadCPU is the calling thread's CPU time in nanoseconds.
func threadCPU(b *testing.B) int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		b.Fatal(err)
	}
	return ts.Nano()
}
