package consumer

import (
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvroute/kvroute/pkg/events"
)

// Realistic batches: vLLM's default block size, and one stored run of 32
// blocks (a 512-token prompt chunk) per engine step.
const (
	benchBlockSize = 16
	benchBlocks    = 32
	benchStreams   = 16
)

// countingSink counts what it is given and calls onApply, the least a sink
// can do, so the benchmark measures the path up to the sink.
type countingSink struct {
	batches, blocks atomic.Int64
	onApply         func(o events.Origin)
}

func (s *countingSink) Apply(o events.Origin, b *events.Batch) {
	s.blocks.Add(int64(b.Blocks()))
	s.batches.Add(1)
	if s.onApply != nil {
		s.onApply(o)
	}
}
func (s *countingSink) Uncertain(events.Stream, events.Reason) {}
func (s *countingSink) Restart(events.Stream)                  {}

type benchMode struct {
	name      string
	jetStream bool
	storage   jetstream.StorageType
}

var benchModes = []benchMode{
	{"core", false, 0},
	{"jetstream-file", true, jetstream.FileStorage},
	{"jetstream-memory", true, jetstream.MemoryStorage},
}

type benchRig struct {
	pub      *events.Publisher
	pubConn  *nats.Conn
	payloads [][]byte
}

// newBenchRig starts a server (TCP, as in production), a consumer on its
// own connection, and a publisher on another.
func newBenchRig(b *testing.B, m benchMode, sink events.Sink) *benchRig {
	b.Helper()
	jetStream := m.jetStream
	env := newNATSEnv(b, jetStream, false)
	nc := env.connect(b, "consumer")
	if jetStream {
		env.ensureStreamOn(b, nc, "ns", "pool", m.storage)
	}
	// Every batch is held to its subject's pod, as in the EPP.
	pods := map[string]string{}
	for id := range benchStreams {
		o := testOrigin(id, 0, "")
		pods[o.Endpoint] = o.Pod
	}
	members := MembershipFunc(func(addr string) (string, bool) { p, ok := pods[addr]; return p, ok })
	c, err := New(nc, Options{Namespace: "ns", Pool: "pool", JetStream: jetStream, Membership: members}, sink, nil)
	if err != nil {
		b.Fatal(err)
	}
	runConsumer(b, c)
	r := &benchRig{pubConn: env.connect(b, "publisher")}
	r.pub = events.NewPublisher(r.pubConn, "ns", "pool")
	for id := range benchStreams {
		r.payloads = append(r.payloads, encodeBatch(b, testBatch(id, 1, benchBlocks, benchBlockSize)))
	}
	return r
}

// BenchmarkConsumerThroughput publishes as fast as the consumer keeps up
// (bounded in flight, so core NATS never drops) and reports the rate at
// which blocks reach the sink. One op is one batch of 32 blocks.
func BenchmarkConsumerThroughput(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.name, func(b *testing.B) {
			sink := &countingSink{}
			r := newBenchRig(b, mode, sink)
			const inFlight = 2048
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				for int64(i)-sink.batches.Load() > inFlight {
					time.Sleep(50 * time.Microsecond)
				}
				id := i % benchStreams
				o := testOrigin(id, uint64(i/benchStreams), "i")
				if err := r.pub.Publish(o, r.payloads[id]); err != nil {
					b.Fatal(err)
				}
			}
			if err := r.pubConn.Flush(); err != nil {
				b.Fatal(err)
			}
			for sink.batches.Load() < int64(b.N) {
				time.Sleep(50 * time.Microsecond)
			}
			elapsed := time.Since(start)
			b.StopTimer()
			blocks := float64(sink.blocks.Load())
			b.ReportMetric(blocks/elapsed.Seconds(), "blocks/s")
			b.ReportMetric(float64(elapsed.Nanoseconds())/blocks, "ns/block")
		})
	}
}

