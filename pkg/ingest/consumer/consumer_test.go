package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// transport is how a test reaches the server and which API it consumes with.
type transport struct {
	name      string
	jetStream bool
	inProc    bool
}

var transports = []transport{
	{"core NATS over TCP", false, false},
	{"core NATS in-process", false, true},
	{"JetStream over TCP", true, false},
	{"JetStream in-process", true, true},
}

// applied returns the seqs applied for s, in order.
func applied(calls []call) []uint64 {
	var seqs []uint64
	for _, c := range calls {
		if c.op == "apply" {
			seqs = append(seqs, c.origin.Seq)
		}
	}
	return seqs
}

func seqRange(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestConsumerKeepsEachStreamInOrderUnderConcurrentPublishers(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			const ns, pool = "prod", "llama"
			const streams, publishers, perStream, blocks = 24, 4, 50, 4
			env := newNATSEnv(t, tr.jetStream, tr.inProc)
			nc := env.connect(t, "consumer")
			if tr.jetStream {
				env.ensureStream(t, nc, ns, pool)
			}
			rec := &sinkRecorder{}
			// Short queues make workers block and the dispatcher wait, the
			// conditions under which ordering could break.
			c := newTestConsumer(t, nc, Options{Namespace: ns, Pool: pool, JetStream: tr.jetStream, Workers: 3, QueueLen: 2}, rec)
			runConsumer(t, c)

			var wg sync.WaitGroup
			for p := range publishers {
				pub := events.NewPublisher(env.connect(t, fmt.Sprintf("publisher-%d", p)), ns, pool)
				wg.Go(func() {
					for seq := range uint64(perStream) {
						for id := p; id < streams; id += publishers {
							o := testOrigin(id, seq, "inst")
							o.DPRank = id % 2
							if err := pub.Publish(o, encodeBatch(t, testBatch(id, seq, blocks, 16))); err != nil {
								t.Errorf("publish: %v", err)
								return
							}
						}
					}
				})
			}
			wg.Wait()
			testkit.WaitFor(t, "every batch applied", func() error {
				if seen := rec.count(func(c call) bool { return c.op == "apply" }); seen != streams*perStream {
					return fmt.Errorf("rec.count(func(c call) bool { return c.op == \"apply\" }) is %v, want %v", seen, streams*perStream)
				}
				return nil
			})

			for id := range streams {
				s := testOrigin(id, 0, "").Stream
				s.DPRank = id % 2
				calls := rec.of(s)
				if got, want := applied(calls), seqRange(0, perStream); !slices.Equal(got, want) {
					t.Fatalf("stream %s applied seqs %v, want %v", s, got, want)
				}
				for _, c := range calls {
					if c.op != "apply" {
						t.Fatalf("stream %s got %s, want only applies", s, c)
					}
					if got, want := c.batch.Events[0].BlockHashes[0], marker(id, c.origin.Seq, 0); got != want {
						t.Fatalf("stream %s seq %d carried payload %x, want %x", s, c.origin.Seq, got, want)
					}
				}
			}
			if got := testutil.ToFloat64(c.m.applied); got != streams*perStream {
				t.Errorf("batches_total{applied} = %v, want %d", got, streams*perStream)
			}
			if got := testutil.ToFloat64(c.m.blocks); got != streams*perStream*blocks {
				t.Errorf("blocks_total = %v, want %d", got, streams*perStream*blocks)
			}
		})
	}
}

