package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

const waitLimit = testkit.WaitLimit

// natsEnv is an embedded nats-server and how to reach it.
type natsEnv struct{ *testkit.NATS }

func newNATSEnv(t testing.TB, jetStream, inProc bool) *natsEnv {
	t.Helper()
	return &natsEnv{testkit.StartNATS(t, testkit.NATSOptions{JetStream: jetStream, InProcess: inProc})}
}

func (e *natsEnv) restart(t testing.TB) { e.Restart(t) }

func (e *natsEnv) connect(t testing.TB, name string) *nats.Conn { return e.Connect(t, name) }

func (e *natsEnv) ensureStream(t testing.TB, nc *nats.Conn, ns, pool string) {
	t.Helper()
	e.ensureStreamOn(t, nc, ns, pool, jetstream.FileStorage)
}

func (e *natsEnv) ensureStreamOn(t testing.TB, nc *nats.Conn, ns, pool string, storage jetstream.StorageType) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Namespace: ns, Pool: pool, Storage: storage}); err != nil {
		t.Fatal(err)
	}
}

// runConsumer starts c.Run and registers a cleanup that stops it and
// checks that it returned nil.
func runConsumer(t testing.TB, c *Consumer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v", err)
				}
			case <-time.After(waitLimit):
				t.Error("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	testkit.WaitFor(t, "consumer connected", func() error {
		if !c.Connected() {
			return errors.New("c.Connected() is false")
		}
		return nil
	})
	return stop
}

func newTestConsumer(t testing.TB, nc *nats.Conn, opts Options, sink events.Sink) *Consumer {
	t.Helper()
	c, err := New(nc, opts, sink, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// call is one Sink call as recorded: what a Sink would keep, copied.
type call struct {
	op     string // "apply", "uncertain", "restart"
	stream events.Stream
	origin events.Origin // apply
	reason events.Reason // uncertain
	batch  events.Batch  // apply, deep copy
}

func (c call) String() string {
	switch c.op {
	case "apply":
		return fmt.Sprintf("apply %s seq=%d inst=%s", c.stream, c.origin.Seq, c.origin.Instance)
	case "uncertain":
		return fmt.Sprintf("uncertain %s %s", c.stream, c.reason)
	}
	return fmt.Sprintf("%s %s", c.op, c.stream)
}

// sinkRecorder is a Sink that copies everything it receives, for tests.
type sinkRecorder struct {
	mu    sync.Mutex
	calls []call
	// block, when set, is waited on inside Apply: a sink that cannot keep up.
	block chan struct{}
}

var _ events.Sink = (*sinkRecorder)(nil)

func (r *sinkRecorder) Apply(o events.Origin, b *events.Batch) {
	if r.block != nil {
		<-r.block
	}
	cp := events.Batch{TS: b.TS, DPRank: b.DPRank, HasDPRank: b.HasDPRank, Skipped: b.Skipped}
	for _, e := range b.Events {
		e.BlockHashes = slices.Clone(e.BlockHashes)
		e.TokenIDs = slices.Clone(e.TokenIDs)
		e.ExtraKeys = slices.Clone(e.ExtraKeys)
		cp.Events = append(cp.Events, e)
	}
	r.add(call{op: "apply", stream: o.Stream, origin: o, batch: cp})
}

func (r *sinkRecorder) Uncertain(s events.Stream, why events.Reason) {
	r.add(call{op: "uncertain", stream: s, reason: why})
}

func (r *sinkRecorder) Restart(s events.Stream) { r.add(call{op: "restart", stream: s}) }

func (r *sinkRecorder) add(c call) {
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
}

func (r *sinkRecorder) snapshot() []call {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.calls)
}

// of returns the calls concerning one stream, in order.
func (r *sinkRecorder) of(s events.Stream) []call {
	var out []call
	for _, c := range r.snapshot() {
		if c.stream == s {
			out = append(out, c)
		}
	}
	return out
}

// count returns how many calls match.
func (r *sinkRecorder) count(match func(call) bool) int {
	n := 0
	for _, c := range r.snapshot() {
		if match(c) {
			n++
		}
	}
	return n
}

// testBatch is a realistic batch whose block hashes encode (stream id, seq),
// so a test can tell that the payload it received is the one the headers
// describe.
func testBatch(id int, seq uint64, blocks, blockSize int) *events.Batch {
	e := events.Event{Kind: events.KindBlockStored, BlockSize: blockSize, Medium: events.TierGPU}
	for i := range blocks {
		e.BlockHashes = append(e.BlockHashes, marker(id, seq, i))
	}
	for i := range blocks * blockSize {
		e.TokenIDs = append(e.TokenIDs, uint32(i))
	}
	if seq > 0 {
		e.ParentHash, e.HasParent = marker(id, seq-1, blocks-1), true
	}
	return &events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, HasDPRank: true, Events: []events.Event{e}}
}

func marker(id int, seq uint64, i int) uint64 { return uint64(id)<<40 | seq<<8 | uint64(i&0xff) }

func encodeBatch(t testing.TB, b *events.Batch) []byte {
	t.Helper()
	data, err := events.AppendBatch(nil, b, events.EncodingArray)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return data
}

func testOrigin(id int, seq uint64, instance string) events.Origin {
	return events.Origin{
		Stream:    events.Stream{Endpoint: fmt.Sprintf("10.0.%d.%d:8000", id/250, id%250+1)},
		Pod:       fmt.Sprintf("vllm-%d", id),
		Model:     "llama",
		Instance:  instance,
		BlockSize: 16,
		Seq:       seq,
	}
}
