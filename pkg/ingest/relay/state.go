package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/pkg/events"
)

// Defaults of the state directory's bounds (Config).
const (
	DefaultCheckpointInterval = 30 * time.Second
	DefaultJournalMaxBytes    = 64 << 20
	DefaultStateMaxBytes      = 1 << 30
)

// stateStore keeps the mirror on disk: checkpoints written in the
// background, a journal appended by the relay's handler goroutine, which
// owns everything here but the writer's result channel.
type stateStore struct {
	dir        string
	interval   time.Duration
	journalMax int64
	loadMax    int64
	chunkBytes int
	endpoint   string
	pod        string
	log        *slog.Logger
	m          *metrics

	f    *os.File
	gen  uint64
	size int64
	buf  []byte
	// dirty: the journal holds records the last checkpoint lacks.
	dirty bool
	// broken: a write failed, so the files no longer describe the mirror;
	// the checkpoint is removed at once and the next one is taken as soon
	// as it can be.
	broken bool
	last   time.Time
	// writing receives the result of the checkpoint being written, if any.
	writing chan ckptResult
}

type ckptResult struct {
	covered uint64
	bytes   int64
	took    time.Duration
	err     error
}

func newStateStore(cfg *Config, endpoint string, m *metrics, log *slog.Logger) *stateStore {
	return &stateStore{
		dir: cfg.StateDir, interval: cfg.CheckpointInterval, journalMax: int64(cfg.JournalMaxBytes),
		loadMax: int64(cfg.StateMaxBytes), chunkBytes: cfg.SnapshotChunkBytes,
		endpoint: endpoint, pod: cfg.Pod, m: m, log: log.With("state_dir", cfg.StateDir),
	}
}

// load rebuilds the mirror from the directory, if it holds a checkpoint of
// this relay's, and opens a new journal generation for what comes next.
// Anything that does not read back cleanly is discarded: a relay that
// starts afresh is safe, one that starts from a wrong mirror is not.
func (s *stateStore) load(mirror *Mirror) (*restored, error) {
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	rs, err := s.read(mirror)
	if err != nil {
		s.log.Warn("relay state not restored; starting with an empty mirror", "err", err)
		s.m.restores.WithLabelValues("discarded").Inc()
		mirror.Reset("")
		mirror.mu.Lock()
		mirror.pos = Position{}
		mirror.mu.Unlock()
		rs = nil
		s.clear()
	}
	gens, err := journalGens(s.dir)
	if err != nil {
		return nil, err
	}
	// Generations only grow: a journal numbered at or below what the
	// checkpoint covers would be skipped at the next start.
	s.gen = 1
	if n := len(gens); n > 0 {
		s.gen = gens[n-1] + 1
	}
	if rs != nil && rs.journal >= s.gen {
		s.gen = rs.journal + 1
	}
	if rs == nil {
		// A fresh start: a checkpoint of nothing, so that the journal from
		// here on has something to be replayed on.
		if err := s.writeSync(mirror, 0); err != nil {
			return nil, err
		}
	}
	if err := s.openJournal(); err != nil {
		return nil, err
	}
	if rs != nil {
		s.m.restores.WithLabelValues("restored").Inc()
		// The restored state is on disk as checkpoint plus journals; the
		// next checkpoint folds them together.
		s.dirty = true
	}
	return rs, nil
}