func TestConsumerSequenceTracking(t *testing.T) {
	t.Parallel()
	type step struct {
		inst string
		seq  uint64
	}
	tests := []struct {
		name  string
		steps []step
		// want lists the sink calls for the stream: "apply <inst>/<seq>",
		// "uncertain <reason>", "restart".
		want                       []string
		gaps, restarts, duplicates float64
	}{
		{
			name:  "consecutive batches from seq 0 just apply",
			steps: []step{{"a", 0}, {"a", 1}, {"a", 2}},
			want:  []string{"apply a/0", "apply a/1", "apply a/2"},
		},
		{
			name:       "a repeated seq is dropped as a duplicate",
			steps:      []step{{"a", 0}, {"a", 1}, {"a", 1}, {"a", 2}},
			want:       []string{"apply a/0", "apply a/1", "apply a/2"},
			duplicates: 1,
		},
		{
			name:       "an older seq from the same instance is dropped",
			steps:      []step{{"a", 0}, {"a", 1}, {"a", 2}, {"a", 3}, {"a", 1}, {"a", 4}},
			want:       []string{"apply a/0", "apply a/1", "apply a/2", "apply a/3", "apply a/4"},
			duplicates: 1,
		},
		{
			name:  "a gap is reported and the batch after it still applies",
			steps: []step{{"a", 0}, {"a", 1}, {"a", 4}, {"a", 5}},
			want:  []string{"apply a/0", "apply a/1", "uncertain gap", "apply a/4", "apply a/5"},
			gaps:  1,
		},
		{
			name:     "a new instance is a restart before its first batch applies",
			steps:    []step{{"a", 0}, {"a", 1}, {"b", 0}, {"b", 1}},
			want:     []string{"apply a/0", "apply a/1", "restart", "apply b/0", "apply b/1"},
			restarts: 1,
		},
		{
			name:     "seq going back to 0 in the same instance is a restart",
			steps:    []step{{"a", 0}, {"a", 1}, {"a", 2}, {"a", 0}, {"a", 1}},
			want:     []string{"apply a/0", "apply a/1", "apply a/2", "restart", "apply a/0", "apply a/1"},
			restarts: 1,
		},
		{
			name:  "a first batch past seq 0 is a late join: history missed, nothing since",
			steps: []step{{"a", 5}, {"a", 6}},
			want:  []string{"uncertain late_join", "apply a/5", "apply a/6"},
		},
		{
			name:     "a new instance that starts past seq 0 is a restart and a late join",
			steps:    []step{{"a", 0}, {"b", 3}, {"b", 4}},
			want:     []string{"apply a/0", "restart", "uncertain late_join", "apply b/3", "apply b/4"},
			restarts: 1,
		},
		{
			name:     "seq falling back further than any redelivery is a restart",
			steps:    []step{{"a", 0}, {"a", 1}, {"a", 3000}, {"a", 3001}, {"a", 5}},
			want:     []string{"apply a/0", "apply a/1", "uncertain gap", "apply a/3000", "apply a/3001", "restart", "uncertain late_join", "apply a/5"},
			gaps:     1,
			restarts: 1,
		},
	}
	env := newNATSEnv(t, false, true)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pool := fmt.Sprintf("pool-%d", i)
			rec := &sinkRecorder{}
			c := newTestConsumer(t, env.connect(t, "consumer"), Options{Namespace: "ns", Pool: pool}, rec)
			runConsumer(t, c)
			pub := events.NewPublisher(env.connect(t, "publisher"), "ns", pool)
			for _, st := range tt.steps {
				if err := pub.Publish(testOrigin(1, st.seq, st.inst), encodeBatch(t, testBatch(1, st.seq, 2, 4))); err != nil {
					t.Fatal(err)
				}
			}
			// The last step always applies; the stream's calls are in
			// order, so once it is in, everything before it is too.
			last := fmt.Sprintf("apply %s/%d", tt.steps[len(tt.steps)-1].inst, tt.steps[len(tt.steps)-1].seq)
			s := testOrigin(1, 0, "").Stream
			describe := func() []string {
				var out []string
				for _, c := range rec.of(s) {
					switch c.op {
					case "apply":
						out = append(out, fmt.Sprintf("apply %s/%d", c.origin.Instance, c.origin.Seq))
					case "uncertain":
						out = append(out, "uncertain "+c.reason.String())
					default:
						out = append(out, c.op)
					}
				}
				return out
			}
			// The last step may also occur earlier (a restart replays seqs):
			// wait for as many of it as the case expects.
			wantLast := 0
			for _, w := range tt.want {
				if w == last {
					wantLast++
				}
			}
			testkit.WaitFor(t, last, func() error {
				n := 0
				for _, g := range describe() {
					if g == last {
						n++
					}
				}
				if n < wantLast {
					return fmt.Errorf("n is %v, want >= %v", n, wantLast)
				}
				return nil
			})
			if got := describe(); !slices.Equal(got, tt.want) {
				t.Errorf("sink saw\n  %q\nwant\n  %q", got, tt.want)
			}
			for _, m := range []struct {
				name string
				c    prometheus.Counter
				want float64
			}{{"gaps_total", c.m.gaps, tt.gaps}, {"engine_restarts_total", c.m.restarts, tt.restarts}, {"batches_total{duplicate}", c.m.duplicate, tt.duplicates}} {
				if got := testutil.ToFloat64(m.c); got != m.want {
					t.Errorf("%s = %v, want %v", m.name, got, m.want)
				}
			}
		})
	}
}