// BenchmarkConsumerLag publishes at a steady 2000 batches/s (64k blocks/s)
// over 16 streams and reports publish-to-Apply latency percentiles. The
// budget for event-to-index freshness is p99 ≤ 5 ms.
func BenchmarkConsumerLag(b *testing.B) {
	for _, mode := range benchModes {
		b.Run(mode.name, func(b *testing.B) {
			// The first batches pay for connection and consumer start-up;
			// they are published and applied first, then left out.
			const warm = 512
			n := warm + b.N
			pubAt := make([]atomic.Int64, n)
			lag := make([]atomic.Int64, n)
			var done atomic.Int64
			// A batch's index is seq*streams + stream id, so the sink can
			// find its publish time from the origin.
			sink := &countingSink{}
			ids := map[string]int{}
			for id := range benchStreams {
				ids[testOrigin(id, 0, "").Endpoint] = id
			}
			sink.onApply = func(o events.Origin) {
				i := int(o.Seq)*benchStreams + ids[o.Endpoint]
				if i < len(lag) {
					lag[i].Store(time.Now().UnixNano() - pubAt[i].Load())
					done.Add(1)
				}
			}
			r := newBenchRig(b, mode, sink)
			const interval = 500 * time.Microsecond
			publish := func(from, to int) {
				start := time.Now()
				for i := from; i < to; i++ {
					if d := time.Until(start.Add(time.Duration(i-from) * interval)); d > 0 {
						time.Sleep(d)
					}
					id := i % benchStreams
					o := testOrigin(id, uint64(i/benchStreams), "i")
					pubAt[i].Store(time.Now().UnixNano())
					if err := r.pub.Publish(o, r.payloads[id]); err != nil {
						b.Fatal(err)
					}
				}
				deadline := time.Now().Add(waitLimit)
				for done.Load() < int64(to) && time.Now().Before(deadline) {
					time.Sleep(100 * time.Microsecond)
				}
				if got := done.Load(); got < int64(to) {
					b.Fatalf("%d of %d batches applied", got, to)
				}
			}
			publish(0, warm)
			b.ResetTimer()
			publish(warm, n)
			b.StopTimer()
			lags := make([]int64, b.N)
			for i := range lags {
				lags[i] = lag[warm+i].Load()
			}
			slices.Sort(lags)
			pct := func(p float64) float64 { return float64(lags[int(p*float64(len(lags)-1))]) / 1e3 }
			b.ReportMetric(0, "ns/op") // paced, so time per op says nothing
			b.ReportMetric(pct(0.50), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
			b.ReportMetric(float64(lags[len(lags)-1])/1e3, "max-µs")
		})
	}
}

// BenchmarkWorkerHandle measures the consumer's own share of ingest, with
// no network: sequence tracking, decoding, metrics and a counting sink.
func BenchmarkWorkerHandle(b *testing.B) {
	sink := &countingSink{}
	env := newNATSEnv(b, false, true)
	c, err := New(env.connect(b, "c"), Options{Namespace: "ns", Pool: "pool"}, sink, nil)
	if err != nil {
		b.Fatal(err)
	}
	w := &worker{c: c, streams: map[events.Stream]*seqState{}}
	payloads := make([][]byte, benchStreams)
	origins := make([]events.Origin, benchStreams)
	for id := range benchStreams {
		payloads[id] = encodeBatch(b, testBatch(id, 1, benchBlocks, benchBlockSize))
		origins[id] = testOrigin(id, 0, "i")
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		id := i % benchStreams
		origins[id].Seq = uint64(i / benchStreams)
		w.handle(item{origin: origins[id], data: payloads[id], recv: now})
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(sink.blocks.Load()), "ns/block")
	b.ReportMetric(float64(sink.blocks.Load())/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkAdmit is what holding one message to its subject's pod costs
// on the NATS delivery goroutine, in a pool of 256 endpoints.
func BenchmarkAdmit(b *testing.B) {
	const endpoints = 256
	pods := map[string]string{}
	origins := make([]events.Origin, endpoints)
	subjects := make([]string, endpoints)
	for i := range origins {
		origins[i] = testOrigin(i, 0, "i")
		pods[origins[i].Endpoint] = origins[i].Pod
		subjects[i] = events.Subject("ns", "pool", origins[i].Pod)
	}
	a := newAdmitter(MembershipFunc(func(addr string) (string, bool) { p, ok := pods[addr]; return p, ok }), DefaultMaxRanksPerEndpoint, time.Hour)
	now := time.Now()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o := origins[i%endpoints]
		if r := a.admit(subjects[i%endpoints], &o, now); r != admitted {
			b.Fatal(rejectionNames[r])
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/message")
}