// read restores the checkpoint and replays the journals after it; nil
// without error when there is no checkpoint.
func (s *stateStore) read(mirror *Mirror) (*restored, error) {
	path := filepath.Join(s.dir, checkpointFile)
	data, err := readBounded(path, s.loadMax)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: read checkpoint: %w", ErrState, err)
	}
	h, chunks, err := decodeCheckpoint(data)
	if err != nil {
		return nil, err
	}
	if h.Endpoint != s.endpoint || h.Pod != s.pod {
		return nil, fmt.Errorf("%w: checkpoint of %s (%s), this relay is %s (%s)", ErrState, h.Pod, h.Endpoint, s.pod, s.endpoint)
	}
	mirror.restore(h.Position, chunks)
	rs := &restored{pos: h.Position, digest: h.Digest, journal: h.Journal}
	gens, err := journalGens(s.dir)
	if err != nil {
		return nil, err
	}
	var dec events.Decoder
	var b events.Batch
	want := h.Journal + 1
	for _, g := range gens {
		if g <= h.Journal {
			continue
		}
		if g != want {
			return nil, fmt.Errorf("%w: journal %d missing before %d", ErrState, want, g)
		}
		want++
		data, err := readBounded(journalPath(s.dir, g), s.loadMax)
		if err != nil {
			return nil, fmt.Errorf("%w: read journal %d: %w", ErrState, g, err)
		}
		recs, torn := readJournal(data)
		for _, rec := range recs {
			switch rec.kind {
			case recBatch:
				if err := dec.Decode(rec.payload, &b); err != nil {
					mirror.Apply(rec.seq, nil, rec.blockSize, rec.dpRank)
				} else {
					mirror.Apply(rec.seq, &b, rec.blockSize, rec.dpRank)
				}
				rs.digest = xxhash.Sum64(rec.payload)
			case recPosition:
				mirror.setPosition(rec.pos.Reset, rec.pos.Position)
			}
			rs.records++
		}
		rs.journal = g
		if torn {
			// The relay died mid-write: what follows, if anything, was
			// never acknowledged to anyone.
			s.log.Info("journal ends in a torn record; replayed up to it", "journal", g, "records", len(recs))
			break
		}
	}
	rs.pos = mirror.Position()
	return rs, nil
}

// clear removes every state file, after a failure to read them.
func (s *stateStore) clear() {
	_ = os.Remove(filepath.Join(s.dir, checkpointFile))
	gens, _ := journalGens(s.dir)
	for _, g := range gens {
		_ = os.Remove(journalPath(s.dir, g))
	}
}

func (s *stateStore) openJournal() error {
	f, err := os.OpenFile(journalPath(s.dir, s.gen), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("%w: open journal: %w", ErrState, err)
	}
	s.f, s.size = f, 0
	s.m.journalBytes.Set(0)
	return nil
}

// appendBatch journals one batch, as the mirror is given it.
func (s *stateStore) appendBatch(seq uint64, blockSize, dpRank int, payload []byte) {
	if len(payload) > maxRecord-16 {
		s.fail(fmt.Errorf("%w: batch %d of %d bytes is over the journal's record bound", ErrState, seq, len(payload)))
		return
	}
	s.buf = appendRecord(s.buf[:0], recBatch, batchRecordHead(seq, blockSize, dpRank), payload)
	s.write()
}

// appendPosition journals a change of the mirror's position that is not a
// batch: a reset for a new engine instance, or a loss marked.
func (s *stateStore) appendPosition(reset bool, pos Position) {
	body, err := json.Marshal(positionRecord{Reset: reset, Position: pos})
	if err != nil {
		s.fail(fmt.Errorf("%w: position record: %w", ErrState, err))
		return
	}
	s.buf = appendRecord(s.buf[:0], recPosition, body)
	s.write()
}

func (s *stateStore) write() {
	if s.f == nil || s.broken {
		return
	}
	n, err := s.f.Write(s.buf)
	s.size += int64(n)
	s.m.journalBytes.Set(float64(s.size))
	if err != nil {
		s.fail(fmt.Errorf("%w: journal: %w", ErrState, err))
		return
	}
	s.dirty = true
}

// fail marks the files unreliable and removes the checkpoint, so that a
// relay restarted before the next good checkpoint starts afresh.
func (s *stateStore) fail(err error) {
	s.m.checkpointErrors.Inc()
	if !s.broken {
		s.log.Warn("relay state no longer describes the mirror; a restart before the next checkpoint starts afresh", "err", err)
	}
	s.broken = true
	_ = os.Remove(filepath.Join(s.dir, checkpointFile))
}

// due reports whether a checkpoint should be taken now.
func (s *stateStore) due(now time.Time) bool {
	if s.writing != nil || !(s.dirty || s.broken) {
		return false
	}
	return s.broken || s.size >= s.journalMax || now.Sub(s.last) >= s.interval
}

