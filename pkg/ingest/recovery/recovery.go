// Package recovery keeps the exact prefix index in step with the engines'
// caches when their event streams break. It sits between the event
// consumer and the index as an events.Sink: when a stream becomes uncertain
// (a gap, a reconnect, a slow consumer, a parent the index never saw) or an
// endpoint joins, it asks that endpoint's relay for a snapshot over NATS
// (docs/snapshot.md), holds the stream's live batches back meanwhile, and
// installs the snapshot followed by the held batches, so that the index
// becomes exact again without waiting for the engine to repeat itself.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
)

// Target is what recovery drives: the index. It receives the live stream
// as a Sink, and snapshots through InstallSnapshot.
type Target interface {
	events.Sink
	// InstallSnapshot replaces the stream's state with the one chunks
	// rebuild, positions it at o.Seq under o.Instance, and leaves it
	// recovering.
	InstallSnapshot(o events.Origin, chunks []*events.Batch) error
	// MarkStreamExact declares the stream in step again.
	MarkStreamExact(s events.Stream)
	// SetStreamState sets what the stream's answers can claim: recovering
	// while a resync is due, partial or exact once one succeeded,
	// uncertain when one failed.
	SetStreamState(s events.Stream, state datalayer.StreamState)
}

// Options configure a Recovery. Zero values mean the documented defaults.
type Options struct {
	// Namespace and Pool give the snapshot subjects
	// kv.snapshot.<Namespace>.<Pool>.<pod>. Both are required.
	Namespace, Pool string
	// Pod returns the pod name of the endpoint at addr, as discovery knows
	// it; the snapshot subject is the pod's. ok false means addr is not in
	// the pool: its batches pass to the target untracked (the index drops
	// them), so that a publisher inventing endpoints cannot grow recovery's
	// state. Nil tracks every stream and takes the pod from the Kv-Pod
	// header of the stream's live batches.
	Pod func(addr string) (pod string, ok bool)
	// Timeout bounds one snapshot, request to last chunk (default 10s).
	Timeout time.Duration
	// MaxSnapshotBytes bounds one snapshot's payload (default 256 MiB,
	// some three million blocks).
	MaxSnapshotBytes int
	// MaxHeldBatches bounds the live batches held back for one stream
	// while its snapshot is awaited (default 4096). Past it the resync is
	// abandoned, the held batches applied, and a new one started.
	MaxHeldBatches int
	// MaxHeldBytes bounds the same batches by the memory their copies
	// take (default 64 MiB): a stream's own relay decides how large its
	// batches are. Past it the resync is abandoned in the same way.
	MaxHeldBytes int
	// Concurrency bounds the snapshots in flight at once (default 4), so
	// that an EPP that lost every stream does not ask every relay at once.
	Concurrency int
	// MinBackoff and MaxBackoff bound the wait before a failed resync is
	// tried again (defaults 250ms and 30s); it doubles per failure, with
	// jitter, so that replicas do not retry in step.
	MinBackoff, MaxBackoff time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// ErrOptions is returned by New for options that cannot work.
var ErrOptions = errors.New("invalid recovery options")

// Other results of a resync, beside the snapshot errors.
var (
	// ErrNoPod: the endpoint's pod, and so its snapshot subject, is unknown.
	ErrNoPod = errors.New("pod of endpoint unknown")
	// ErrOverflow: more live batches arrived during the resync than
	// MaxHeldBatches.
	ErrOverflow = errors.New("held batches over their bound")
	// ErrInstanceMismatch: the snapshot describes another engine instance
	// than the live stream shows.
	ErrInstanceMismatch = errors.New("snapshot of another engine instance")
	// ErrAborted: the engine restarted or the endpoint left during the resync.
	ErrAborted = errors.New("resync aborted")
)

// Recovery is an events.Sink that resynchronises streams from their relays'
// snapshots. Give it to the consumer in place of the index, and call Run.
type Recovery struct {
	opts   Options
	nc     *nats.Conn
	target Target
	log    *slog.Logger
	m      *metrics

	mu      sync.Mutex
	streams map[events.Stream]*stream
	gates   map[string]*endpointGate
	running int
	wake    chan struct{}

	// logs bounds the lines resync outcomes write: a relay's answers are
	// input from the network.
	logs *rate.Limiter
}

var _ events.Sink = (*Recovery)(nil)

// stream is recovery's view of one engine's stream.
type stream struct {
	id events.Stream

	// mu orders the consumer's calls for the stream with an install, so
	// that no live batch slips between a snapshot and the batches held
	// back behind it. Taken before Recovery.mu, never after.
	mu sync.Mutex
	// holding: a snapshot has been requested, and live batches are kept
	// in held instead of applied.
	holding bool
	held    []heldBatch
	// gen changes whenever a resync is abandoned, so that an install of a
	// snapshot fetched for an older generation is refused.
	gen uint64
	// doubt: an uncertainty that a later batch's seq may not reveal (a
	// reconnect, a slow consumer) arrived while holding; gapped: a gap did.
	// An install judges gaps by the held batches' seq; a failed resync
	// passes both on when it lets go.
	doubt, gapped bool
	// pos is the last batch handed to the target or installed; suspect
	// says the consumer reported a gap whose reality the next batch shows.
	pos     position
	suspect bool
	pod     string
	// live is the newest position the publisher has shown, by a batch or
	// a heartbeat: a snapshot older than it is not enough.
	live position
	// recovering: the stream was declared broken and marked recovering;
	// the resync's failure must then leave it uncertain, never recovering.
	recovering bool

	// Guarded by Recovery.mu. want asks for a resync until one succeeds;
	// joined asks for one attempt, for an endpoint that joined: if its
	// relay does not answer, the live stream is all there is, as without
	// recovery.
	want      bool
	joined    bool
	inFlight  bool
	failures  int
	notBefore time.Time
	// joinTried: the stream's one attempt for a join (or late join) has
	// been made; a heartbeat of a stream never applied asks no more.
	joinTried bool
	// heardRetried: a resync that had failed (its relay unreachable when
	// the endpoint joined) was retried at once when the relay was first
	// heard from, rather than after its backoff; once per stream.
	heardRetried bool
}

type position struct {
	instance string
	seq      uint64
	valid    bool
}

type heldBatch struct {
	o events.Origin
	b *events.Batch
}

// New returns a Recovery that requests snapshots over nc and installs them
// into target. Its metrics are registered with reg unless reg is nil.
func New(opts Options, target Target, nc *nats.Conn, reg prometheus.Registerer) (*Recovery, error) {
	switch {
	case nc == nil:
		return nil, fmt.Errorf("%w: %w", ErrOptions, events.ErrNoConn)
	case target == nil:
		return nil, fmt.Errorf("%w: nil target", ErrOptions)
	case opts.Namespace == "" || opts.Pool == "":
		return nil, fmt.Errorf("%w: namespace and pool are required", ErrOptions)
	case opts.Timeout < 0 || opts.MaxSnapshotBytes < 0 || opts.MaxHeldBatches < 0 || opts.MaxHeldBytes < 0 || opts.Concurrency < 0 || opts.MinBackoff < 0 || opts.MaxBackoff < 0:
		return nil, fmt.Errorf("%w: negative bound", ErrOptions)
	}
	if opts.Timeout == 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.MaxSnapshotBytes == 0 {
		opts.MaxSnapshotBytes = 256 << 20
	}
	if opts.MaxHeldBatches == 0 {
		opts.MaxHeldBatches = 4096
	}
	if opts.MaxHeldBytes == 0 {
		opts.MaxHeldBytes = DefaultMaxHeldBytes
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = 4
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = 250 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	opts.MaxBackoff = max(opts.MaxBackoff, opts.MinBackoff)
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Recovery{
		opts:    opts,
		nc:      nc,
		target:  target,
		log:     log.With("component", "kv-recovery"),
		m:       m,
		streams: make(map[events.Stream]*stream),
		gates:   make(map[string]*endpointGate),
		wake:    make(chan struct{}, 1),
		logs:    rate.NewLimiter(rate.Every(time.Second), 4),
	}, nil
}

func (r *Recovery) get(s events.Stream) *stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := r.streams[s]
	if st == nil {
		st = &stream{id: s}
		r.streams[s] = st
	}
	return st
}

// tracked returns the stream's state, or nil for an endpoint discovery
// does not know. Discovery is asked only for a stream not yet tracked.
func (r *Recovery) tracked(s events.Stream) *stream {
	r.mu.Lock()
	st := r.streams[s]
	r.mu.Unlock()
	if st != nil || r.opts.Pod == nil {
		return r.get(s)
	}
	if _, ok := r.opts.Pod(s.Endpoint); !ok {
		return nil
	}
	return r.get(s)
}

// Apply passes a batch to the target, or holds a copy of it back while the
// stream's snapshot is awaited.
func (r *Recovery) Apply(o events.Origin, b *events.Batch) {
	st := r.tracked(o.Stream)
	if st == nil {
		r.target.Apply(o, b)
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if o.Pod != "" && o.Pod != st.pod {
		st.pod = o.Pod
	}
	st.live.advance(o)
	if st.suspect {
		st.suspect = false
		// The consumer saw a gap against its own position; against ours,
		// which a snapshot may have moved past it, the batch may follow on.
		if !st.pos.valid || o.Instance != st.pos.instance || o.Seq > st.pos.seq+1 {
			r.uncertainLocked(st, events.ReasonGap)
		}
	}
	if st.holding {
		if len(st.held) < r.opts.MaxHeldBatches && heldBytes(st.held)+batchBytes(b) <= r.opts.MaxHeldBytes {
			st.held = append(st.held, heldBatch{o: o, b: cloneBatch(b)})
			r.m.held.Inc()
			return
		}
		// Past the bound: give up this resync, catch up on what was held,
		// and start again.
		r.release(st)
		r.m.result(ErrOverflow)
		r.want(st, true)
	}
	r.apply(st, o, b)
}

// apply hands a live batch to the target and moves the stream's position.
// Called with st.mu held.
func (r *Recovery) apply(st *stream, o events.Origin, b *events.Batch) {
	r.target.Apply(o, b)
	if !st.pos.valid || o.Instance != st.pos.instance || o.Seq > st.pos.seq {
		st.pos = position{instance: o.Instance, seq: o.Seq, valid: true}
	}
}

// release stops holding: it applies the held batches in order and forgets
// the resync under way. Called with st.mu held.
func (r *Recovery) release(st *stream) {
	held, doubt, gapped := st.held, st.doubt, st.gapped
	st.holding, st.held, st.doubt, st.gapped = false, nil, false, false
	st.gen++
	r.m.held.Sub(float64(len(held)))
	switch {
	case doubt:
		r.uncertainLocked(st, events.ReasonReconnect)
	case gapped:
		r.uncertainLocked(st, events.ReasonGap)
	}
	for _, h := range held {
		r.apply(st, h.o, h.b)
	}
}

// Uncertain passes the report to the target and schedules a resync. A gap
// is judged at the next batch instead (see Apply), since a snapshot may
// already have covered it; while a snapshot is awaited, gaps are found by
// the held batches' seq and other doubts are kept for after the install.
func (r *Recovery) Uncertain(s events.Stream, reason events.Reason) {
	st := r.tracked(s)
	if st == nil {
		r.target.Uncertain(s, reason)
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	seqJudged := reason == events.ReasonGap || reason == events.ReasonLateJoin
	switch {
	case st.holding:
		if seqJudged {
			st.gapped = true
		} else {
			st.doubt = true
		}
	case seqJudged && st.pos.valid:
		st.suspect = true
	case reason == events.ReasonLateJoin:
		r.lateJoinLocked(st)
	default:
		r.uncertainLocked(st, reason)
	}
}

// uncertainLocked passes an uncertainty on, marks the stream recovering and
// schedules its resync. Called with st.mu held.
func (r *Recovery) uncertainLocked(st *stream, reason events.Reason) {
	r.target.Uncertain(st.id, reason)
	r.target.SetStreamState(st.id, datalayer.StreamRecovering)
	st.recovering = true
	r.want(st, false)
}

// Restart passes the report on: the new engine starts empty, which the
// target knows exactly, so a resync under way or wanted is abandoned.
func (r *Recovery) Restart(s events.Stream) {
	st := r.tracked(s)
	if st == nil {
		r.target.Restart(s)
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.holding {
		// The held batches are the old engine's, which the restart wipes.
		r.m.held.Sub(float64(len(st.held)))
		st.holding, st.held, st.doubt, st.gapped = false, nil, false, false
		st.gen++
	}
	st.pos, st.live, st.suspect = position{}, position{}, false
	r.target.Restart(s)
	r.mu.Lock()
	st.want, st.failures = false, 0
	r.mu.Unlock()
}

// OnUncertain is for the index's IndexOptions.OnUncertain: the index found
// the stream inconsistent (a parent it never saw) and has marked it
// uncertain already. It may be called while the stream's batch is being
// applied, so it only schedules.
func (r *Recovery) OnUncertain(s events.Stream, _ events.Reason) {
	if st := r.tracked(s); st != nil {
		r.target.SetStreamState(s, datalayer.StreamRecovering)
		r.want(st, false)
	}
}

// AddEndpoint asks for the snapshot of an endpoint that joined the pool
// (its rank-0 stream; other ranks are found when their batches arrive):
// whatever it published before is unknown to the index. If no relay
// answers, nothing more is done: the live stream, and the consumer's gap
// reports, decide the endpoint's state as they would without recovery, so
// that engines publishing straight to NATS, with no relay, are not asked
// again and again. A relay that answers but cannot help yet (it has
// relayed nothing, or the live stream lost batches while the snapshot was
// fetched) is asked again with backoff, as for any uncertain stream: the
// batches it relays next may all be lost to a slow consumer, and then no
// later seq would show the gap.
func (r *Recovery) AddEndpoint(addr string) {
	st := r.get(events.Stream{Endpoint: addr})
	r.mu.Lock()
	st.joined = true
	r.mu.Unlock()
	r.kick()
}

// RemoveEndpoint forgets an endpoint's streams and abandons their resyncs.
func (r *Recovery) RemoveEndpoint(addr string) {
	gone := r.streamsOf(addr, true)
	r.mu.Lock()
	delete(r.gates, addr)
	r.mu.Unlock()
	for _, st := range gone {
		st.mu.Lock()
		if st.holding {
			r.m.held.Sub(float64(len(st.held)))
		}
		st.holding, st.held = false, nil
		st.gen++
		st.mu.Unlock()
	}
}

// Resync schedules a resynchronisation of s now, whatever its backoff.
func (r *Recovery) Resync(s events.Stream) {
	st := r.get(s)
	r.mu.Lock()
	st.notBefore = time.Time{}
	r.mu.Unlock()
	r.want(st, false)
}

// want marks the stream as needing a resync and wakes Run. now skips the
// stream's backoff.
func (r *Recovery) want(st *stream, now bool) {
	r.mu.Lock()
	st.want = true
	if now {
		st.notBefore = time.Time{}
	}
	r.mu.Unlock()
	r.kick()
}

// kick wakes Run.
func (r *Recovery) kick() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// Pending returns how many streams await a resync or have one in flight.
func (r *Recovery) Pending() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, st := range r.streams {
		if st.want || st.joined || st.inFlight {
			n++
		}
	}
	return n
}

// Settling counts the streams whose resync is in flight or due and has not
// failed yet: what a replica that has just started is still catching up
// on. A stream whose resync failed waits out its backoff uncounted, so
// that one unreachable relay does not hold the count up.
func (r *Recovery) Settling() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, st := range r.streams {
		if st.inFlight || st.joined || (st.want && st.failures == 0) {
			n++
		}
	}
	return n
}

// Run starts the resyncs that are due, at most Concurrency at once, until
// ctx is done; it returns once every resync it started has ended.
func (r *Recovery) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := r.startDue(ctx, &wg)
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		if !next.IsZero() {
			timer.Reset(max(time.Until(next), time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-timer.C:
		}
	}
}

// startDue starts every due resync the concurrency bound allows and
// returns when the next one not yet due will be (zero if none waits).
func (r *Recovery) startDue(ctx context.Context, wg *sync.WaitGroup) time.Time {
	now := time.Now()
	var next time.Time
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.streams {
		if (!st.want && !st.joined) || st.inFlight {
			continue
		}
		if st.want && st.notBefore.After(now) {
			if next.IsZero() || st.notBefore.Before(next) {
				next = st.notBefore
			}
			continue
		}
		if r.running >= r.opts.Concurrency {
			continue // a finishing resync wakes Run
		}
		if blocked, until := r.gateBlocks(st.id.Endpoint, now); blocked {
			if !until.IsZero() && (next.IsZero() || until.Before(next)) {
				next = until
			}
			continue
		}
		r.gate(st.id.Endpoint).inFlight = true
		once := !st.want
		st.want, st.joined, st.inFlight = false, false, true
		r.running++
		r.m.inFlight.Inc()
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.resync(ctx, st)
			r.finish(st, err, once)
		}()
	}
	return next
}

// finish records a resync's end and schedules the next one if it failed,
// unless it was a joined endpoint's one attempt.
func (r *Recovery) finish(st *stream, err error, once bool) {
	r.m.result(err)
	r.m.inFlight.Dec()
	if errors.Is(err, errPartial) {
		err = nil // a partial snapshot is all there is to have: settled
	}
	// A stream that never had a position (nothing applied or installed)
	// and was never declared broken has nothing to be wrong about: a failed
	// join leaves it as it was.
	st.mu.Lock()
	known := st.pos.valid || st.recovering
	if err == nil || errors.Is(err, errPartial) {
		st.recovering = false
	}
	st.mu.Unlock()
	uncertain := false
	r.mu.Lock()
	r.running--
	st.inFlight = false
	if once {
		st.joinTried = true
	}
	failures := st.failures
	failed := false
	switch {
	case err == nil:
		st.failures = 0
	case errors.Is(err, ErrAborted), errors.Is(err, context.Canceled):
	case once && (errors.Is(err, ErrNoResponders) || errors.Is(err, ErrNoPod)):
		failures = -1 // no relay to ask, nor a warning: see AddEndpoint
	default:
		failed = true
		st.failures++
		st.want = true
		n := st.failures
		if errors.Is(err, ErrInexact) {
			// The relay's mirror stays inexact until its engine restarts
			// or clears its cache: asking again soon cannot help.
			n = maxBackoffFailures
		}
		st.notBefore = time.Now().Add(r.backoff(n))
		uncertain = known && leavesUncertain(err, once, st.failures)
	}
	r.gateDone(st.id.Endpoint, failed, time.Now())
	r.mu.Unlock()
	if uncertain {
		r.target.SetStreamState(st.id, datalayer.StreamUncertain)
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
	// One line when a stream starts failing and one when it recovers; the
	// retries between are counted, not logged, and the lines of all
	// streams together are rate-limited.
	quiet := errors.Is(err, ErrAborted) || errors.Is(err, context.Canceled) || errors.Is(err, ErrInexact)
	switch {
	case err == nil && failures > 0:
		if r.logs.Allow() {
			r.log.Info("stream resynchronised", "stream", st.id.String(), "failed_attempts", failures)
		}
	case err != nil && failures == 0 && !quiet:
		if r.logs.Allow() {
			r.log.Warn("stream resync failed; answers for it stay approximate, retrying with backoff", "stream", st.id.String(), "err", err)
		}
	case err != nil:
		r.log.Debug("stream resync failed", "stream", st.id.String(), "err", err)
	}
}

// backoff is MinBackoff doubled per failure up to MaxBackoff, less up to
// a fifth at random.
func (r *Recovery) backoff(failures int) time.Duration {
	d := r.opts.MinBackoff
	for i := 1; i < failures && d < r.opts.MaxBackoff; i++ {
		d *= 2
	}
	d = min(d, r.opts.MaxBackoff)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// resync requests the stream's snapshot and installs it with the batches
// held back meanwhile.
func (r *Recovery) resync(ctx context.Context, st *stream) error {
	start := time.Now()
	pod := r.pod(st)
	if pod == "" {
		return fmt.Errorf("resync %s: %w", st.id, ErrNoPod)
	}
	st.mu.Lock()
	st.gen++
	gen := st.gen
	st.holding, st.held, st.doubt, st.gapped = true, nil, false, false
	st.mu.Unlock()

	snap, err := r.fetch(ctx, pod, st.id)

	st.mu.Lock()
	defer st.mu.Unlock()
	if st.gen != gen {
		return fmt.Errorf("resync %s: %w", st.id, ErrAborted)
	}
	if err != nil {
		r.release(st)
		return fmt.Errorf("resync %s: %w", st.id, err)
	}
	live := st.pos
	if len(st.held) > 0 {
		h := st.held[len(st.held)-1].o
		live = position{instance: h.Instance, seq: h.Seq, valid: true}
	}
	if st.live.valid && st.live.instance != live.instance {
		// A heartbeat named an instance no batch has shown yet.
		live = st.live
	}
	if live.valid && live.instance != snap.origin.Instance {
		r.release(st)
		return fmt.Errorf("resync %s: %w: snapshot %q, live stream %q", st.id, ErrInstanceMismatch, snap.origin.Instance, live.instance)
	}
	return r.install(st, snap, start)
}

// install puts the snapshot and the held batches after it into the target.
// Called with st.mu held.
func (r *Recovery) install(st *stream, snap *snapshot, start time.Time) error {
	installErr := r.target.InstallSnapshot(snap.origin, snap.chunks)
	st.pos = position{instance: snap.origin.Instance, seq: snap.origin.Seq, valid: true}
	held, doubt := st.held, st.doubt
	st.holding, st.held, st.doubt, st.gapped = false, nil, false, false
	st.gen++
	r.m.held.Sub(float64(len(held)))
	gap := false
	for _, h := range held {
		if h.o.Instance != snap.origin.Instance || h.o.Seq <= snap.origin.Seq {
			continue // what the snapshot includes already
		}
		if h.o.Seq != st.pos.seq+1 {
			gap = true
		}
		r.apply(st, h.o, h.b)
	}
	if st.live.valid && st.live.instance == st.pos.instance && st.live.seq > st.pos.seq {
		// A heartbeat named a batch neither the snapshot nor the held
		// batches include: the stream's tail was lost meanwhile.
		gap = true
	}
	r.m.blocks.Observe(float64(snap.blocks))
	r.m.duration.Observe(time.Since(start).Seconds())

	if snap.state == events.SnapshotPartial && errors.Is(installErr, index.ErrUnknownParentInSnapshot) {
		// A relay that joined late names parents it never saw, as the
		// live stream did: missing knowledge, which partial says.
		installErr = nil
	}
	var err error
	switch {
	case installErr != nil:
		err = installErr
	case snap.state == events.SnapshotInexact:
		err = fmt.Errorf("%w: relay's mirror is incomplete (Kv-Snapshot-Exact false)", ErrInexact)
	case gap:
		err = fmt.Errorf("%w: held batches do not follow seq %d", ErrGap, snap.origin.Seq)
	case doubt:
		err = ErrDoubt
	}
	if err != nil {
		return fmt.Errorf("resync %s: %w", st.id, err)
	}
	r.mu.Lock()
	pending := st.want // the index found an unknown parent in a held batch
	r.mu.Unlock()
	if pending {
		return nil
	}
	if snap.state == events.SnapshotPartial {
		r.target.SetStreamState(st.id, datalayer.StreamPartial)
		return errPartial
	}
	r.target.MarkStreamExact(st.id)
	return nil
}

// ErrInexact: the relay says its snapshot is its best knowledge, not the
// engine's exact state. It is installed, but the stream stays uncertain,
// and is asked again only after the longest backoff.
var ErrInexact = errors.New("snapshot inexact")

// errPartial is the result of a resync that installed a partial snapshot
// (the relay joined its engine late): a success, counted apart.
var errPartial = errors.New("snapshot partial")

// maxBackoffFailures is a failure count whose backoff is MaxBackoff for any
// sane bounds.
const maxBackoffFailures = 64

// transientFailures is how many resyncs in a row may fail for reasons the
// next attempt is likely to clear (the live stream lost more batches
// meanwhile) before the stream reads uncertain rather than recovering.
const transientFailures = 3

// leavesUncertain says whether a failed resync leaves its stream uncertain.
// A join's first attempt leaves the state to the live stream; a resync
// whose live stream moved on under it, or whose relay has just started and
// relayed nothing yet, stays recovering for a few tries; anything else (no
// relay, an inexact mirror, a bad or late snapshot) means the break could
// not be healed.
func leavesUncertain(err error, once bool, failures int) bool {
	switch {
	case once:
		return false
	case errors.Is(err, ErrGap), errors.Is(err, ErrDoubt), errors.Is(err, ErrOverflow), errors.Is(err, ErrRefused):
		return failures >= transientFailures
	}
	return true
}

// Results of an install that leave the stream uncertain and a resync due.
var (
	// ErrGap: the batches held back do not follow on from the snapshot.
	ErrGap = errors.New("live stream has a gap after the snapshot")
	// ErrDoubt: a reconnect or slow consumer during the resync may have
	// lost batches that no later seq would reveal.
	ErrDoubt = errors.New("live stream may have lost batches during the resync")
)

// pod is the snapshot subject's pod for the stream: discovery's, else the
// live stream's Kv-Pod.
func (r *Recovery) pod(st *stream) string {
	if r.opts.Pod != nil {
		if p, ok := r.opts.Pod(st.id.Endpoint); ok && p != "" {
			return p
		}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.pod
}

// cloneBatch deep-copies what the consumer reuses after Apply returns. A
// decoded event's extra keys are allocated afresh for each batch and never
// reused, so they are shared.
func cloneBatch(b *events.Batch) *events.Batch {
	c := &events.Batch{TS: b.TS, DPRank: b.DPRank, HasDPRank: b.HasDPRank, Skipped: b.Skipped,
		Events: make([]events.Event, len(b.Events))}
	for i := range b.Events {
		e := b.Events[i]
		e.BlockHashes = append([]uint64(nil), e.BlockHashes...)
		e.TokenIDs = append([]uint32(nil), e.TokenIDs...)
		c.Events[i] = e
	}
	return c
}
