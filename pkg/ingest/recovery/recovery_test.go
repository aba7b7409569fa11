package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

const (
	unitPod  = "vllm-0"
	unitAddr = "10.0.0.7:8000"
)

var unitStream = events.Stream{Endpoint: unitAddr}

// engineTape is a recorded engine: every batch it published, in order, with
// the relay's mirror after each, so a test can answer a snapshot at any seq.
type engineTape struct {
	batches []*events.Batch
	prompts []blockpool.Request
}

func recordEngine(t testing.TB, steps int) *engineTape {
	t.Helper()
	pool := blockpool.New(blockpool.Config{BlockSize: blockSize, GPUBlocks: 40, CPUBlocks: 8, Seed: 5})
	tape := &engineTape{prompts: sim.SharedPrefix{Groups: 4, PromptsPerGroup: 4, SystemTokens: 5 * blockSize, QuestionTokens: 3 * blockSize, Seed: 9}.Prompts()}
	for i := 0; len(tape.batches) < steps; i++ {
		p := tape.prompts[i%len(tape.prompts)]
		p.ID = fmt.Sprintf("r%d", i)
		if _, err := pool.Allocate(p); err != nil {
			t.Fatal(err)
		}
		if b, _, ok := pool.Step(); ok {
			tape.batches = append(tape.batches, b)
		}
		if err := pool.Free(p.ID); err != nil {
			t.Fatal(err)
		}
		if b, _, ok := pool.Step(); ok {
			tape.batches = append(tape.batches, b)
		}
	}
	tape.batches = tape.batches[:steps]
	return tape
}

func (tp *engineTape) origin(instance string, seq int) events.Origin {
	return events.Origin{Stream: unitStream, Pod: unitPod, Model: testModel, Instance: instance, BlockSize: blockSize, Seq: uint64(seq)}
}

