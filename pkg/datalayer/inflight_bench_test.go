package datalayer

import (
	"fmt"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkInFlightDispatch is a request's life on one endpoint (its
// dispatch, its first token, its end) with n others in flight there, half
// decoding. The dispatchers run in parallel, as the ext_proc streams do.
// With reads=each, every request then reads the endpoint's snapshot once,
// as the next pick does: cpu-ns/op is the process's CPU a request, replays
// included wherever they run. With reads=spinning, a reader takes the
// snapshot in a loop beside them: reads/s is what it got done. Both
// report mutex-wait-ns/op, the time spent blocked on any sync.Mutex (the
// endpoint's accounting is the only one they share).
func BenchmarkInFlightDispatch(b *testing.B) {
	for _, n := range []int{8, 64, 256, 1024} {
		for _, spinning := range []bool{false, true} {
			reads := "each"
			if spinning {
				reads = "spinning"
			}
			b.Run(fmt.Sprintf("inflight=%d/reads=%s", n, reads), func(b *testing.B) {
				benchInFlightDispatch(b, n, spinning)
			})
		}
	}
}

func benchInFlightDispatch(b *testing.B, n int, spinning bool) {
	ds := NewDatastore(nil)
	ds.SetEngineLimits(enginesched.Limits{MaxNumSeqs: 256, MaxBatchedTokens: 8192})
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	c := ds.snap.Load().byName["a"].load
	t0 := time.Unix(1000, 0)
	held := make([]*Dispatch, n)
	for i := range held {
		held[i] = ds.Dispatch("a", t0.Add(time.Duration(i)*time.Millisecond), 500+i%7*300, 2000+i%5*1000, 64+i%9*32)
		held[i].ExpectPrefill(20 * time.Millisecond)
		held[i].ExpectDecode(15 * time.Millisecond)
		if i%2 == 0 {
			held[i].FirstToken(t0.Add(time.Second))
		}
	}
	var stop atomic.Bool
	var reads atomic.Int64
	var wg sync.WaitGroup
	if spinning {
		wg.Go(func() {
			var n int64
			for !stop.Load() {
				var f InFlight
				if c.loadInto(&f); f.Requests() == 0 {
					panic("nothing in flight")
				}
				n++
			}
			reads.Store(n)
		})
	}
	sample := []metrics.Sample{{Name: "/sync/mutex/wait/total:seconds"}}
	metrics.Read(sample)
	waited := sample[0].Value.Float64()
	var clock atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), testkit.CPUTime()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			at := t0.Add(time.Second + time.Duration(clock.Add(1))*time.Microsecond)
			d := ds.Dispatch("a", at, 1000, 4000, 128)
			d.ExpectPrefill(20 * time.Millisecond)
			d.ExpectDecode(15 * time.Millisecond)
			d.FirstToken(at.Add(time.Millisecond))
			d.DoneAt(at.Add(2 * time.Millisecond))
			if !spinning {
				var f InFlight
				if c.loadInto(&f); f.Requests() == 0 {
					panic("nothing in flight")
				}
			}
		}
	})
	elapsed, cpu := time.Since(start), testkit.CPUTime()-cpu
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	metrics.Read(sample)
	b.ReportMetric((sample[0].Value.Float64()-waited)*1e9/float64(b.N), "mutex-wait-ns/op")
	if spinning {
		b.ReportMetric(float64(reads.Load())/elapsed.Seconds(), "reads/s")
	} else {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
	for _, d := range held {
		d.Done()
	}
}
