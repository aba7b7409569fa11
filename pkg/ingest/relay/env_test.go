package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// waitLimit bounds every wait in these tests. It guards against deadlock;
// it is not a timing assertion.
const waitLimit = 20 * time.Second

const (
	testNamespace = "ns"
	testPool      = "pool"
	testPod       = "vllm-0"
	testTopic     = "kv@10.0.0.7:8000@llama"
)

// quietNATS keeps the client's prints about connections the tests break
// on purpose out of the test output.
var quietNATS = nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})

func startNATS(t testing.TB, o natsembed.Options) *natsembed.Server {
	t.Helper()
	s, err := natsembed.Start(o)
	if err != nil {
		t.Fatalf("start nats: %v", err)
	}
	return s
}

func natsPort(s *natsembed.Server) int { return s.Addr().(*net.TCPAddr).Port }

// freePort finds a loopback port for a server that must come back on the
// same port after a restart.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// collector subscribes to the pool's subjects and keeps the batches that
// arrive, and the heartbeats apart.
type collector struct {
	mu    sync.Mutex
	msgs  []*nats.Msg
	beats []*nats.Msg
	more  chan struct{}
}

func collect(t testing.TB, url string) *collector {
	t.Helper()
	nc, err := nats.Connect(url, quietNATS)
	if err != nil {
		t.Fatalf("collector connect: %v", err)
	}
	t.Cleanup(nc.Close)
	c := &collector{more: make(chan struct{}, 1)}
	if _, err := nc.Subscribe(events.PoolSubject(testNamespace, testPool), c.add); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *collector) add(m *nats.Msg) {
	c.mu.Lock()
	if events.IsHeartbeat(m.Header) {
		c.beats = append(c.beats, m)
	} else {
		c.msgs = append(c.msgs, m)
	}
	c.mu.Unlock()
	select {
	case c.more <- struct{}{}:
	default:
	}
}

// wait returns once n messages have arrived.
func (c *collector) wait(t testing.TB, n int) []*nats.Msg {
	t.Helper()
	deadline := time.After(waitLimit)
	for {
		c.mu.Lock()
		got := append([]*nats.Msg(nil), c.msgs...)
		c.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-c.more:
		case <-deadline:
			t.Fatalf("collector has %d messages, want %d", len(got), n)
		}
	}
}

// engine plays a vLLM engine: a ZeroMQ PUB sending [topic, seq, payload],
// and optionally a replay ROUTER over a ring of the batches it made.
type engine struct {
	pub   zmq4.Socket
	topic string
	mu    sync.Mutex
	ring  map[uint64][]byte
	// replayFrom hides from the replay socket every batch before it, as a
	// ring buffer that has moved on would.
	replayFrom uint64
	// topicFrames makes replies [“”, topic, seq, payload], as newer vLLM does.
	topicFrames bool
	router      zmq4.Socket
}

func newEngine(t testing.TB, ctx context.Context) *engine {
	t.Helper()
	e := &engine{pub: zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger())), topic: testTopic, ring: map[uint64][]byte{}}
	t.Cleanup(func() { e.pub.Close() })
	return e
}

// waitSubscribed returns once a subscriber's subscription has reached the
// publisher, before which a PUB drops everything.
func (e *engine) waitSubscribed(t testing.TB) {
	t.Helper()
	testkit.WaitFor(t, "a subscriber to reach the engine's publisher", func() error {
		if seen := len(e.pub.(zmq4.Topics).Topics()); seen <= 0 {
			return fmt.Errorf("len(e.pub.(zmq4.Topics).Topics()) is %v, want > %v", seen, 0)
		}
		return nil
	})
}

// send publishes payload as batch seq; publish false only keeps it for replay.
func (e *engine) send(t testing.TB, seq uint64, payload []byte, publish bool) {
	t.Helper()
	e.mu.Lock()
	e.ring[seq] = payload
	e.mu.Unlock()
	if !publish {
		return
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := e.pub.SendMulti(zmq4.NewMsgFrom([]byte(e.topic), s[:], payload)); err != nil {
		t.Fatalf("engine send %d: %v", seq, err)
	}
}

// serveReplay binds a ROUTER that answers as vLLM's replay socket does.
func (e *engine) serveReplay(t testing.TB, ctx context.Context) string {
	t.Helper()
	e.router = zmq4.NewRouter(ctx, zmq4.WithLogger(quietLogger()))
	if err := e.router.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.router.Close() })
	go func() {
		for {
			msg, err := e.router.Recv()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				continue
			}
			if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
				continue
			}
			id, start := msg.Frames[0], binary.BigEndian.Uint64(msg.Frames[2])
			e.mu.Lock()
			var seqs []uint64
			for s := range e.ring {
				if s >= start && s >= e.replayFrom {
					seqs = append(seqs, s)
				}
			}
			payloads := map[uint64][]byte{}
			for _, s := range seqs {
				payloads[s] = e.ring[s]
			}
			e.mu.Unlock()
			sortU64(seqs)
			reply := func(seq uint64, payload []byte) {
				var b [8]byte
				binary.BigEndian.PutUint64(b[:], seq)
				frames := [][]byte{id, {}, b[:], payload}
				if e.topicFrames {
					frames = [][]byte{id, {}, []byte(e.topic), b[:], payload}
				}
				_ = e.router.SendMulti(zmq4.NewMsgFrom(frames...))
			}
			for _, s := range seqs {
				reply(s, payloads[s])
			}
			reply(math.MaxUint64, []byte{})
		}
	}()
	return "tcp://" + e.router.Addr().String()
}