// snapshotAt is the relay's snapshot after batches 0..seq, encoded as the
// relay sends it.
func (tp *engineTape) snapshotAt(t testing.TB, instance string, seq int) *relay.Snapshot {
	t.Helper()
	m := relay.NewMirror(0)
	m.Reset(instance)
	for i := 0; i <= seq; i++ {
		m.Apply(uint64(i), tp.batches[i], blockSize, 0)
	}
	s, err := m.Snapshot(512)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// reference is an index fed every batch up to seq in order: what the
// recovered index must equal.
func (tp *engineTape) reference(seq int) *index.Index {
	ix := index.New(index.Options{}, nil)
	ix.AddEndpoint(unitAddr)
	for i := 0; i <= seq; i++ {
		ix.Apply(tp.origin("inst-a", i), tp.batches[i])
	}
	return ix
}

func (tp *engineTape) diff(got, want *index.Index) string {
	a, b := make([]index.Match, 1), make([]index.Match, 1)
	for _, p := range tp.prompts {
		keys := index.AppendBlockKeys(nil, index.RootKey(testModel, "", ""), p.Tokens, blockSize)
		got.Lookup(keys, []string{unitAddr}, a)
		want.Lookup(keys, []string{unitAddr}, b)
		if a[0] != b[0] {
			return fmt.Sprintf("prompt %v: index %+v, want %+v", p.Tokens[:4], a[0], b[0])
		}
	}
	return ""
}

// responder is a stand-in relay's snapshot service; requests signals
// each request as it arrives.
type responder struct {
	nc       *nats.Conn
	requests chan struct{}
}

// chunks frames a relay snapshot as the relay's reply messages.
func chunks(o events.Origin, s *relay.Snapshot, exact bool) []*nats.Msg {
	var out []*nats.Msg
	for i, c := range s.Chunks {
		h := o.Header()
		h.Set(events.HeaderSnapshotChunk, strconv.Itoa(i))
		h.Set(events.HeaderSnapshotChunks, strconv.Itoa(len(s.Chunks)))
		h.Set(events.HeaderSnapshotExact, strconv.FormatBool(exact))
		out = append(out, &nats.Msg{Header: h, Data: c})
	}
	return out
}

type unit struct {
	ix  *index.Index
	rec *recovery.Recovery
	reg *prometheus.Registry
	ns  *natsembed.Server
}

func newUnit(t testing.TB, opts recovery.Options) *unit {
	t.Helper()
	ns, err := natsembed.Start(natsembed.Options{Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	nc, err := nats.Connect("", nats.InProcessServer(ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	u := &unit{reg: prometheus.NewRegistry(), ix: index.New(index.Options{}, nil), ns: ns}
	opts.Namespace, opts.Pool, opts.Logger = testNS, testPool, quietLog
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff, opts.MaxBackoff = 10*time.Millisecond, 50*time.Millisecond
	}
	if opts.Pod == nil {
		opts.Pod = func(string) (string, bool) { return unitPod, true }
	}
	u.rec, err = recovery.New(opts, u.ix, nc, u.reg)
	if err != nil {
		t.Fatal(err)
	}
	u.ix.AddEndpoint(unitAddr)
	return u
}

// respond answers the pod's snapshot requests with what answer returns,
// once release is closed (nil: at once), over a connection of its own.
func (u *unit) respond(t testing.TB, release <-chan struct{}, answer func() []*nats.Msg) *responder {
	t.Helper()
	nc, err := nats.Connect("", nats.InProcessServer(u.ns))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	r := &responder{nc: nc, requests: make(chan struct{}, 64)}
	_, err = nc.Subscribe(events.SnapshotSubject(testNS, testPool, unitPod), func(m *nats.Msg) {
		select {
		case r.requests <- struct{}{}:
		default:
		}
		if release != nil {
			<-release
		}
		for _, out := range answer() {
			out.Subject = m.Reply
			_ = nc.PublishMsg(out)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (u *unit) run(t testing.TB) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = u.rec.Run(ctx)
	}()
	stop = func() {
		cancel()
		select {
		case <-done:
		case <-time.After(waitLimit):
			t.Fatal("Run did not return after its context ended")
		}
	}
	t.Cleanup(stop)
	return stop
}

func TestHeldBatchesFollowTheSnapshotInOrder(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 40)
	u := newUnit(t, recovery.Options{})
	release := make(chan struct{})
	const snapSeq = 30
	resp := u.respond(t, release, func() []*nats.Msg {
		return chunks(tape.origin("inst-a", snapSeq), tape.snapshotAt(t, "inst-a", snapSeq), true)
	})
	// The stream ran to seq 25 before the endpoint was found uncertain.
	for i := 0; i <= 25; i++ {
		u.rec.Apply(tape.origin("inst-a", i), tape.batches[i])
	}
	u.run(t)
	u.rec.Uncertain(unitStream, events.ReasonReconnect)
	<-resp.requests
	// While the snapshot is awaited, batches 26..39 arrive: 26..30 are in
	// the snapshot already, 31..39 follow it.
	for i := 26; i < 40; i++ {
		u.rec.Apply(tape.origin("inst-a", i), tape.batches[i])
	}
	if got := testkit.Value(t, u.reg, "kvroute_recovery_buffered_batches"); got != 14 {
		t.Errorf("buffered batches = %v while the snapshot is awaited, want 14", got)
	}
	if s, _ := u.ix.State(unitAddr); s != datalayer.StreamRecovering {
		t.Errorf("state while awaiting = %s, want recovering", s)
	}
	close(release)
	testkit.WaitFor(t, "the stream to be exact", func() error {
		s, _ := u.ix.State(unitAddr)
		if s != datalayer.StreamExact {
			return fmt.Errorf("s is %v, want %v", s, datalayer.StreamExact)
		}
		return nil
	})
	if d := tape.diff(u.ix, tape.reference(39)); d != "" {
		t.Fatal(d)
	}
	if got := testkit.Value(t, u.reg, "kvroute_recovery_buffered_batches"); got != 0 {
		t.Errorf("buffered batches = %v after the install, want 0", got)
	}
	// The stream is marked exact inside the resync, and the resync counted
	// as it ends, a moment later.
	testkit.WaitFor(t, "the resync counted", func() error {
		if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "ok"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"ok\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	if got := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got != 1 {
		t.Errorf("resyncs ok = %v, want 1", got)
	}
	if got := float64(testkit.HistCount(t, u.reg, "kvroute_recovery_snapshot_blocks")); got != 1 {
		t.Errorf("snapshot_blocks observations = %v, want 1", got)
	}
}

func TestFailedResyncsLeaveTheStreamUncertain(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 12)
	good := func() []*nats.Msg { return chunks(tape.origin("inst-a", 11), tape.snapshotAt(t, "inst-a", 11), true) }
	tests := []struct {
		name   string
		answer func() []*nats.Msg
		opts   recovery.Options
		result string
	}{
		{"a refusal is retried", func() []*nats.Msg {
			h := nats.Header{}
			h.Set(events.HeaderSnapshotError, relay.ErrNoSnapshot.Error())
			return []*nats.Msg{{Header: h}}
		}, recovery.Options{}, "refused"},
		{"a chunk without the contract's headers is invalid", func() []*nats.Msg {
			m := good()
			m[0].Header.Del(events.HeaderSeq)
			return m
		}, recovery.Options{}, "invalid"},
		{"chunks out of order are invalid", func() []*nats.Msg {
			m := good()
			m[0], m[1] = m[1], m[0]
			return m
		}, recovery.Options{}, "invalid"},
		{"a snapshot of another endpoint is invalid", func() []*nats.Msg {
			o := tape.origin("inst-a", 11)
			o.Endpoint = "10.0.0.8:8000"
			return chunks(o, tape.snapshotAt(t, "inst-a", 11), true)
		}, recovery.Options{}, "invalid"},
		{"a payload that is not a vLLM batch is invalid", func() []*nats.Msg {
			m := good()
			m[0].Data = []byte{0xc1, 0x00}
			return m
		}, recovery.Options{}, "invalid"},
		{"an oversized snapshot is refused", good, recovery.Options{MaxSnapshotBytes: 64}, "too_large"},
		{"a missing chunk times out", func() []*nats.Msg { return good()[:1] }, recovery.Options{Timeout: 50 * time.Millisecond}, "timeout"},
		{"a snapshot of another engine instance is discarded", func() []*nats.Msg {
			return chunks(tape.origin("inst-b", 11), tape.snapshotAt(t, "inst-b", 11), true)
		}, recovery.Options{}, "instance_mismatch"},
		{"an inexact snapshot is installed but not trusted", func() []*nats.Msg {
			return chunks(tape.origin("inst-a", 11), tape.snapshotAt(t, "inst-a", 11), false)
		}, recovery.Options{}, "inexact"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if len(good()) < 2 {
				t.Fatal("the snapshot has one chunk: the order cases prove nothing")
			}
			u := newUnit(t, tt.opts)
			u.respond(t, nil, tt.answer)
			u.rec.Apply(tape.origin("inst-a", 0), tape.batches[0])
			u.run(t)
			u.rec.Uncertain(unitStream, events.ReasonReconnect)
			// A few failures in a row leave the stream uncertain whatever
			// their cause; most leave it so at once.
			testkit.WaitFor(t, tt.result+" three times", func() error {
				if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", tt.result); seen < 3 {
					return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", tt.result) is %v, want >= %v", seen, 3)
				}
				return nil
			})
			// Waited for rather than read once: a failure is counted just
			// before the state it leaves is set, and the next attempt may
			// already be under way (an inexact snapshot is installed each
			// time, and an install reads recovering while it runs).
			testkit.WaitFor(t, "the stream uncertain", func() error {
				s, _ := u.ix.State(unitAddr)
				if s != datalayer.StreamUncertain {
					return fmt.Errorf("s is %v, want %v", s, datalayer.StreamUncertain)
				}
				return nil
			})
			if got := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "ok"); got != 0 {
				t.Errorf("resyncs ok = %v, want 0", got)
			}
		})
	}
}

func TestHeldBatchesPastTheBoundRestartTheResync(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts recovery.Options
	}{
		{"past the batch bound", recovery.Options{MaxHeldBatches: 3}},
		{"past the byte bound", recovery.Options{MaxHeldBytes: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			heldPastTheBound(t, tc.opts)
		})
	}
}

