package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

func TestRelayCarriesBatchesUnchangedInOrder(t *testing.T) {
	t.Parallel()
	for _, connect := range []bool{false, true} {
		name := "when the relay binds and the engine dials"
		if connect {
			name = "when the engine binds and the relay dials"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ns := startNATS(t, natsembed.Options{})
			defer ns.Shutdown()
			col := collect(t, ns.ClientURL())
			eng := newEngine(t, ctx)
			cfg := baseConfig()
			if connect {
				if err := eng.pub.Listen("tcp://127.0.0.1:0"); err != nil {
					t.Fatal(err)
				}
				cfg.Connect, cfg.ZMQEndpoint = true, "tcp://"+eng.pub.Addr().String()
			}
			r := startRelay(t, cfg, ns.ClientURL())
			if !connect {
				if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
					t.Fatal(err)
				}
			}
			eng.waitSubscribed(t)
			bm := newBatchMaker(1, 16, 32)
			payloads := map[uint64][]byte{}
			for seq := uint64(0); seq < 50; seq++ {
				payloads[seq] = bm.payload(t)
				eng.send(t, seq, payloads[seq], true)
			}
			checkRelayed(t, col.wait(t, 50), payloads, seqRange(0, 50))
			testkit.WaitFor(t, "the readiness", func() error {
				if !r.Ready() {
					return errors.New("r.Ready() is false")
				}
				return nil
			})
			if got := value(r.m.batchesOut); got != 50 {
				t.Fatalf("batches_out_total %v, want 50", got)
			}
			if got := value(r.m.decodeErrors) + value(r.m.gapsUnfilled) + value(r.m.restarts); got != 0 {
				t.Fatalf("decode errors, gaps and restarts sum to %v on a clean stream", got)
			}
		})
	}
}

func TestRelayFillsGapsFromTheReplaySocket(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		replay      bool
		replayFrom  uint64
		topicFrames bool
		want        []uint64
		filled      float64
		lost        float64
	}{
		{name: "a gap the replay buffer still holds is filled in order", replay: true, want: seqRange(0, 30), filled: 1},
		{name: "replies that name their topic are understood", replay: true, topicFrames: true, want: seqRange(0, 30), filled: 1},
		{name: "a replay that starts later than asked leaves the rest a gap", replay: true, replayFrom: 15, want: append(seqRange(0, 10), seqRange(15, 30)...), lost: 5},
		{name: "without a replay socket the gap is only counted", want: append(seqRange(0, 10), seqRange(20, 30)...), lost: 10},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ns := startNATS(t, natsembed.Options{})
			defer ns.Shutdown()
			col := collect(t, ns.ClientURL())
			eng := newEngine(t, ctx)
			eng.replayFrom, eng.topicFrames = tc.replayFrom, tc.topicFrames
			cfg := baseConfig()
			if tc.replay {
				cfg.ReplayEndpoint = eng.serveReplay(t, ctx)
			}
			r := startRelay(t, cfg, ns.ClientURL())
			if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
				t.Fatal(err)
			}
			eng.waitSubscribed(t)
			bm := newBatchMaker(2, 16, 8)
			payloads := map[uint64][]byte{}
			for seq := uint64(0); seq < 30; seq++ {
				payloads[seq] = bm.payload(t)
				eng.send(t, seq, payloads[seq], seq < 10 || seq >= 20)
			}
			checkRelayed(t, col.wait(t, len(tc.want)), payloads, tc.want)
			if got := value(r.m.gapsFilled); got != tc.filled {
				t.Errorf("gaps_filled_total %v, want %v", got, tc.filled)
			}
			if got := value(r.m.lostBatches); got != tc.lost {
				t.Errorf("lost_batches_total %v, want %v", got, tc.lost)
			}
			if got, want := value(r.m.gapsUnfilled) > 0, tc.lost > 0; got != want {
				t.Errorf("gaps_unfilled_total %v, want a gap counted: %v", value(r.m.gapsUnfilled), want)
			}
			if got, want := r.Mirror().Position().Exact, tc.lost == 0; got != want {
				t.Errorf("mirror exact %v, want %v", got, want)
			}
		})
	}
}