// poll takes the background writer's result, if it has one.
func (s *stateStore) poll() {
	if s.writing == nil {
		return
	}
	select {
	case res := <-s.writing:
		s.writing = nil
		s.finish(res)
	default:
	}
}

func (s *stateStore) finish(res ckptResult) {
	if res.err != nil {
		s.fail(res.err)
		return
	}
	s.m.checkpoints.Inc()
	s.m.checkpointBytes.Set(float64(res.bytes))
	s.m.checkpointSeconds.Observe(res.took.Seconds())
	gens, _ := journalGens(s.dir)
	for _, g := range gens {
		if g <= res.covered {
			_ = os.Remove(journalPath(s.dir, g))
		}
	}
}

// checkpoint captures the mirror between two batches, starts a new journal
// generation, and writes the capture in the background.
func (s *stateStore) checkpoint(mirror *Mirror, digest uint64, now time.Time) {
	mirror.mu.Lock()
	pos, blocks := mirror.pos, mirror.captureLocked()
	mirror.mu.Unlock()
	covered := s.gen
	if s.f != nil {
		_ = s.f.Close()
	}
	s.gen++
	if err := s.openJournal(); err != nil {
		s.f = nil
		s.fail(err)
		return
	}
	s.broken, s.dirty, s.last = false, false, now
	h := checkpointHeader{Endpoint: s.endpoint, Pod: s.pod, Journal: covered, Position: pos, Digest: digest, Written: now.UTC()}
	done := make(chan ckptResult, 1)
	s.writing = done
	go func() {
		start := time.Now()
		n, err := writeFileAtomic(filepath.Join(s.dir, checkpointFile), func(w io.Writer) (int64, error) {
			return encodeCheckpoint(w, h, blocks, s.chunkBytes)
		})
		done <- ckptResult{covered: covered, bytes: n, took: time.Since(start), err: err}
	}()
}

// writeSync writes a checkpoint of the mirror covering journal generation
// covered, in the caller's goroutine.
func (s *stateStore) writeSync(mirror *Mirror, digest uint64) error {
	mirror.mu.Lock()
	pos, blocks := mirror.pos, mirror.captureLocked()
	mirror.mu.Unlock()
	h := checkpointHeader{Endpoint: s.endpoint, Pod: s.pod, Journal: s.gen - 1, Position: pos, Digest: digest, Written: time.Now().UTC()}
	start := time.Now()
	n, err := writeFileAtomic(filepath.Join(s.dir, checkpointFile), func(w io.Writer) (int64, error) {
		return encodeCheckpoint(w, h, blocks, s.chunkBytes)
	})
	s.finish(ckptResult{covered: s.gen - 1, bytes: n, took: time.Since(start), err: err})
	return err
}

// close waits for a checkpoint being written, then writes a last one if
// the journal holds anything since, so that the next start replays
// nothing; the journal is closed.
func (s *stateStore) close(mirror *Mirror, digest uint64) {
	if s.writing != nil {
		s.finish(<-s.writing)
		s.writing = nil
	}
	if s.f != nil {
		_ = s.f.Close()
		s.f = nil
	}
	if s.dirty && !s.broken {
		// The journal of generation s.gen is complete; a checkpoint that
		// covers it makes it redundant.
		s.gen++
		if err := s.writeSync(mirror, digest); err != nil {
			s.log.Warn("last checkpoint not written; the journal will be replayed at the next start", "err", err)
		}
	}
}

// setPosition applies a journalled position record: a reset starts a new
// engine instance; otherwise only the position's knowledge flags change.
func (m *Mirror) setPosition(reset bool, p Position) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if reset {
		m.clear()
	}
	m.pos = p
}

