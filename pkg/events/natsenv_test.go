package events

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// waitLimit bounds every wait in these tests. It is a deadlock guard, not a
// timing assertion: on a loaded machine things take long, never this long.
const waitLimit = 20 * time.Second

// natsEnv is an embedded nats-server and how to reach it.
type natsEnv struct {
	srv    *server.Server
	port   int
	dir    string // JetStream store, kept across restarts
	inProc bool   // connect in-process rather than over TCP
}

// startNATS starts an embedded server on 127.0.0.1 (port 0 picks one), with
// JetStream when dir is set.
func startNATS(t testing.TB, port int, dir string) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:                  "127.0.0.1",
		Port:                  port,
		NoLog:                 true,
		NoSigs:                true,
		MaxPayload:            8 << 20,
		DisableShortFirstPing: true,
	}
	if port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	if dir != "" {
		opts.JetStream = true
		opts.StoreDir = dir
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("new nats server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(waitLimit) {
		t.Fatal("nats server not ready")
	}
	return s
}

func newNATSEnv(t testing.TB, jetStream, inProc bool) *natsEnv {
	t.Helper()
	e := &natsEnv{inProc: inProc}
	if jetStream {
		e.dir = t.TempDir()
	}
	e.srv = startNATS(t, 0, e.dir)
	e.port = e.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(func() { e.srv.Shutdown(); e.srv.WaitForShutdown() })
	return e
}

// restart shuts the server down and starts a new one on the same port and
// store, as a NATS pod restart would.
func (e *natsEnv) restart(t testing.TB) {
	t.Helper()
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	e.srv = startNATS(t, e.port, e.dir)
}

func (e *natsEnv) connect(t testing.TB, name string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		// The default handler prints slow-consumer errors to stderr.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	}
	url := fmt.Sprintf("nats://127.0.0.1:%d", e.port)
	if e.inProc {
		opts = append(opts, nats.InProcessServer(e.srv))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

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
	if _, err := EnsureStream(ctx, js, StreamConfig{Namespace: ns, Pool: pool, Storage: storage}); err != nil {
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
	waitUntil(t, "consumer connected", c.Connected)
	return stop
}

func newTestConsumer(t testing.TB, nc *nats.Conn, opts ConsumerOptions, sink Sink) *Consumer {
	t.Helper()
	c, err := NewConsumer(nc, opts, sink, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// call is one Sink call as recorded: what a Sink would keep, copied.
type call struct {
	op     string // "apply", "uncertain", "restart"
	stream Stream
	origin Origin // apply
	reason Reason // uncertain
	batch  Batch  // apply, deep copy
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

var _ Sink = (*sinkRecorder)(nil)

func (r *sinkRecorder) Apply(o Origin, b *Batch) {
	if r.block != nil {
		<-r.block
	}
	cp := Batch{TS: b.TS, DPRank: b.DPRank, HasDPRank: b.HasDPRank, Skipped: b.Skipped}
	for _, e := range b.Events {
		e.BlockHashes = slices.Clone(e.BlockHashes)
		e.TokenIDs = slices.Clone(e.TokenIDs)
		e.ExtraKeys = slices.Clone(e.ExtraKeys)
		cp.Events = append(cp.Events, e)
	}
	r.add(call{op: "apply", stream: o.Stream, origin: o, batch: cp})
}

func (r *sinkRecorder) Uncertain(s Stream, why Reason) {
	r.add(call{op: "uncertain", stream: s, reason: why})
}

func (r *sinkRecorder) Restart(s Stream) { r.add(call{op: "restart", stream: s}) }

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
func (r *sinkRecorder) of(s Stream) []call {
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
func testBatch(id int, seq uint64, blocks, blockSize int) *Batch {
	e := Event{Kind: KindBlockStored, BlockSize: blockSize, Medium: TierGPU}
	for i := range blocks {
		e.BlockHashes = append(e.BlockHashes, marker(id, seq, i))
	}
	for i := range blocks * blockSize {
		e.TokenIDs = append(e.TokenIDs, uint32(i))
	}
	if seq > 0 {
		e.ParentHash, e.HasParent = marker(id, seq-1, blocks-1), true
	}
	return &Batch{TS: float64(time.Now().UnixNano()) / 1e9, HasDPRank: true, Events: []Event{e}}
}

func marker(id int, seq uint64, i int) uint64 { return uint64(id)<<40 | seq<<8 | uint64(i&0xff) }

func encodeBatch(t testing.TB, b *Batch) []byte {
	t.Helper()
	data, err := AppendBatch(nil, b, EncodingArray)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return data
}

func testOrigin(id int, seq uint64, instance string) Origin {
	return Origin{
		Stream:    Stream{Endpoint: fmt.Sprintf("10.0.%d.%d:8000", id/250, id%250+1)},
		Pod:       fmt.Sprintf("vllm-%d", id),
		Model:     "llama",
		Instance:  instance,
		BlockSize: 16,
		Seq:       seq,
	}
}