func TestRelayStartsANewInstanceWhenTheEngineRestarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	col := collect(t, ns.ClientURL())
	eng := newEngine(t, ctx)
	r := startRelay(t, baseConfig(), ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	before, after := newBatchMaker(3, 16, 8), newBatchMaker(4, 16, 8)
	ref := reference{}
	for seq := uint64(0); seq < 10; seq++ {
		eng.send(t, seq, before.payload(t), true)
	}
	col.wait(t, 10)
	for seq := uint64(0); seq < 5; seq++ {
		b, data := wire(t, after.batch())
		ref.apply(b, 16)
		eng.send(t, seq, data, true)
	}
	msgs := col.wait(t, 15)
	first, _ := events.ParseOrigin(msgs[0].Header)
	for i, m := range msgs {
		o, _ := events.ParseOrigin(m.Header)
		if restarted := i >= 10; restarted == (o.Instance == first.Instance) {
			t.Fatalf("message %d (seq %d) has instance %q; the first had %q", i, o.Seq, o.Instance, first.Instance)
		}
	}
	if got := value(r.m.restarts); got != 1 {
		t.Fatalf("engine_restarts_total %v, want 1", got)
	}
	if got, want := r.Mirror().heldView(), ref.view(); !reflect.DeepEqual(got, want) {
		t.Fatalf("the mirror holds %d blocks after the restart, the new engine %d", len(got), len(want))
	}
	if p := r.Mirror().Position(); !p.Exact || p.Seq != 4 {
		t.Fatalf("mirror position %+v, want exact at seq 4", p)
	}
}

// engineThatLeft is a relay dialling an engine that binds, after five
// batches relayed and the engine's publisher closed: what comes back at
// its endpoint is up to the test.
type engineThatLeft struct {
	eng *engine
	ep  string
	r   *testRelay
	col *collector
}

func relayWhoseEngineLeft(t *testing.T, ctx context.Context, replay bool, bm *batchMaker) engineThatLeft {
	t.Helper()
	ns := startNATS(t, natsembed.Options{})
	t.Cleanup(ns.Shutdown)
	l := engineThatLeft{col: collect(t, ns.ClientURL()), eng: newEngine(t, ctx)}
	if err := l.eng.pub.Listen("tcp://127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	l.ep = "tcp://" + l.eng.pub.Addr().String()
	cfg := baseConfig()
	cfg.Connect, cfg.ZMQEndpoint = true, l.ep
	if replay {
		cfg.ReplayEndpoint = l.eng.serveReplay(t, ctx)
	}
	l.r = startRelay(t, cfg, ns.ClientURL())
	l.eng.waitSubscribed(t)
	for seq := uint64(0); seq < 5; seq++ {
		l.eng.send(t, seq, bm.payload(t), true)
	}
	l.col.wait(t, 5)
	l.eng.pub.Close()
	testkit.WaitFor(t, "the relay to notice the engine left", func() error {
		if l.r.Ready() {
			return errors.New("l.r.Ready() is still true")
		}
		return nil
	})
	return l
}

// rebind binds a new publisher at the engine's endpoint and waits for the
// relay to subscribe to it.
func (l engineThatLeft) rebind(t *testing.T, ctx context.Context) {
	t.Helper()
	l.eng.pub = newEngine(t, ctx).pub
	if err := l.eng.pub.Listen(l.ep); err != nil {
		t.Fatal(err)
	}
	l.eng.waitSubscribed(t)
}

func TestRelayRedialsAnEngineThatBindsAndRestarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bm := newBatchMaker(10, 16, 8)
	l := relayWhoseEngineLeft(t, ctx, false, bm)
	l.rebind(t, ctx)
	for seq := uint64(0); seq < 3; seq++ {
		l.eng.send(t, seq, bm.payload(t), true)
	}
	msgs := l.col.wait(t, 8)
	a, _ := events.ParseOrigin(msgs[4].Header)
	b, _ := events.ParseOrigin(msgs[5].Header)
	if a.Instance == b.Instance || b.Seq != 0 {
		t.Fatalf("after the engine came back: seq %d, instance %q (was %q)", b.Seq, b.Instance, a.Instance)
	}
	if got := value(l.r.m.restarts); got != 1 {
		t.Fatalf("engine_restarts_total %v, want 1", got)
	}
}