// logCounter is a slog.Handler that counts records by their "reason" attribute.
type logCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *logCounter) WithGroup(string) slog.Handler            { return l }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "reason" {
			l.n[a.Value.String()]++
		}
		return true
	})
	return nil
}

func (l *logCounter) get(reason string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[reason]
}

func TestConsumerRejectsBadMessagesAndAppliesTheRest(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			const ns, pool = "ns", "pool"
			env := newNATSEnv(t, tr.jetStream, tr.inProc)
			nc := env.connect(t, "consumer")
			if tr.jetStream {
				env.ensureStream(t, nc, ns, pool)
			}
			logs := &logCounter{n: map[string]int{}}
			rec := &sinkRecorder{}
			c := newTestConsumer(t, nc, Options{Namespace: ns, Pool: pool, JetStream: tr.jetStream, Logger: slog.New(logs)}, rec)
			runConsumer(t, c)

			pubConn := env.connect(t, "publisher")
			subject := events.Subject(ns, pool, "vllm-1")
			send := func(h nats.Header, data []byte) {
				t.Helper()
				if err := pubConn.PublishMsg(&nats.Msg{Subject: subject, Header: h, Data: data}); err != nil {
					t.Fatal(err)
				}
			}
			good := func(seq uint64) {
				o := testOrigin(1, seq, "i")
				send(o.Header(), encodeBatch(t, testBatch(1, seq, 2, 4)))
			}
			headers := func(edit func(nats.Header)) nats.Header {
				h := testOrigin(1, 99, "i").Header()
				edit(h)
				return h
			}
			payload := encodeBatch(t, testBatch(1, 99, 2, 4))
			const badHeaders = 120
			badHeaderCases := []nats.Header{
				nil,
				headers(func(h nats.Header) { h.Del(events.HeaderEndpoint) }),
				headers(func(h nats.Header) { h.Set(events.HeaderEndpoint, "not an endpoint") }),
				headers(func(h nats.Header) { h.Set(events.HeaderSeq, "NaN") }),
				headers(func(h nats.Header) { h.Set(events.HeaderDPRank, "-1") }),
				headers(func(h nats.Header) { h.Set(events.HeaderBlockSize, "sixteen") }),
			}
			undecodable := func(seq uint64, data []byte) {
				send(testOrigin(1, seq, "i").Header(), data)
			}

			good(0)
			for i := range badHeaders {
				send(badHeaderCases[i%len(badHeaderCases)], payload)
			}
			good(1)
			undecodable(2, []byte{0xc1}) // a byte msgpack never uses
			good(3)
			undecodable(4, []byte("this is not msgpack"))
			good(5)
			undecodable(6, nil)
			good(7)

			s := testOrigin(1, 0, "").Stream
			// The worker counts a batch just after the sink has it.
			testkit.WaitFor(t, "last good batch, counted", func() error {
				a := applied(rec.of(s))
				if seen := len(a); seen <= 0 {
					return fmt.Errorf("len(a) is %v, want > %v", seen, 0)
				}
				if seen := a[len(a)-1]; seen != 7 {
					return fmt.Errorf("a[len(a)-1] is %v, want %v", seen, 7)
				}
				if seen := testutil.ToFloat64(c.m.applied); seen != 5 {
					return fmt.Errorf("testutil.ToFloat64(c.m.applied) is %v, want %v", seen, 5)
				}
				return nil
			})
			var got []string
			for _, c := range rec.of(s) {
				got = append(got, c.String())
			}
			want := []string{
				"apply " + s.String() + " seq=0 inst=i",
				"apply " + s.String() + " seq=1 inst=i",
				"uncertain " + s.String() + " gap",
				"apply " + s.String() + " seq=3 inst=i",
				"uncertain " + s.String() + " gap",
				"apply " + s.String() + " seq=5 inst=i",
				"uncertain " + s.String() + " gap",
				"apply " + s.String() + " seq=7 inst=i",
			}
			if !slices.Equal(got, want) {
				t.Errorf("sink saw\n  %q\nwant\n  %q", got, want)
			}
			if n := rec.count(func(c call) bool { return c.stream != s }); n != 0 {
				t.Errorf("%d sink calls for streams no good message named", n)
			}
			for _, m := range []struct {
				name string
				c    prometheus.Counter
				want float64
			}{
				{"batches_total{bad_header}", c.m.badHeader, badHeaders},
				{"dropped_messages_total{bad_header}", c.m.droppedBadHeader, badHeaders},
				{"batches_total{decode_error}", c.m.decodeErrorBatch, 3},
				{"decode_errors_total", c.m.decodeErrors, 3},
				{"batches_total{applied}", c.m.applied, 5},
			} {
				if got := testutil.ToFloat64(m.c); got != m.want {
					t.Errorf("%s = %v, want %v", m.name, got, m.want)
				}
			}
			// At most one line per second per reason: far fewer lines than
			// rejections, and at least one of each.
			if n := logs.get(resultBadHeader); n < 1 || n >= badHeaders {
				t.Errorf("%d bad-header log lines for %d rejections, want rate-limited", n, badHeaders)
			}
			if n := logs.get(resultDecodeError); n < 1 {
				t.Errorf("no decode-error log line")
			}
		})
	}
}

