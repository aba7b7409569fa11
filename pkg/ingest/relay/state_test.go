package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

var discardLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// newTestStore is a state store in dir for the test relay's identity.
func newTestStore(t testing.TB, dir string, m *metrics) *stateStore {
	t.Helper()
	cfg := baseConfig()
	cfg.StateDir = dir
	if err := cfg.setDefaults(); err != nil {
		t.Fatal(err)
	}
	cfg.SnapshotChunkBytes = 4 << 10
	return newStateStore(&cfg, "10.0.0.7:8000", m, discardLog)
}

// waitWritten waits for the store's background checkpoint.
func waitWritten(t testing.TB, s *stateStore) {
	t.Helper()
	testkit.WaitFor(t, "the checkpoint to be written", func() error {
		s.poll()
		if s.writing != nil {
			return errors.New("still writing")
		}
		return nil
	})
}

func TestSavedStateRebuildsTheMirrorAsItStood(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// after runs once the stream has been applied and saved, on the
		// directory a restarted relay finds.
		after func(t *testing.T, s *stateStore, m *Mirror, digest uint64)
		// empty: the restarted relay must start afresh.
		empty bool
	}{
		{"a crash after a checkpoint replays the journal since", func(t *testing.T, s *stateStore, m *Mirror, digest uint64) {}, false},
		{"a clean stop leaves a checkpoint with nothing to replay", func(t *testing.T, s *stateStore, m *Mirror, digest uint64) {
			s.close(m, digest)
			if gens, _ := journalGens(s.dir); len(gens) != 0 {
				t.Fatalf("journals %v left after a clean stop", gens)
			}
		}, false},
		{"a record torn by a crash mid-write is left out", func(t *testing.T, s *stateStore, m *Mirror, digest uint64) {
			f, err := os.OpenFile(journalPath(s.dir, s.gen), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			rec := appendRecord(nil, recBatch, batchRecordHead(999, 4, 0), []byte{0x93, 0xcb})
			if _, err := f.Write(rec[:len(rec)-3]); err != nil {
				t.Fatal(err)
			}
			f.Close()
		}, false},
		{"a corrupt checkpoint is discarded", func(t *testing.T, s *stateStore, m *Mirror, digest uint64) {
			s.close(m, digest)
			path := filepath.Join(s.dir, checkpointFile)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			data[len(data)/2] ^= 0xff
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a journal generation missing between two is discarded", func(t *testing.T, s *stateStore, m *Mirror, digest uint64) {
			s.checkpoint(m, digest, time.Now().Add(time.Hour))
			s.appendPosition(false, m.Position())
			s.gen++
			if err := s.openJournal(); err != nil {
				t.Fatal(err)
			}
			s.appendPosition(false, m.Position())
			waitWritten(t, s)
			if err := os.Remove(journalPath(s.dir, s.gen-1)); err != nil {
				t.Fatal(err)
			}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			met, _ := newMetrics(nil)
			s := newTestStore(t, dir, met)
			m := NewMirror(0)
			if rs, err := s.load(m); err != nil || rs != nil {
				t.Fatalf("a fresh directory restored %+v, %v", rs, err)
			}
			rng := rand.New(rand.NewPCG(11, 12))
			u := newUniverse(rng, 300)
			m.Reset("engine-a")
			s.appendPosition(true, m.Position())
			var digest uint64
			for seq := uint64(0); seq < 80; seq++ {
				b, data := wire(t, u.randomBatch(rng))
				m.Apply(seq, b, testBlockSize, 0)
				s.appendBatch(seq, testBlockSize, 0, data)
				digest = xxhash.Sum64(data)
				if seq == 40 {
					s.checkpoint(m, digest, time.Now())
					waitWritten(t, s)
				}
			}
			m.MarkPartial()
			s.appendPosition(false, m.Position())
			tt.after(t, s, m, digest)

			met2, _ := newMetrics(nil)
			s2 := newTestStore(t, dir, met2)
			m2 := NewMirror(0)
			rs, err := s2.load(m2)
			if err != nil {
				t.Fatal(err)
			}
			if tt.empty {
				if rs != nil || m2.Position().Valid {
					t.Fatalf("restored %+v from state that should have been discarded", rs)
				}
				if got := value(met2.restores.WithLabelValues("discarded")); got != 1 {
					t.Fatalf("discarded restores = %v, want 1", got)
				}
				return
			}
			if rs == nil {
				t.Fatal("nothing restored")
			}
			if rs.digest != digest || rs.pos != m.Position() {
				t.Fatalf("restored position %+v digest %x, want %+v %x", rs.pos, rs.digest, m.Position(), digest)
			}
			if got, want := m2.heldView(), m.heldView(); !reflect.DeepEqual(got, want) {
				t.Fatalf("restored mirror holds %d blocks, the saved one %d", len(got), len(want))
			}
			m2.checkInvariants(t)
			h1, g1, _ := m.Counts()
			h2, g2, _ := m2.Counts()
			if h1 != h2 || g1 != g2 {
				t.Fatalf("restored mirror has %d held and %d ghost entries, the saved one %d and %d", h2, g2, h1, g1)
			}
		})
	}
}