// An engine on its way down can accept the relay's connection and close it
// before the ZMTP handshake is done. The ZeroMQ dialer gives up on such a
// connection rather than retry it; the relay must dial again, not stop
// reading its engine.
func TestRelayRedialsAfterAHandshakeTheEngineCutShort(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	col := collect(t, ns.ClientURL())
	cutter, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ep := "tcp://" + cutter.Addr().String()
	cut := make(chan struct{}, 16)
	go func() {
		for {
			c, err := cutter.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
			select {
			case cut <- struct{}{}:
			default:
			}
		}
	}()
	cfg := baseConfig()
	cfg.Connect, cfg.ZMQEndpoint = true, ep
	r := startRelay(t, cfg, ns.ClientURL())
	for range 2 {
		select {
		case <-cut:
		case <-time.After(waitLimit):
			t.Fatal("the relay never dialled")
		}
	}
	_ = cutter.Close()
	eng := newEngine(t, ctx)
	if err := eng.pub.Listen(ep); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(10, 16, 8)
	eng.send(t, 0, bm.payload(t), true)
	col.wait(t, 1)
	if !r.Ready() {
		t.Fatal("the relay relays but does not say it is connected")
	}
}

// An engine that restarts and publishes as many batches before the relay
// reconnects as the old one had relayed hands the relay a seq that follows
// on from the last one. Only the replay ring can say whether it is the same
// engine; without that word the relay takes it for a new one, which can
// only under-claim.
func TestRelayTellsARestartFromAReconnectWhenTheSeqFollowsOn(t *testing.T) {
	for _, tc := range []struct {
		name            string
		replay, restart bool
		wantState       string
	}{
		{name: "restarted, the ring holds another batch", replay: true, restart: true, wantState: events.SnapshotExact},
		{name: "restarted, no replay socket", restart: true, wantState: events.SnapshotPartial},
		{name: "the same engine, reconnected", replay: true, wantState: events.SnapshotExact},
		{name: "reconnected, no replay socket", wantState: events.SnapshotPartial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			bm := newBatchMaker(10, 16, 8)
			l := relayWhoseEngineLeft(t, ctx, tc.replay, bm)
			ref := reference{}
			next := bm.payload
			if tc.restart {
				// The new engine's first five batches went by before the
				// relay was back: they are in its ring only.
				l.eng.mu.Lock()
				l.eng.ring = map[uint64][]byte{}
				l.eng.mu.Unlock()
				after := newBatchMaker(11, 16, 8)
				next = func(t testing.TB) []byte {
					b, data := wire(t, after.batch())
					ref.apply(b, 16)
					return data
				}
				for seq := uint64(0); seq < 5; seq++ {
					l.eng.send(t, seq, next(t), false)
				}
			}
			l.rebind(t, ctx)
			l.eng.send(t, 5, next(t), true)

			want := 6
			if tc.restart && tc.replay {
				want = 11 // the new engine's 0..4 from its ring, then 5
			}
			msgs := l.col.wait(t, want)
			a, _ := events.ParseOrigin(msgs[4].Header)
			b, _ := events.ParseOrigin(msgs[len(msgs)-1].Header)
			newInstance := tc.restart || !tc.replay
			if newInstance == (a.Instance == b.Instance) || b.Seq != 5 {
				t.Fatalf("after the reconnect: seq %d, instance %q (was %q); a new one wanted: %v", b.Seq, b.Instance, a.Instance, newInstance)
			}
			wantRestarts := 0.0
			if newInstance {
				wantRestarts = 1
			}
			if got := value(l.r.m.restarts); got != wantRestarts {
				t.Fatalf("engine_restarts_total %v, want %v", got, wantRestarts)
			}
			if got := l.r.Mirror().Position().SnapshotState(); got != tc.wantState {
				t.Fatalf("mirror %s, want %s", got, tc.wantState)
			}
			if tc.restart && tc.replay {
				if got, want := l.r.Mirror().heldView(), ref.view(); !reflect.DeepEqual(got, want) {
					t.Fatalf("the mirror holds %d blocks after the restart, the new engine %d", len(got), len(want))
				}
			}
		})
	}
}