func TestConsumerReportsReconnectForEveryStreamAndResumes(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		if tr.inProc {
			continue // an in-process connection cannot redial a new server
		}
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			const ns, pool, streams = "ns", "pool", 6
			env := newNATSEnv(t, tr.jetStream, false)
			nc := env.connect(t, "consumer")
			if tr.jetStream {
				env.ensureStream(t, nc, ns, pool)
			}
			rec := &sinkRecorder{}
			c := newTestConsumer(t, nc, Options{Namespace: ns, Pool: pool, JetStream: tr.jetStream, Workers: 2}, rec)
			runConsumer(t, c)

			publish := func(from, to uint64) {
				t.Helper()
				pc := env.connect(t, "publisher")
				pub := events.NewPublisher(pc, ns, pool)
				for seq := from; seq < to; seq++ {
					for id := range streams {
						if err := pub.Publish(testOrigin(id, seq, "i"), encodeBatch(t, testBatch(id, seq, 2, 4))); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := pc.Flush(); err != nil {
					t.Fatal(err)
				}
				pc.Close()
			}
			applies := func() int { return rec.count(func(c call) bool { return c.op == "apply" }) }

			publish(0, 3)
			testkit.WaitFor(t, "batches before the outage", func() error {
				if seen := applies(); seen != streams*3 {
					return fmt.Errorf("applies() is %v, want %v", seen, streams*3)
				}
				return nil
			})

			env.Stop()
			testkit.WaitFor(t, "consumer to see the outage", func() error {
				if c.Connected() {
					return errors.New("c.Connected() is still true")
				}
				return nil
			})
			env.Start(t)
			testkit.WaitFor(t, "reconnect reported for every stream", func() error {
				if seen := rec.count(func(c call) bool { return c.op == "uncertain" && c.reason == events.ReasonReconnect }); seen < streams {
					return fmt.Errorf("rec.count(func(c call) bool { return c.op == \"uncertain\" && c.reason == events.ReasonReconnect }) is %v, want >= %v", seen, streams)
				}
				return nil
			})
			testkit.WaitFor(t, "consumer connected again", func() error {
				if !c.Connected() {
					return errors.New("c.Connected() is false")
				}
				return nil
			})
			// The consumer's interest must be at the server before anyone
			// publishes, or core NATS would rightly deliver nothing.
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}

			publish(3, 6)
			testkit.WaitFor(t, "batches after the outage", func() error {
				if seen := applies(); seen != streams*6 {
					return fmt.Errorf("applies() is %v, want %v", seen, streams*6)
				}
				return nil
			})
			for id := range streams {
				s := testOrigin(id, 0, "").Stream
				var got []string
				for _, c := range rec.of(s) {
					got = append(got, c.String())
				}
				want := []string{}
				for seq := range 6 {
					if seq == 3 {
						want = append(want, "uncertain "+s.String()+" reconnect")
					}
					want = append(want, fmt.Sprintf("apply %s seq=%d inst=i", s, seq))
				}
				if !slices.Equal(got, want) {
					t.Errorf("stream %s saw\n  %q\nwant\n  %q", s, got, want)
				}
			}
		})
	}
}