func TestCheckpointsAreBoundedInRateAndJournalSize(t *testing.T) {
	t.Parallel()
	met, _ := newMetrics(nil)
	s := newTestStore(t, t.TempDir(), met)
	s.interval, s.journalMax = time.Hour, 2<<10
	m := NewMirror(0)
	if _, err := s.load(m); err != nil {
		t.Fatal(err)
	}
	m.Reset("engine-a")
	bm := newBatchMaker(1, 16, 4)
	now := time.Now()
	s.last = now
	for seq := uint64(0); s.size < s.journalMax; seq++ {
		if s.due(now) {
			t.Fatalf("a checkpoint due at %d journal bytes, under the %d-byte bound and within the interval", s.size, s.journalMax)
		}
		b, data := wire(t, bm.batch())
		m.Apply(seq, b, 16, 0)
		s.appendBatch(seq, 16, 0, data)
	}
	if !s.due(now) {
		t.Fatal("no checkpoint due past the journal bound")
	}
	s.checkpoint(m, 0, now)
	if s.due(now.Add(2 * time.Hour)) {
		t.Fatal("a second checkpoint due while the first is written")
	}
	waitWritten(t, s)
	if s.due(now.Add(2 * time.Hour)) {
		t.Fatal("a checkpoint due with nothing journalled since the last")
	}
}

// relayRig is a NATS server, a collector of what reaches it, and a test
// engine whose publisher dials each relay the rig starts.
type relayRig struct {
	ctx     context.Context
	ns      *natsembed.Server
	col     *collector
	eng     *engine
	started int
}

func newRelayRig(t *testing.T) *relayRig {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ns := startNATS(t, natsembed.Options{})
	t.Cleanup(ns.Shutdown)
	return &relayRig{ctx: ctx, ns: ns, col: collect(t, ns.ClientURL()), eng: newEngine(t, ctx)}
}

// start starts a relay and has the engine's publisher reach it: a fresh
// PUB socket after the first, as a relay that restarted is dialled anew.
func (rg *relayRig) start(t *testing.T, cfg Config) *testRelay {
	t.Helper()
	r := startRelay(t, cfg, rg.ns.ClientURL())
	if rg.started++; rg.started > 1 {
		rg.eng.pub = zmq4.NewPub(rg.ctx, zmq4.WithLogger(quietLogger()))
		pub := rg.eng.pub
		t.Cleanup(func() { pub.Close() })
	}
	if err := rg.eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	rg.eng.waitSubscribed(t)
	return r
}

