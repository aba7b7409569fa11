package relay

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// Realistic batches: vLLM's default block size, 32 blocks per event.
const (
	benchBlockSize = 16
	benchPerEvent  = 32
)

// BenchmarkRelayThroughput measures batches from a ZeroMQ publisher,
// through the relay (framing, decode, mirror, buffer), to a NATS
// subscriber on a real server, all on loopback.
func BenchmarkRelayThroughput(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := startNATS(b, natsembed.Options{})
	defer ns.Shutdown()
	sc, err := nats.Connect(ns.ClientURL(), quietNATS)
	if err != nil {
		b.Fatal(err)
	}
	defer sc.Close()
	var got atomic.Int64
	last := make(chan struct{}, 1)
	want := int64(0)
	sub, err := sc.Subscribe(events.PoolSubject(testNamespace, testPool), func(m *nats.Msg) {
		if got.Add(1) == atomic.LoadInt64(&want) {
			last <- struct{}{}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	_ = sc.Flush()
	eng := newEngine(b, ctx)
	cfg := baseConfig()
	cfg.MirrorMaxBlocks = 1 << 20
	r := startRelay(b, cfg, ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		b.Fatal(err)
	}
	eng.waitSubscribed(b)
	bm := newBatchMaker(1, benchBlockSize, benchPerEvent)
	const distinct = 512
	payloads := make([][]byte, distinct)
	blocks := 0
	for i := range payloads {
		bt := bm.batch()
		blocks += bt.Blocks()
		payloads[i], _ = events.AppendBatch(nil, bt, events.EncodingArray)
	}
	blocksPerBatch := float64(blocks) / distinct

	atomic.StoreInt64(&want, int64(b.N))
	b.ResetTimer()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		eng.send(b, uint64(i), payloads[i%distinct], true)
	}
	select {
	case <-last:
	case <-time.After(time.Minute):
		b.Fatalf("subscriber got %d of %d batches (lost %v)", got.Load(), b.N, value(r.m.lostBatches))
	}
	elapsed := time.Since(start).Seconds()
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed, "batches/s")
	b.ReportMetric(float64(b.N)*blocksPerBatch/elapsed, "blocks/s")
}

// buildMirror fills a mirror with about n held blocks in chains of 32
// (some tails removed, leaving ghosts), with a CPU copy of every fourth run.
func buildMirror(tb testing.TB, n int) *Mirror {
	tb.Helper()
	m := NewMirror(0)
	m.Reset("bench")
	bm := newBatchMaker(2, benchBlockSize, benchPerEvent)
	var d events.Decoder
	var bt events.Batch
	for seq := uint64(0); ; seq++ {
		if held, _, _ := m.Counts(); held >= n {
			return m
		}
		data, err := events.AppendBatch(nil, bm.batch(), events.EncodingArray)
		if err != nil {
			tb.Fatal(err)
		}
		if err := d.Decode(data, &bt); err != nil {
			tb.Fatal(err)
		}
		m.Apply(seq, &bt, benchBlockSize, 0)
	}
}

// BenchmarkSnapshot measures producing (capturing and encoding) the
// snapshot of a mirror of 100k held blocks.
func BenchmarkSnapshot(b *testing.B) {
	m := buildMirror(b, 100_000)
	held, ghost, _ := m.Counts()
	var s *Snapshot
	var err error
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if s, err = m.Snapshot(0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	size := 0
	for _, c := range s.Chunks {
		size += len(c)
	}
	b.ReportMetric(float64(held), "held-blocks")
	b.ReportMetric(float64(ghost), "ghost-blocks")
	b.ReportMetric(float64(size), "bytes/snapshot")
	b.ReportMetric(float64(len(s.Chunks)), "chunks")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(held), "ns/block")
}

// BenchmarkMirrorApply measures what the relay does per batch besides
// moving bytes: decode it and apply it to the mirror.
func BenchmarkMirrorApply(b *testing.B) {
	bm := newBatchMaker(3, benchBlockSize, benchPerEvent)
	const distinct = 1024
	payloads := make([][]byte, distinct)
	blocks := 0
	for i := range payloads {
		bt := bm.batch()
		blocks += bt.Blocks()
		payloads[i], _ = events.AppendBatch(nil, bt, events.EncodingArray)
	}
	m := NewMirror(1 << 16)
	m.Reset("bench")
	var d events.Decoder
	var bt events.Batch
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := d.Decode(payloads[i%distinct], &bt); err != nil {
			b.Fatal(err)
		}
		m.Apply(uint64(i), &bt, benchBlockSize, 0)
	}
	perBatch := float64(blocks) / distinct
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/(float64(b.N)*perBatch), "ns/block")
	b.ReportMetric(float64(b.N)*perBatch/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkSnapshotLock measures how long a snapshot holds the mirror's
// lock, which is how long it can delay the relay, at 100k held blocks; and
// what the mirror costs in memory per block.
func BenchmarkSnapshotLock(b *testing.B) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := buildMirror(b, 100_000)
	runtime.GC()
	runtime.ReadMemStats(&after)
	held, ghost, _ := m.Counts()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := m.capture(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(held+ghost), "bytes/block")
	runtime.KeepAlive(m)
}

// BenchmarkCheckpoint measures writing the checkpoint of a mirror of 100k
// held blocks to the state directory (capture, encode, write, sync,
// rename), and the journal's cost per batch beside it.
func BenchmarkCheckpoint(b *testing.B) {
	m := buildMirror(b, 100_000)
	held, _, _ := m.Counts()
	met, _ := newMetrics(nil)
	s := newTestStore(b, b.TempDir(), met)
	if _, err := s.load(NewMirror(0)); err != nil {
		b.Fatal(err)
	}
	cpu0 := testkit.CPUTime()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.gen++
		if err := s.writeSync(m, 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu := testkit.CPUTime() - cpu0
	fi, err := os.Stat(filepath.Join(s.dir, checkpointFile))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(fi.Size()), "bytes/checkpoint")
	b.ReportMetric(float64(fi.Size())/float64(held), "bytes/block")
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/checkpoint")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/checkpoint")
}

// BenchmarkJournal measures journalling one batch (32 blocks of 16
// tokens), what the relay pays per batch to survive its own restart.
func BenchmarkJournal(b *testing.B) {
	met, _ := newMetrics(nil)
	s := newTestStore(b, b.TempDir(), met)
	s.journalMax = 1 << 62
	if _, err := s.load(NewMirror(0)); err != nil {
		b.Fatal(err)
	}
	bm := newBatchMaker(3, benchBlockSize, benchPerEvent)
	payload, err := events.AppendBatch(nil, bm.batch(), events.EncodingArray)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s.appendBatch(uint64(i), benchBlockSize, 0, payload)
	}
	b.StopTimer()
	if s.broken {
		b.Fatal("the journal broke")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/batch")
}