// slowConsumerRig is a consumer with one worker, a queue of one and a
// pending limit of four, whose sink blocks until rec.block is closed: a
// burst overruns it at once. send publishes one batch of stream 1.
func slowConsumerRig(t *testing.T) (c *Consumer, rec *sinkRecorder, pc *nats.Conn, send func(seq uint64)) {
	t.Helper()
	env := newNATSEnv(t, false, true)
	rec = &sinkRecorder{block: make(chan struct{})}
	c = newTestConsumer(t, env.connect(t, "consumer"), Options{
		Namespace: "ns", Pool: "pool", Workers: 1, QueueLen: 1, PendingLimit: 4,
	}, rec)
	runConsumer(t, c)
	pc = env.connect(t, "publisher")
	pub := events.NewPublisher(pc, "ns", "pool")
	send = func(seq uint64) {
		t.Helper()
		if err := pub.Publish(testOrigin(1, seq, "i"), encodeBatch(t, testBatch(1, seq, 1, 4))); err != nil {
			t.Fatal(err)
		}
	}
	return c, rec, pc, send
}

func TestConsumerReportsSlowConsumerAsUncertainty(t *testing.T) {
	t.Parallel()
	c, rec, pc, send := slowConsumerRig(t)
	// The sink holds the first batch, the queue and the client's buffer
	// fill, and the client must drop.
	for seq := range uint64(200) {
		send(seq)
	}
	if err := pc.Flush(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the client to drop messages", func() error {
		n, _ := c.sub.Load().Dropped()
		if n <= 0 {
			return fmt.Errorf("n is %v, want > %v", n, 0)
		}
		return nil
	})
	close(rec.block)
	s := testOrigin(1, 0, "").Stream
	testkit.WaitFor(t, "slow consumer reported", func() error {
		if n := rec.count(func(c call) bool {
			return c.op == "uncertain" && c.reason == events.ReasonSlowConsumer && c.stream == s
		}); n <= 0 {
			return fmt.Errorf("%d slow-consumer reports for the stream, want > 0", n)
		}
		return nil
	})
	// Every message is either applied or dropped by the client; once all
	// are accounted for, nothing is in flight and nothing more is dropped.
	sub := c.sub.Load()
	testkit.WaitFor(t, "every message accounted for", func() error {
		d, _ := sub.Dropped()
		if seen := d + len(applied(rec.of(s))); seen != 200 {
			return fmt.Errorf("d+len(applied(rec.of(s))) is %v, want %v", seen, 200)
		}
		return nil
	})
	send(1000)
	testkit.WaitFor(t, "a batch after the drop", func() error {
		a := applied(rec.of(s))
		if seen := len(a); seen <= 0 {
			return fmt.Errorf("len(a) is %v, want > %v", seen, 0)
		}
		if seen := a[len(a)-1]; seen != 1000 {
			return fmt.Errorf("a[len(a)-1] is %v, want %v", seen, 1000)
		}
		return nil
	})

	seqs := applied(rec.of(s))
	if !slices.IsSorted(seqs) || len(seqs) >= 201 {
		t.Errorf("applied %v: want increasing seqs with some missing", seqs)
	}
	if rec.count(func(c call) bool { return c.op == "uncertain" && c.reason == events.ReasonGap }) == 0 {
		t.Error("dropped batches left no gap report")
	}
	if got := testutil.ToFloat64(c.m.droppedSlow); got == 0 {
		t.Error("dropped_messages_total{slow_consumer} = 0, want the client's drops")
	}
}