// jetStreamNATS starts a server with a JetStream stream over the pool, so
// that what the relay publishes is kept across a restart of the server and
// can be read back in order whoever was subscribed at the time.
func jetStreamNATS(t *testing.T, port int, dir string) *natsembed.Server {
	t.Helper()
	ns := startNATS(t, natsembed.Options{Port: port, JetStream: true, StoreDir: dir})
	nc, err := nats.Connect(ns.ClientURL(), quietNATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, err := events.EnsureStream(ctx, js, events.StreamConfig{Namespace: testNamespace, Pool: testPool, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// streamed reads the n messages the pool's stream holds.
func streamed(t *testing.T, url string, n int) []*nats.Msg {
	t.Helper()
	nc, err := nats.Connect(url, quietNATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := js.OrderedConsumer(ctx, events.StreamName(testNamespace, testPool), jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*nats.Msg
	for len(out) < n {
		m, err := c.Next(jetstream.FetchMaxWait(waitLimit))
		if err != nil {
			var seqs []string
			for _, m := range out {
				seqs = append(seqs, m.Header.Get(events.HeaderSeq))
			}
			t.Fatalf("stream message %d of %d: %v; got seqs %v", len(out), n, err, seqs)
		}
		out = append(out, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	}
	return out
}

func TestRelayBuffersWhileNATSIsDownAndFlushesInOrder(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port, dir := freePort(t), t.TempDir()
	ns := jetStreamNATS(t, port, dir)
	eng := newEngine(t, ctx)
	r := startRelay(t, baseConfig(), ns.ClientURL())
	health := httptest.NewServer(r.Handler(r.reg))
	defer health.Close()
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(5, 16, 8)
	payloads := map[uint64][]byte{}
	for seq := uint64(0); seq < 10; seq++ {
		payloads[seq] = bm.payload(t)
		eng.send(t, seq, payloads[seq], true)
	}
	// Published is not yet received: wait until the server has them, or the
	// shutdown below may lose them in flight, as any reconnect can.
	streamed(t, ns.ClientURL(), 10)
	if code := get(t, health.URL+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz %d while connected", code)
	}

	ns.Shutdown()
	testkit.WaitFor(t, "the relay to see NATS go", func() error {
		if seen := value(r.m.natsConnected); seen != 0 {
			return fmt.Errorf("value(r.m.natsConnected) is %v, want %v", seen, 0)
		}
		return nil
	})
	if code := get(t, health.URL+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz %d while NATS is down", code)
	}
	for seq := uint64(10); seq < 30; seq++ {
		payloads[seq] = bm.payload(t)
		eng.send(t, seq, payloads[seq], true)
	}
	testkit.WaitFor(t, "20 batches in the buffer", func() error {
		if seen := value(r.m.bufferBatches); seen != 20 {
			return fmt.Errorf("value(r.m.bufferBatches) is %v, want %v", seen, 20)
		}
		return nil
	})

	ns = jetStreamNATS(t, port, dir)
	defer ns.Shutdown()
	testkit.WaitFor(t, "the buffer to drain", func() error {
		if seen := value(r.m.bufferBatches); seen != 0 {
			return fmt.Errorf("value(r.m.bufferBatches) is %v, want %v", seen, 0)
		}
		if seen := value(r.m.batchesOut); seen != 30 {
			return fmt.Errorf("value(r.m.batchesOut) is %v, want %v", seen, 30)
		}
		return nil
	})
	checkRelayed(t, streamed(t, ns.ClientURL(), 30), payloads, seqRange(0, 30))
	if got := value(r.m.dropped.WithLabelValues(dropBufferFull)); got != 0 {
		t.Fatalf("dropped %v batches with room to spare", got)
	}
	if code := get(t, health.URL+"/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz %d", code)
	}
	if body := getBody(t, health.URL+"/metrics"); !strings.Contains(body, "kvroute_relay_batches_out_total 30") {
		t.Fatalf("/metrics lacks the relay's counters:\n%s", body)
	}
}

func TestRelayDropsTheOldestBatchesWhenTheBufferIsFull(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port, dir := freePort(t), t.TempDir()
	jetStreamNATS(t, port, dir).Shutdown()
	eng := newEngine(t, ctx)
	cfg := baseConfig()
	cfg.BufferBatches = 5
	r := startRelay(t, cfg, "nats://127.0.0.1:"+strconv.Itoa(port))
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(6, 16, 8)
	payloads := map[uint64][]byte{}
	for seq := uint64(0); seq < 20; seq++ {
		payloads[seq] = bm.payload(t)
		eng.send(t, seq, payloads[seq], true)
	}
	testkit.WaitFor(t, "20 batches in", func() error {
		if seen := value(r.m.batchesIn); seen != 20 {
			return fmt.Errorf("value(r.m.batchesIn) is %v, want %v", seen, 20)
		}
		return nil
	})
	// The sender takes the oldest batch out to try it and puts it back when
	// NATS is away, so the depth is read once that settles.
	testkit.WaitFor(t, "5 batches buffered, 15 dropped", func() error {
		if seen := value(r.m.bufferBatches); seen != 5 {
			return fmt.Errorf("value(r.m.bufferBatches) is %v, want %v", seen, 5)
		}
		if seen := value(r.m.dropped.WithLabelValues(dropBufferFull)); seen != 15 {
			return fmt.Errorf("value(r.m.dropped.WithLabelValues(dropBufferFull)) is %v, want %v", seen, 15)
		}
		return nil
	})
	ns := jetStreamNATS(t, port, dir)
	defer ns.Shutdown()
	checkRelayed(t, streamed(t, ns.ClientURL(), 5), payloads, seqRange(15, 20))
}

func TestRelayAnswersSnapshotRequestsWithTheMirror(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	eng := newEngine(t, ctx)
	cfg := baseConfig()
	cfg.SnapshotChunkBytes = 16 << 10
	r := startRelay(t, cfg, ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	if msgs := requestSnapshot(t, ns.ClientURL()); msgs[0].Header.Get(events.HeaderSnapshotError) == "" {
		t.Fatal("a relay that relayed nothing answered with a snapshot")
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(7, 16, 32)
	ref := reference{}
	for seq := uint64(0); seq < 40; seq++ {
		b, data := wire(t, bm.batch())
		ref.apply(b, 16)
		eng.send(t, seq, data, true)
	}
	testkit.WaitFor(t, "40 batches in", func() error {
		if seen := value(r.m.batchesIn); seen != 40 {
			return fmt.Errorf("value(r.m.batchesIn) is %v, want %v", seen, 40)
		}
		return nil
	})

	chunks := requestSnapshot(t, ns.ClientURL())
	if len(chunks) < 2 {
		t.Fatalf("%d chunks; the test wants several", len(chunks))
	}
	rebuilt := reference{}
	var instance string
	for i, m := range chunks {
		o, err := events.ParseOrigin(m.Header)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if o.Seq != 39 || o.Endpoint != "10.0.0.7:8000" || o.BlockSize != 16 {
			t.Fatalf("chunk %d origin %+v, want seq 39 from 10.0.0.7:8000 with block size 16", i, o)
		}
		if i == 0 {
			instance = o.Instance
		}
		if o.Instance != instance || instance == "" {
			t.Fatalf("chunk %d instance %q, chunk 0 had %q", i, o.Instance, instance)
		}
		if got := m.Header.Get(events.HeaderSnapshotChunk); got != strconv.Itoa(i) {
			t.Fatalf("chunk %d is labelled %q", i, got)
		}
		if got := m.Header.Get(events.HeaderSnapshotExact); got != "true" {
			t.Fatalf("chunk %d exact %q on a complete stream", i, got)
		}
		if len(m.Data) > cfg.SnapshotChunkBytes {
			t.Fatalf("chunk %d is %d bytes, over %d", i, len(m.Data), cfg.SnapshotChunkBytes)
		}
		b, err := events.Decode(m.Data)
		if err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		rebuilt.apply(b, 16)
	}
	if got, want := rebuilt.view(), ref.view(); !reflect.DeepEqual(got, want) {
		t.Fatalf("the snapshot rebuilds %d blocks, the engine holds %d", len(got), len(want))
	}
	if got := value(r.m.snapshots); got != 1 {
		t.Fatalf("snapshots_served_total %v, want 1", got)
	}
}

func TestRelayCountsWhatItCannotDecodeAndForwardsIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	col := collect(t, ns.ClientURL())
	eng := newEngine(t, ctx)
	r := startRelay(t, baseConfig(), ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(8, 16, 4)
	payloads := map[uint64][]byte{0: bm.payload(t), 1: []byte("not msgpack"), 2: bm.payload(t)}
	for seq := uint64(0); seq < 3; seq++ {
		eng.send(t, seq, payloads[seq], true)
	}
	// A message of the wrong shape is dropped, not forwarded.
	if err := eng.pub.SendMulti(zmqMsg([]byte(testTopic), []byte{1, 2, 3}, []byte("x"))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the malformed message", func() error {
		if seen := value(r.m.dropped.WithLabelValues(dropMalformedFrame)); seen != 1 {
			return fmt.Errorf("value(r.m.dropped.WithLabelValues(dropMalformedFrame)) is %v, want %v", seen, 1)
		}
		return nil
	})
	checkRelayed(t, col.wait(t, 3), payloads, seqRange(0, 3))
	if got := value(r.m.decodeErrors); got != 1 {
		t.Fatalf("decode_errors_total %v, want 1", got)
	}
	if r.Mirror().Position().Exact {
		t.Fatal("the mirror claims to be exact after a batch it could not read")
	}
}

func TestRelayStopsEveryGoroutineItStarted(t *testing.T) {
	// Not parallel: goleak must see only this test's goroutines.
	// The engine's PUB socket is the test's, and the ZeroMQ library never
	// stops its writer goroutine; everything else must be gone.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("github.com/go-zeromq/zmq4.(*pubMWriter).run"))
	ctx, cancel := context.WithCancel(context.Background())
	ns := startNATS(t, natsembed.Options{})
	eng := newEngine(t, ctx)
	cfg := baseConfig()
	cfg.ReplayEndpoint = eng.serveReplay(t, ctx)
	r := startRelay(t, cfg, ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(9, 16, 4)
	for _, seq := range []uint64{0, 1, 5, 6} {
		eng.send(t, seq, bm.payload(t), true)
	}
	testkit.WaitFor(t, "the gap to be handled", func() error {
		if seen := value(r.m.batchesOut); seen < 4 {
			return fmt.Errorf("value(r.m.batchesOut) is %v, want >= %v", seen, 4)
		}
		return nil
	})
	requestSnapshot(t, ns.ClientURL())
	r.stop()
	cancel()
	eng.pub.Close()
	eng.router.Close()
	ns.Shutdown()
	// goleak retries until the goroutines are gone or its deadline passes.
}

func TestNewRejectsConfigsThatCannotWork(t *testing.T) {
	t.Parallel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	nc, err := nats.Connect(ns.ClientURL(), quietNATS)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	tests := []struct {
		name string
		edit func(*Config)
	}{
		{"a missing pod name", func(c *Config) { c.Pod = "" }},
		{"a missing pool", func(c *Config) { c.Pool = "" }},
		{"a missing pod IP", func(c *Config) { c.PodIP = "" }},
		{"a serving port out of range", func(c *Config) { c.ServingPort = 70000 }},
		{"a negative rank", func(c *Config) { c.DPRank = -1 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := baseConfig()
			tc.edit(&cfg)
			if _, err := New(cfg, nc); err == nil {
				t.Fatal("New accepted it")
			}
		})
	}
	if _, err := New(baseConfig(), nil); err == nil {
		t.Fatal("New accepted no connection")
	}
}

func get(t testing.TB, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func getBody(t testing.TB, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestSnapshotSubjectIsSanitisedLikeTheEventSubject(t *testing.T) {
	t.Parallel()
	tests := []struct{ ns, pool, pod, want string }{
		{"default", "llama", "vllm-0", "kv.snapshot.default.llama.vllm-0"},
		{"a.b", "p*", "pod>", "kv.snapshot.a_b.p_.pod_"},
		{"", "pool", "pod", "kv.snapshot._.pool.pod"},
	}
	for _, tc := range tests {
		if got := events.SnapshotSubject(tc.ns, tc.pool, tc.pod); got != tc.want {
			t.Errorf("SnapshotSubject(%q, %q, %q) = %q, want %q", tc.ns, tc.pool, tc.pod, got, tc.want)
		}
		ev := events.Subject(tc.ns, tc.pool, tc.pod)
		if strings.TrimPrefix(ev, events.SubjectPrefix) != strings.TrimPrefix(tc.want, events.SnapshotSubjectPrefix) {
			t.Errorf("snapshot subject %q and event subject %q name different pods", tc.want, ev)
		}
	}
}

func TestRelayTakesTheRankAndBlockSizeFromTheBatches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	col := collect(t, ns.ClientURL())
	eng := newEngine(t, ctx)
	cfg := baseConfig()
	cfg.DPRank = 1 // wrong on purpose: the batches say 2
	r := startRelay(t, cfg, ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	bm := newBatchMaker(13, 32, 4)
	for seq := uint64(0); seq < 3; seq++ {
		b := bm.batch()
		b.DPRank = 2
		data, err := events.AppendBatch(nil, b, events.EncodingArray)
		if err != nil {
			t.Fatal(err)
		}
		eng.send(t, seq, data, true)
	}
	for i, m := range col.wait(t, 3) {
		o, err := events.ParseOrigin(m.Header)
		if err != nil {
			t.Fatal(err)
		}
		if o.DPRank != 2 || o.BlockSize != 32 {
			t.Fatalf("message %d: rank %d, block size %d; want 2 and 32 as the batches say", i, o.DPRank, o.BlockSize)
		}
	}
	chunks := requestSnapshot(t, ns.ClientURL())
	if o, err := events.ParseOrigin(chunks[0].Header); err != nil || o.DPRank != 2 || o.Seq != 2 {
		t.Fatalf("snapshot origin %+v (%v), want rank 2 at seq 2", o, err)
	}
}