func TestARestartedRelayKeepsItsEngine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		replay bool
		// down runs while no relay listens: what the engine does then.
		down func(t *testing.T, eng *engine, bm *batchMaker, ref *reference)
		// next is the seq of the first batch the new relay receives.
		next        uint64
		newInstance bool
		verdict     string
		state       string
	}{
		{name: "a quiet engine goes on where it was, without a replay ring", down: func(*testing.T, *engine, *batchMaker, *reference) {},
			next: 10, verdict: "unverified", state: events.SnapshotExact},
		{name: "batches its downtime lost come back from the replay ring", replay: true, down: func(t *testing.T, eng *engine, bm *batchMaker, ref *reference) {
			for seq := uint64(10); seq < 15; seq++ {
				b, data := wire(t, bm.batch())
				ref.apply(b, 16)
				eng.send(t, seq, data, false)
			}
		}, next: 15, verdict: "same_engine", state: events.SnapshotExact},
		{name: "batches lost without a replay ring leave the mirror inexact", down: func(t *testing.T, eng *engine, bm *batchMaker, ref *reference) {
			for range 5 {
				bm.batch()
			}
		}, next: 15, verdict: "unverified", state: events.SnapshotInexact},
		{name: "an engine that restarted meanwhile is a new instance", down: func(t *testing.T, eng *engine, bm *batchMaker, ref *reference) {
			*ref = reference{}
		}, next: 0, newInstance: true, verdict: "new_engine", state: events.SnapshotExact},
		{name: "a restarted engine that published past the saved seq is found out by its ring", replay: true, down: func(t *testing.T, eng *engine, bm *batchMaker, ref *reference) {
			*ref = reference{}
			other := newBatchMaker(99, 16, 8)
			eng.mu.Lock()
			clear(eng.ring)
			eng.mu.Unlock()
			for seq := uint64(0); seq < 15; seq++ {
				b, data := wire(t, other.batch())
				ref.apply(b, 16)
				eng.send(t, seq, data, false)
			}
			*bm = *other
		}, next: 15, newInstance: true, verdict: "new_engine", state: events.SnapshotExact},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rg := newRelayRig(t)
			eng, col := rg.eng, rg.col
			cfg := baseConfig()
			cfg.StateDir = t.TempDir()
			if tt.replay {
				cfg.ReplayEndpoint = eng.serveReplay(t, rg.ctx)
			}
			first := rg.start(t, cfg)
			bm := newBatchMaker(5, 16, 8)
			ref := reference{}
			for seq := uint64(0); seq < 10; seq++ {
				b, data := wire(t, bm.batch())
				ref.apply(b, 16)
				eng.send(t, seq, data, true)
			}
			before := col.wait(t, 10)
			o0, _ := events.ParseOrigin(before[0].Header)
			first.stop()

			tt.down(t, eng, bm, &ref)
			second := rg.start(t, cfg)
			if p := second.Mirror().Position(); !p.Valid || p.Seq != 9 || p.Instance != o0.Instance {
				t.Fatalf("the restarted relay's mirror is at %+v before any batch, want seq 9 of %s", p, o0.Instance)
			}
			for seq := tt.next; seq < tt.next+3; seq++ {
				b, data := wire(t, bm.batch())
				ref.apply(b, 16)
				eng.send(t, seq, data, true)
			}
			testkit.WaitFor(t, "the new batches to be relayed", func() error {
				p := second.Mirror().Position()
				if !(p.Valid) {
					return errors.New("p.Valid is false")
				}
				if p.Seq != tt.next+2 {
					return fmt.Errorf("p.Seq is %v, want %v", p.Seq, tt.next+2)
				}
				if seen := value(second.m.batchesOut); seen <= 0 {
					return fmt.Errorf("value(second.m.batchesOut) is %v, want > %v", seen, 0)
				}
				return nil
			})
			msgs := col.wait(t, 11)
			last, _ := events.ParseOrigin(msgs[len(msgs)-1].Header)
			if got := last.Instance != o0.Instance; got != tt.newInstance {
				t.Fatalf("instance after the restart %q, before %q: new instance %v, want %v", last.Instance, o0.Instance, got, tt.newInstance)
			}
			if got := value(second.m.resumes.WithLabelValues(tt.verdict)); got != 1 {
				t.Fatalf("resumes{%s} = %v, want 1", tt.verdict, got)
			}
			if got := second.Mirror().Position().SnapshotState(); got != tt.state {
				t.Fatalf("mirror state %s, want %s", got, tt.state)
			}
			if tt.state == events.SnapshotExact {
				if got, want := second.Mirror().heldView(), ref.view(); !reflect.DeepEqual(got, want) {
					t.Fatalf("the restarted relay's mirror holds %d blocks, the engine %d", len(got), len(want))
				}
			}
		})
	}
}

func TestRelayHeartbeatsItsLastBatch(t *testing.T) {
	t.Parallel()
	rg := newRelayRig(t)
	eng, col := rg.eng, rg.col
	cfg := baseConfig()
	cfg.HeartbeatInterval = 20 * time.Millisecond
	rg.start(t, cfg)
	bm := newBatchMaker(3, 16, 4)
	for seq := uint64(0); seq < 5; seq++ {
		eng.send(t, seq, bm.payload(t), true)
	}
	col.wait(t, 5)
	testkit.WaitFor(t, "a heartbeat naming seq 4", func() error {
		col.mu.Lock()
		defer col.mu.Unlock()
		for _, m := range col.beats {
			if o, err := events.ParseOrigin(m.Header); err == nil && o.Seq == 4 && len(m.Data) == 0 &&
				m.Subject == events.Subject(testNamespace, testPool, testPod) {
				return nil
			}
		}
		return fmt.Errorf("%d heartbeats, none naming seq 4 on the pod's subject", len(col.beats))
	})
}

func TestARelayThatJoinsARunningEngineServesPartialSnapshots(t *testing.T) {
	t.Parallel()
	rg := newRelayRig(t)
	eng, ns := rg.eng, rg.ns
	r := rg.start(t, baseConfig())
	bm := newBatchMaker(3, 16, 4)
	// A publisher that numbers from 1, or an engine running before the
	// relay: its history before the first batch is not to be had.
	for seq := uint64(1); seq < 6; seq++ {
		eng.send(t, seq, bm.payload(t), true)
	}
	testkit.WaitFor(t, "5 batches in", func() error {
		if seen := value(r.m.batchesIn); seen != 5 {
			return fmt.Errorf("value(r.m.batchesIn) is %v, want %v", seen, 5)
		}
		return nil
	})
	chunks := requestSnapshot(t, ns.ClientURL())
	if got := chunks[0].Header.Get(events.HeaderSnapshotState); got != events.SnapshotPartial {
		t.Fatalf("snapshot state %q, want partial", got)
	}
	if got := chunks[0].Header.Get(events.HeaderSnapshotExact); got != "false" {
		t.Fatalf("snapshot exact %q, want false", got)
	}
}