// TestConsumerReportsDropsTheClientKeepsQuietAbout: the client reports a
// slow consumer once per episode, at its first drop. Drops later in the same
// episode are found by reading the drop count, and reported too.
func TestConsumerReportsDropsTheClientKeepsQuietAbout(t *testing.T) {
	t.Parallel()
	c, rec, pc, send := slowConsumerRig(t)
	burst := func(from uint64) {
		t.Helper()
		for seq := from; seq < from+100; seq++ {
			send(seq)
		}
		if err := pc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	sub := c.sub.Load()
	counted := func() bool {
		n, _ := sub.Dropped()
		return n > 0 && testutil.ToFloat64(c.m.droppedSlow) == float64(n)
	}
	// The sink holds the first batch: the queue and the client's buffer
	// fill, and the episode of drops begins, reported once by the client.
	burst(0)
	testkit.WaitFor(t, "the first drops counted", func() error {
		if !counted() {
			return errors.New("counted() is false")
		}
		return nil
	})
	first, _ := sub.Dropped()
	// The sink still holds: the same episode goes on, and the client says
	// nothing more.
	burst(100)
	testkit.WaitFor(t, "more drops, counted", func() error {
		n, _ := sub.Dropped()
		if n <= first {
			return fmt.Errorf("n is %v, want > %v", n, first)
		}
		if !(counted()) {
			return errors.New("counted() is false")
		}
		return nil
	})
	close(rec.block)
	s := testOrigin(1, 0, "").Stream
	testkit.WaitFor(t, "two slow-consumer reports", func() error {
		if n := rec.count(func(c call) bool {
			return c.op == "uncertain" && c.reason == events.ReasonSlowConsumer && c.stream == s
		}); n < 2 {
			return fmt.Errorf("%d slow-consumer reports for the stream, want >= 2", n)
		}
		return nil
	})
}

func TestConsumerShutsDownCleanly(t *testing.T) {
	// Not parallel: goleak compares against the goroutines alive at start.
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			env := newNATSEnv(t, tr.jetStream, tr.inProc)
			nc := env.connect(t, "consumer")
			if tr.jetStream {
				env.ensureStream(t, nc, "ns", "pool")
			}
			pub := events.NewPublisher(env.connect(t, "publisher"), "ns", "pool")
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

			rec := &sinkRecorder{}
			c := newTestConsumer(t, nc, Options{Namespace: "ns", Pool: "pool", JetStream: tr.jetStream}, rec)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx) }()
			testkit.WaitFor(t, "connected", func() error {
				if !c.Connected() {
					return errors.New("c.Connected() is false")
				}
				return nil
			})
			for seq := range uint64(10) {
				for id := range 3 {
					if err := pub.Publish(testOrigin(id, seq, "i"), encodeBatch(t, testBatch(id, seq, 2, 4))); err != nil {
						t.Fatal(err)
					}
				}
			}
			testkit.WaitFor(t, "batches applied", func() error {
				if seen := rec.count(func(c call) bool { return c.op == "apply" }); seen <= 0 {
					return fmt.Errorf("rec.count(func(c call) bool { return c.op == \"apply\" }) is %v, want > %v", seen, 0)
				}
				return nil
			})
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Run = %v, want nil after cancel", err)
				}
			case <-time.After(waitLimit):
				t.Fatal("Run did not return after cancel")
			}
			if c.Connected() {
				t.Error("Connected after Run returned")
			}
			if err := c.Run(context.Background()); !errors.Is(err, ErrUsed) {
				t.Errorf("second Run = %v, want ErrConsumerUsed", err)
			}
		})
	}
}