func heldPastTheBound(t *testing.T, opts recovery.Options) {
	tape := recordEngine(t, 20)
	u := newUnit(t, opts)
	release := make(chan struct{})
	var answered int
	resp := u.respond(t, release, func() []*nats.Msg {
		answered++
		return chunks(tape.origin("inst-a", 19), tape.snapshotAt(t, "inst-a", 19), true)
	})
	u.rec.Apply(tape.origin("inst-a", 0), tape.batches[0])
	u.run(t)
	u.rec.Uncertain(unitStream, events.ReasonReconnect)
	<-resp.requests
	for i := 1; i < 20; i++ {
		u.rec.Apply(tape.origin("inst-a", i), tape.batches[i])
	}
	if got := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "overflow"); got != 1 {
		t.Errorf("overflow = %v, want 1", got)
	}
	close(release)
	testkit.WaitFor(t, "the stream to be exact", func() error {
		s, _ := u.ix.State(unitAddr)
		if s != datalayer.StreamExact {
			return fmt.Errorf("s is %v, want %v", s, datalayer.StreamExact)
		}
		return nil
	})
	if d := tape.diff(u.ix, tape.reference(19)); d != "" {
		t.Fatal(d)
	}
}

func TestARestartDuringAResyncAbandonsIt(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 10)
	u := newUnit(t, recovery.Options{})
	release := make(chan struct{})
	resp := u.respond(t, release, func() []*nats.Msg {
		return chunks(tape.origin("inst-a", 9), tape.snapshotAt(t, "inst-a", 9), true)
	})
	u.rec.Apply(tape.origin("inst-a", 0), tape.batches[0])
	u.run(t)
	u.rec.Uncertain(unitStream, events.ReasonReconnect)
	<-resp.requests
	// A new engine: its first batch is seq 0 of instance b.
	u.rec.Restart(unitStream)
	u.rec.Apply(tape.origin("inst-b", 0), tape.batches[0])
	close(release)
	testkit.WaitFor(t, "the abandoned resync", func() error {
		if seen := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "aborted"); seen != 1 {
			return fmt.Errorf("testkit.Value(t, u.reg, \"kvroute_recovery_resyncs_total\", \"result\", \"aborted\") is %v, want %v", seen, 1)
		}
		return nil
	})
	if d := tape.diff(u.ix, tape.reference(0)); d != "" {
		t.Fatal(d)
	}
	if s, _ := u.ix.State(unitAddr); s != datalayer.StreamExact {
		t.Errorf("state = %s, want exact: a restarted engine starts empty", s)
	}
}