// restore reads the relay's saved state, if it keeps one, before it
// starts: the mirror as it stood at the last batch, and the engine's
// instance, which the first batch then confirms or not (resume).
func (r *Relay) restore() error {
	if r.store == nil {
		return nil
	}
	rs, err := r.store.load(r.mirror)
	if err != nil {
		return err
	}
	if rs == nil || !rs.pos.Valid {
		return nil
	}
	r.restored = rs
	r.instance, r.last, r.lastDigest = rs.pos.Instance, rs.pos.Seq, rs.digest
	if r.blockSize == 0 {
		r.blockSize = rs.pos.BlockSize
	}
	r.dpRank = rs.pos.DPRank
	held, ghost, _ := r.mirror.Counts()
	r.log.Info("relay state restored", "instance", rs.pos.Instance, "seq", rs.pos.Seq,
		"state", rs.pos.SnapshotState(), "held_blocks", held, "ghost_blocks", ghost, "journal_records", rs.records)
	r.gauges()
	return nil
}

// resume decides, at the first batch after a start from saved state,
// whether the engine is the one the state describes. It is if its seq went
// on past the saved one and, where the engine keeps a replay ring, the
// ring's copy of the last saved batch is the very batch saved: then the
// relay keeps the instance and fills the gap its own downtime made, as for
// any gap, and the EPP sees a gap at most. A seq that went back, or a
// different batch at the saved seq, is a new engine. Without a ring to ask
// (or one that has moved past the saved seq) the relay keeps the instance
// unverified: an engine restarts far more slowly than a sidecar, and would
// have to publish past the saved seq in between. It returns false when msg
// is the saved batch itself, which is dropped.
func (r *Relay) resume(ctx context.Context, msg engineMsg) bool {
	rs := r.restored
	r.restored = nil
	saved := rs.pos.Seq
	newEngine := func(why string) {
		r.m.resumes.WithLabelValues("new_engine").Inc()
		r.m.restarts.Inc()
		r.log.Info("engine restarted while the relay was down", "saved_seq", saved, "seq", msg.seq, "why", why)
		r.newInstance()
		r.fillHistory(ctx, msg.seq)
	}
	if msg.seq <= saved {
		if msg.seq == saved && xxhash.Sum64(msg.payload) == rs.digest {
			r.haveLast = true
			r.m.resumes.WithLabelValues("same_engine").Inc()
			return false
		}
		newEngine("seq went back")
		return true
	}
	got, err := r.replay(ctx, saved, msg.seq)
	if len(got) > 0 && got[0].seq == saved {
		if xxhash.Sum64(got[0].payload) != rs.digest {
			newEngine("another batch at the saved seq")
			return true
		}
		r.m.resumes.WithLabelValues("same_engine").Inc()
		r.log.Info("relay resumed its engine's stream", "instance", r.instance, "saved_seq", saved, "seq", msg.seq)
		r.haveLast = true
		r.settleGap(saved+1, msg.seq, got[1:], err)
		return true
	}
	r.m.resumes.WithLabelValues("unverified").Inc()
	r.log.Info("relay resumed its engine's stream unverified (no replay ring holds the saved batch)",
		"instance", r.instance, "saved_seq", saved, "seq", msg.seq, "replay", r.rp != nil, "err", err)
	r.haveLast = true
	if msg.seq > saved+1 {
		r.settleGap(saved+1, msg.seq, got, err)
	}
	return true
}

// maintain takes a checkpoint when one is due.
func (r *Relay) maintain(now time.Time) {
	if r.store == nil {
		return
	}
	r.store.poll()
	if r.store.due(now) {
		r.store.checkpoint(r.mirror, r.lastDigest, now)
	}
}

// beat queues a heartbeat: the last batch relayed, behind the batches
// before it. Before any batch (and without saved state) there is nothing
// to say.
func (r *Relay) beat() {
	if !r.haveLast && r.restored == nil {
		return
	}
	r.box.pushHeartbeat(outItem{origin: r.origin(r.last), heartbeat: true})
}

// tickEvery is the period of the relay's housekeeping: heartbeats and
// checkpoint checks.
func (r *Relay) tickEvery() time.Duration {
	d := time.Second
	if hb := r.cfg.HeartbeatInterval; hb > 0 && hb < d {
		d = hb
	}
	return d
}