func TestConsumerRunReturnsWhenCancelledBeforeStart(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, true, true)
	nc := env.connect(t, "consumer")
	for _, js := range []bool{false, true} {
		c := newTestConsumer(t, nc, Options{Namespace: "ns", Pool: "pool", JetStream: js}, &sinkRecorder{})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Run(ctx); err != nil {
			t.Errorf("JetStream=%v: Run on a cancelled context = %v, want nil", js, err)
		}
	}
}

func TestConsumerRunFailsWithoutItsStream(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, true, true)
	c := newTestConsumer(t, env.connect(t, "consumer"), Options{Namespace: "ns", Pool: "pool", JetStream: true}, &sinkRecorder{})
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := c.Run(ctx); err == nil || !strings.Contains(err.Error(), events.StreamName("ns", "pool")) {
		t.Errorf("Run without a stream = %v, want an error naming the stream", err)
	}
}

func TestNewConsumerValidatesOptions(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, false, true)
	nc := env.connect(t, "consumer")
	tests := []struct {
		name string
		nc   *nats.Conn
		opts Options
		sink events.Sink
		want error
	}{
		{"a nil connection is refused", nil, Options{Namespace: "n", Pool: "p"}, &sinkRecorder{}, events.ErrNoConn},
		{"a nil sink is refused", nc, Options{Namespace: "n", Pool: "p"}, nil, ErrOptions},
		{"a missing pool is refused", nc, Options{Namespace: "n"}, &sinkRecorder{}, ErrOptions},
		{"a missing namespace is refused", nc, Options{Pool: "p"}, &sinkRecorder{}, ErrOptions},
		{"negative workers are refused", nc, Options{Namespace: "n", Pool: "p", Workers: -1}, &sinkRecorder{}, ErrOptions},
		{"zero values take defaults", nc, Options{Namespace: "n", Pool: "p"}, &sinkRecorder{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := New(tt.nc, tt.opts, tt.sink, nil)
			if !errors.Is(err, tt.want) {
				t.Fatalf("NewConsumer error = %v, want %v", err, tt.want)
			}
			if err == nil && (c.opts.Workers != 4 || c.opts.QueueLen != 1024 || c.opts.Stream != "KV_EVENTS_n_p") {
				t.Errorf("defaults not applied: %+v", c.opts)
			}
		})
	}
}

func TestConsumerExportsItsMetrics(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, false, true)
	nc := env.connect(t, "consumer")
	reg := prometheus.NewRegistry()
	rec := &sinkRecorder{}
	c, err := New(nc, Options{Namespace: "ns", Pool: "pool", Workers: 2}, rec, reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(nc, Options{Namespace: "ns", Pool: "pool"}, rec, reg); err == nil {
		t.Error("a second consumer registered the same metrics without error")
	}
	runConsumer(t, c)
	pub := events.NewPublisher(env.connect(t, "publisher"), "ns", "pool")
	if err := pub.Publish(testOrigin(1, 0, "i"), encodeBatch(t, testBatch(1, 0, 32, 16))); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "applied", func() error {
		if seen := rec.count(func(c call) bool { return c.op == "apply" }); seen != 1 {
			return fmt.Errorf("rec.count(func(c call) bool { return c.op == \"apply\" }) is %v, want %v", seen, 1)
		}
		return nil
	})

	want := map[string]float64{
		"kvroute_events_batches_total":          1,
		"kvroute_events_events_total":           1,
		"kvroute_events_blocks_total":           32,
		"kvroute_events_decode_errors_total":    0,
		"kvroute_events_gaps_total":             0,
		"kvroute_events_missed_batches_total":   0,
		"kvroute_events_engine_restarts_total":  0,
		"kvroute_events_uncertain_total":        0,
		"kvroute_events_dropped_messages_total": 0,
		"kvroute_events_lag_seconds":            1,
		"kvroute_events_connected":              1,
		"kvroute_events_queue_depth":            0,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		var sum float64
		for _, m := range mf.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				sum += m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
		got[mf.GetName()] = sum
	}
	for name, v := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("metric %s not exported", name)
			continue
		}
		if g != v {
			t.Errorf("%s = %v, want %v", name, g, v)
		}
	}
}