// joinedAtSnapshot is an EPP that starts late beside an engine 12 batches
// in: the endpoint joins and the relay's snapshot at seq 8 is installed.
func joinedAtSnapshot(t *testing.T) (*engineTape, *unit) {
	tape := recordEngine(t, 12)
	u := newUnit(t, recovery.Options{})
	u.respond(t, nil, func() []*nats.Msg {
		return chunks(tape.origin("inst-a", 8), tape.snapshotAt(t, "inst-a", 8), true)
	})
	u.run(t)
	u.rec.AddEndpoint(unitAddr)
	testkit.WaitFor(t, "the install", func() error {
		if seen := stateOf(u); seen != datalayer.StreamExact {
			return fmt.Errorf("stateOf(u) is %v, want %v", seen, datalayer.StreamExact)
		}
		return nil
	})
	return tape, u
}

func stateOf(u *unit) datalayer.StreamState { s, _ := u.ix.State(unitAddr); return s }

func TestAGapTheSnapshotCoversIsNoGap(t *testing.T) {
	t.Parallel()
	tape, u := joinedAtSnapshot(t)
	// The consumer sees the stream for the first time at seq 9 and calls it
	// a gap; against the snapshot it follows on.
	u.rec.Uncertain(unitStream, events.ReasonGap)
	u.rec.Apply(tape.origin("inst-a", 9), tape.batches[9])
	if s, _ := u.ix.State(unitAddr); s != datalayer.StreamExact {
		t.Errorf("state = %s, want exact", s)
	}
	// A real gap is reported.
	u.rec.Uncertain(unitStream, events.ReasonGap)
	u.rec.Apply(tape.origin("inst-a", 11), tape.batches[11])
	if s, _ := u.ix.State(unitAddr); s != datalayer.StreamRecovering {
		t.Errorf("state after a real gap = %s, want recovering", s)
	}
}