func sortU64(s []uint64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// batchMaker makes realistic batches: runs of full blocks stored in GPU,
// some removed later, now and then offloaded to CPU.
type batchMaker struct {
	rng       *rand.Rand
	next      uint64
	held      []uint64
	blockSize int
	perEvent  int
}

func newBatchMaker(seed uint64, blockSize, perEvent int) *batchMaker {
	return &batchMaker{rng: rand.New(rand.NewPCG(seed, 1)), next: 1, blockSize: blockSize, perEvent: perEvent}
}

func (bm *batchMaker) batch() *events.Batch {
	b := &events.Batch{TS: 1.5, HasDPRank: true}
	e := events.Event{Kind: events.KindBlockStored, BlockSize: bm.blockSize, Medium: events.TierGPU}
	if len(bm.held) > 0 && bm.rng.IntN(2) == 0 {
		e.ParentHash, e.HasParent = bm.held[len(bm.held)-1], true
	}
	for i := 0; i < bm.perEvent; i++ {
		h := bm.next*0x9e3779b97f4a7c15 | 1
		bm.next++
		e.BlockHashes = append(e.BlockHashes, h)
		for k := 0; k < bm.blockSize; k++ {
			e.TokenIDs = append(e.TokenIDs, uint32(bm.rng.IntN(128000)))
		}
	}
	bm.held = append(bm.held, e.BlockHashes...)
	b.Events = append(b.Events, e)
	if len(bm.held) > 4*bm.perEvent {
		n := bm.perEvent / 2
		b.Events = append(b.Events, events.Event{Kind: events.KindBlockRemoved, BlockHashes: append([]uint64(nil), bm.held[:n]...)})
		bm.held = bm.held[n:]
	}
	if bm.rng.IntN(4) == 0 {
		b.Events = append(b.Events, events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{bm.held[len(bm.held)-1]}, Medium: events.TierCPU})
	}
	return b
}

func (bm *batchMaker) payload(t testing.TB) []byte {
	t.Helper()
	data, err := events.AppendBatch(nil, bm.batch(), events.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// testRelay is a running relay and what the test needs to observe it.
type testRelay struct {
	*Relay
	reg  *prometheus.Registry
	stop func()
}

func baseConfig() Config {
	return Config{
		ZMQEndpoint: "tcp://127.0.0.1:0",
		Topic:       "kv@",
		Namespace:   testNamespace, Pool: testPool, Pod: testPod,
		PodIP: "10.0.0.7", ServingPort: 8000, Model: "llama",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

func startRelay(t testing.TB, cfg Config, natsURL string) *testRelay {
	t.Helper()
	nc, err := DialNATS(NATSOptions{URL: natsURL, ReconnectWait: 20 * time.Millisecond, MaxReconnectWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg.Registerer = reg
	r, err := New(cfg, nc)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay run: %v", err)
				}
			case <-time.After(waitLimit):
				t.Error("relay did not stop")
			}
			nc.Close()
		})
	}
	t.Cleanup(stop)
	tr := &testRelay{Relay: r, reg: reg, stop: stop}
	if !cfg.Connect {
		testkit.WaitFor(t, "the ZeroMQ socket to bind", func() error {
			if r.ZMQAddr() == nil {
				return errors.New("no ZeroMQ address yet")
			}
			return nil
		})
	}
	return tr
}

func (tr *testRelay) zmqEndpoint() string { return "tcp://" + tr.ZMQAddr().String() }

func value(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

// checkRelayed checks that msgs are the engine's payloads for seqs, in
// order and byte for byte, under the contract's headers.
func checkRelayed(t testing.TB, msgs []*nats.Msg, payloads map[uint64][]byte, seqs []uint64) events.Origin {
	t.Helper()
	if len(msgs) != len(seqs) {
		t.Fatalf("got %d messages, want %d", len(msgs), len(seqs))
	}
	var first events.Origin
	for i, m := range msgs {
		o, err := events.ParseOrigin(m.Header)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if i == 0 {
			first = o
		}
		if o.Seq != seqs[i] {
			t.Fatalf("message %d has seq %d, want %d", i, o.Seq, seqs[i])
		}
		if string(m.Data) != string(payloads[o.Seq]) {
			t.Fatalf("seq %d: payload changed on the way", o.Seq)
		}
		if m.Subject != events.Subject(testNamespace, testPool, testPod) {
			t.Fatalf("subject %q", m.Subject)
		}
		if o.Endpoint != "10.0.0.7:8000" || o.Pod != testPod || o.Model != "llama" || o.DPRank != 0 {
			t.Fatalf("seq %d: origin %+v", o.Seq, o)
		}
		if o.Instance != first.Instance {
			t.Fatalf("seq %d: instance %q changed from %q without a restart", o.Seq, o.Instance, first.Instance)
		}
		if o.BlockSize != 16 {
			t.Fatalf("seq %d: block size %d, want 16", o.Seq, o.BlockSize)
		}
	}
	return first
}

func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

// requestSnapshot asks the relay for a snapshot and returns its chunks.
func requestSnapshot(t testing.TB, url string) []*nats.Msg {
	t.Helper()
	nc, err := nats.Connect(url, quietNATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(events.SnapshotSubject(testNamespace, testPool, testPod), inbox, nil); err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for total := -1; total < 0 || len(out) < total; {
		m, err := sub.NextMsg(waitLimit)
		if err != nil {
			t.Fatalf("snapshot chunk %d: %v", len(out), err)
		}
		if e := m.Header.Get(events.HeaderSnapshotError); e != "" {
			return []*nats.Msg{m}
		}
		n, err := strconv.Atoi(m.Header.Get(events.HeaderSnapshotChunks))
		if err != nil {
			t.Fatalf("chunk without a chunk count: %v", m.Header)
		}
		total = n
		out = append(out, m)
	}
	return out
}

func zmqMsg(frames ...[]byte) zmq4.Msg { return zmq4.NewMsgFrom(frames...) }