func TestWorkerForgetsIdleStreams(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, false, true)
	rec := &sinkRecorder{}
	c, err := New(env.connect(t, "c"), Options{Namespace: "ns", Pool: "pool", IdleTimeout: time.Minute}, rec, nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{c: c, streams: map[events.Stream]*seqState{}}
	t0 := time.Now()
	feed := func(seq uint64, at time.Time) {
		w.handle(item{origin: testOrigin(1, seq, "i"), data: encodeBatch(t, testBatch(1, seq, 1, 4)), recv: at})
	}
	feed(0, t0)
	feed(1, t0.Add(30*time.Second))
	if len(w.streams) != 1 {
		t.Fatalf("%d streams tracked, want 1", len(w.streams))
	}
	feed(2, t0.Add(2*time.Hour))
	// Forgotten and seen again: a first batch past 0, hence a warning
	// rather than a silent continuation.
	var got []string
	for _, cl := range rec.snapshot() {
		got = append(got, cl.op)
	}
	if want := []string{"apply", "apply", "uncertain", "apply"}; !slices.Equal(got, want) {
		t.Errorf("sink saw %v, want %v", got, want)
	}
	w.handle(item{reason: events.ReasonReconnect, recv: t0.Add(2 * time.Hour)})
	if n := rec.count(func(c call) bool { return c.reason == events.ReasonReconnect }); n != 1 {
		t.Errorf("reconnect reported for %d streams, want 1", n)
	}
}

func TestConsumerTreatsRanksOfOneEndpointAsSeparateStreams(t *testing.T) {
	t.Parallel()
	env := newNATSEnv(t, false, true)
	rec := &sinkRecorder{}
	c := newTestConsumer(t, env.connect(t, "consumer"), Options{Namespace: "ns", Pool: "pool"}, rec)
	runConsumer(t, c)
	pub := events.NewPublisher(env.connect(t, "publisher"), "ns", "pool")
	// Two engines behind one endpoint, each with its own seq from 0.
	for seq := range uint64(5) {
		for rank := range 2 {
			o := testOrigin(1, seq, "i")
			o.DPRank = rank
			if err := pub.Publish(o, encodeBatch(t, testBatch(rank, seq, 1, 4))); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.WaitFor(t, "all applied", func() error {
		if seen := rec.count(func(c call) bool { return c.op == "apply" }); seen != 10 {
			return fmt.Errorf("rec.count(func(c call) bool { return c.op == \"apply\" }) is %v, want %v", seen, 10)
		}
		return nil
	})
	for rank := range 2 {
		s := testOrigin(1, 0, "").Stream
		s.DPRank = rank
		calls := rec.of(s)
		if got := applied(calls); !slices.Equal(got, seqRange(0, 5)) || len(calls) != 5 {
			t.Errorf("rank %d saw %v, want seqs 0..4 and nothing else", rank, calls)
		}
	}
}

func TestShardSpreadsStreams(t *testing.T) {
	t.Parallel()
	var used [4]atomic.Int32
	for id := range 64 {
		s := testOrigin(id, 0, "").Stream
		i := shard(s, 4)
		if i != shard(s, 4) {
			t.Fatal("shard is not stable")
		}
		used[i].Add(1)
	}
	for i := range used {
		if used[i].Load() == 0 {
			t.Errorf("worker %d got none of 64 streams", i)
		}
	}
}