func TestRunStopsWithAResyncInFlight(t *testing.T) {
	t.Parallel()
	u := newUnit(t, recovery.Options{Timeout: time.Hour})
	release := make(chan struct{})
	defer close(release)
	resp := u.respond(t, release, func() []*nats.Msg { return nil })
	stop := u.run(t)
	u.rec.AddEndpoint(unitAddr)
	<-resp.requests
	stop()
	if got := testkit.Value(t, u.reg, "kvroute_recovery_in_flight"); got != 0 {
		t.Errorf("in flight after Run returned = %v, want 0", got)
	}
}

func TestNewRejectsOptionsThatCannotWork(t *testing.T) {
	t.Parallel()
	ix := index.New(index.Options{}, nil)
	nc := &nats.Conn{}
	tests := []struct {
		name string
		opts recovery.Options
		nc   *nats.Conn
	}{
		{"no connection", recovery.Options{Namespace: "a", Pool: "b"}, nil},
		{"no pool", recovery.Options{Namespace: "a"}, nc},
		{"a negative bound", recovery.Options{Namespace: "a", Pool: "b", MaxHeldBatches: -1}, nc},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := recovery.New(tt.opts, ix, tt.nc, nil); !errors.Is(err, recovery.ErrOptions) {
				t.Errorf("err = %v, want ErrOptions", err)
			}
		})
	}
}

// TestAJoinRefusedByARelayWithNothingYetIsAskedAgain: an endpoint joins
// before its relay has relayed anything, so the relay refuses; its batches
// are then all lost (as to a slow consumer), and no later batch would show
// the gap. Asked again with backoff, the relay answers, and the stream ends
// exact.
func TestAJoinRefusedByARelayWithNothingYetIsAskedAgain(t *testing.T) {
	t.Parallel()
	tape := recordEngine(t, 12)
	var asked atomic.Int32
	u := newUnit(t, recovery.Options{})
	u.respond(t, nil, func() []*nats.Msg {
		if asked.Add(1) == 1 {
			h := nats.Header{}
			h.Set(events.HeaderSnapshotError, relay.ErrNoSnapshot.Error())
			return []*nats.Msg{{Header: h}}
		}
		return chunks(tape.origin("inst-a", 11), tape.snapshotAt(t, "inst-a", 11), true)
	})
	u.rec.AddEndpoint(unitAddr)
	u.run(t)
	testkit.WaitFor(t, "the stream to be exact", func() error {
		s, _ := u.ix.State(unitAddr)
		if s != datalayer.StreamExact {
			return fmt.Errorf("s is %v, want %v", s, datalayer.StreamExact)
		}
		return nil
	})
	if d := tape.diff(u.ix, tape.reference(11)); d != "" {
		t.Fatal(d)
	}
	if got := testkit.Value(t, u.reg, "kvroute_recovery_resyncs_total", "result", "refused"); got != 1 {
		t.Errorf("resyncs refused = %v, want 1", got)
	}
}
