package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
)

// Defaults for the zero values of Config.
const (
	// DefaultZMQEndpoint is on loopback: whatever arrives on it is
	// published under the pod's identity, so only the pod may reach it.
	DefaultZMQEndpoint   = "tcp://127.0.0.1:5557"
	DefaultReplayTimeout = 2 * time.Second
	DefaultBufferBatches = 10000
	DefaultBufferBytes   = 64 << 20
	// DefaultMirrorMaxBlocks covers a large GPU's cache plus a CPU tier;
	// set it to the pod's real cache size where that is known.
	DefaultMirrorMaxBlocks = 1 << 20
	// DefaultHeartbeatInterval is how often the relay says where it is.
	DefaultHeartbeatInterval = time.Second
)

// Errors returned by New and Run.
var (
	// ErrConfig: the configuration cannot describe a relay.
	ErrConfig = errors.New("invalid relay config")
	// ErrUsed: Run was called a second time; a Relay runs once.
	ErrUsed = errors.New("relay already run")
)

// Config configures a Relay. Zero values mean the documented defaults.
type Config struct {
	// ZMQEndpoint is where the engine's KV events come from (default
	// DefaultZMQEndpoint). The relay binds it, unless Connect is set.
	ZMQEndpoint string
	// Connect dials ZMQEndpoint instead of binding it: for an engine whose
	// own endpoint holds '*' (or is ipc://), which makes the engine bind.
	Connect bool
	// Topic is the subscription prefix; empty takes every topic.
	Topic string
	// ReplayEndpoint is the engine's replay socket; empty means gaps are
	// not filled, only counted.
	ReplayEndpoint string
	// ReplayTimeout bounds one replay, dial included (default 2s).
	ReplayTimeout time.Duration

	// Namespace and Pool choose the subjects; Pod names the pod on them.
	// All three are required.
	Namespace, Pool, Pod string
	// PodIP and ServingPort make Kv-Endpoint, the address the gateway
	// routes to. Both are required.
	PodIP       string
	ServingPort int
	// Model is sent as Kv-Model.
	Model string
	// DPRank is the engine's data-parallel rank, used when a batch does not
	// carry its own.
	DPRank int
	// BlockSize is the engine's block size; 0 means learn it from the
	// first stored block.
	BlockSize int

	// BufferBatches and BufferBytes bound the batches held while NATS is
	// away (defaults DefaultBufferBatches, DefaultBufferBytes).
	BufferBatches, BufferBytes int
	// MirrorMaxBlocks bounds the mirror (default DefaultMirrorMaxBlocks).
	MirrorMaxBlocks int
	// SnapshotChunkBytes bounds each snapshot reply (default 512 KiB).
	SnapshotChunkBytes int

	// StateDir keeps the mirror across restarts of the relay: a directory
	// on a volume the pod keeps across container restarts (an emptyDir).
	// A restarted relay rebuilds its mirror from it, keeps the engine's
	// Kv-Instance, and serves full snapshots at once. Empty keeps nothing:
	// a restarted relay then starts a new Kv-Instance with an empty
	// mirror, which the EPP takes for an engine restart.
	StateDir string
	// CheckpointInterval is the least time between two checkpoints of the
	// mirror (default 30s), which bounds the write rate; between them the
	// journal records each batch.
	CheckpointInterval time.Duration
	// JournalMaxBytes takes a checkpoint before the journal grows past it,
	// sooner than CheckpointInterval if need be (default 64 MiB).
	JournalMaxBytes int
	// StateMaxBytes bounds what is read back from StateDir (default 1 GiB).
	StateMaxBytes int
	// HeartbeatInterval is how often the relay publishes a heartbeat, its
	// last seq on the stream's subject (default 1s; negative: none), so that
	// a consumer that lost the last batches of a quiet stream finds out.
	HeartbeatInterval time.Duration

	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Registerer receives the relay's metrics; nil registers none.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() error {
	if c.ZMQEndpoint == "" {
		c.ZMQEndpoint = DefaultZMQEndpoint
	}
	if c.ReplayTimeout <= 0 {
		c.ReplayTimeout = DefaultReplayTimeout
	}
	if c.BufferBatches <= 0 {
		c.BufferBatches = DefaultBufferBatches
	}
	if c.BufferBytes <= 0 {
		c.BufferBytes = DefaultBufferBytes
	}
	if c.MirrorMaxBlocks <= 0 {
		c.MirrorMaxBlocks = DefaultMirrorMaxBlocks
	}
	if c.SnapshotChunkBytes <= 0 {
		c.SnapshotChunkBytes = DefaultSnapshotChunkBytes
	}
	if c.CheckpointInterval <= 0 {
		c.CheckpointInterval = DefaultCheckpointInterval
	}
	if c.JournalMaxBytes <= 0 {
		c.JournalMaxBytes = DefaultJournalMaxBytes
	}
	if c.StateMaxBytes <= 0 {
		c.StateMaxBytes = DefaultStateMaxBytes
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case c.Namespace == "" || c.Pool == "" || c.Pod == "":
		return fmt.Errorf("%w: namespace, pool and pod are required", ErrConfig)
	case c.PodIP == "" || c.ServingPort <= 0 || c.ServingPort > 65535:
		return fmt.Errorf("%w: pod IP and serving port (1-65535) are required", ErrConfig)
	case c.DPRank < 0 || c.BlockSize < 0:
		return fmt.Errorf("%w: negative DP rank or block size", ErrConfig)
	}
	return nil
}

// Relay carries one engine's KV-event batches from its ZeroMQ publisher to
// NATS, unchanged, under the NATS contract. It fills sequence gaps from the
// engine's replay socket, holds batches while NATS is away, and answers
// snapshot requests from a mirror of the engine's cache.
type Relay struct {
	cfg      Config
	nc       *nats.Conn
	pub      *events.Publisher
	m        *metrics
	mirror   *Mirror
	box      *outbox
	in       intake
	rp       *replayer
	log      *slog.Logger
	endpoint string
	started  time.Time
	used     atomic.Bool

	// The rest belongs to the goroutine in Run that handles batches.
	dec      events.Decoder
	batch    events.Batch
	last     uint64
	haveLast bool
	// lastDigest is the xxhash of the last batch's payload, which tells
	// the same engine from another after a restart of the relay.
	lastDigest uint64
	// restored is the position read back from StateDir, until the first
	// batch after the start settles whether the engine is the same.
	restored  *restored
	store     *stateStore
	instance  string
	blockSize int
	dpRank    int
	rankWarn  bool
	evicted   uint64
	decodeLog time.Time
}

// New checks cfg and returns a relay that publishes on nc. nc's owner
// closes it after Run returns; DialNATS makes one with the reconnect
// behaviour a relay wants.
func New(cfg Config, nc *nats.Conn) (*Relay, error) {
	if nc == nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, events.ErrNoConn)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	r := &Relay{
		cfg:       cfg,
		nc:        nc,
		pub:       events.NewPublisher(nc, cfg.Namespace, cfg.Pool),
		m:         m,
		mirror:    NewMirror(cfg.MirrorMaxBlocks),
		box:       newOutbox(cfg.BufferBatches, cfg.BufferBytes, m),
		log:       slog.New(throttled(cfg.Logger.Handler())).With("pod", cfg.Pod),
		endpoint:  net.JoinHostPort(cfg.PodIP, strconv.Itoa(cfg.ServingPort)),
		in:        intake{endpoint: cfg.ZMQEndpoint, topic: cfg.Topic, bind: !cfg.Connect},
		started:   time.Now(),
		blockSize: cfg.BlockSize,
		dpRank:    cfg.DPRank,
	}
	if cfg.ReplayEndpoint != "" {
		r.rp = &replayer{endpoint: cfg.ReplayEndpoint, timeout: cfg.ReplayTimeout}
	}
	if cfg.StateDir != "" {
		r.store = newStateStore(&r.cfg, r.endpoint, m, r.log)
	}
	return r, nil
}

// Mirror returns the relay's mirror of the engine's cache.
func (r *Relay) Mirror() *Mirror { return r.mirror }

// ZMQAddr returns the address the relay's SUB socket is bound to, nil
// before Run has bound it or in connect mode.
func (r *Relay) ZMQAddr() net.Addr {
	if a := r.in.addr.Load(); a != nil {
		return *a
	}
	return nil
}

// Ready says whether the relay can do its job: NATS is connected and the
// ZeroMQ socket is bound or dialled.
func (r *Relay) Ready() bool { return r.nc.IsConnected() && r.in.up.Load() }

// Run relays until ctx ends, then stops every goroutine it started,
// publishes what NATS will still take, and returns nil. It returns an
// error only when it cannot start.
func (r *Relay) Run(ctx context.Context) error {
	if r.used.Swap(true) {
		return ErrUsed
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := r.restore(); err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := r.in.open(ctx); err != nil {
		return fmt.Errorf("relay: %w", err)
	}

	// handlers tracks snapshot replies under way, so that Run returns only
	// once none is; closing keeps a late delivery from starting one.
	var (
		handlers sync.WaitGroup
		hmu      sync.Mutex
		closing  bool
	)
	sub, err := r.nc.Subscribe(events.SnapshotSubject(r.cfg.Namespace, r.cfg.Pool, r.cfg.Pod), func(msg *nats.Msg) {
		hmu.Lock()
		if closing {
			hmu.Unlock()
			return
		}
		handlers.Add(1)
		hmu.Unlock()
		defer handlers.Done()
		r.serveSnapshot(msg)
	})
	if err != nil {
		if r.in.sock != nil {
			_ = r.in.sock.Close()
		}
		return fmt.Errorf("relay: subscribe for snapshots: %w", err)
	}

	status := r.nc.StatusChanged(nats.CONNECTED, nats.RECONNECTING, nats.DISCONNECTED, nats.CLOSED)
	wake := make(chan nats.Status, 1)
	frames := make(chan delivery, 1024)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		r.in.read(ctx, frames)
	}()
	go func() {
		defer wg.Done()
		s := sender{nc: r.nc, pub: r.pub, box: r.box, status: wake, m: r.m, log: r.log}
		s.run(ctx)
	}()
	go func() {
		defer wg.Done()
		r.watch(ctx, status, wake)
	}()

	r.log.Info("relay started", "zmq", r.cfg.ZMQEndpoint, "bind", !r.cfg.Connect, "endpoint", r.endpoint)
	tick := time.NewTicker(r.tickEvery())
	defer tick.Stop()
	lastBeat := time.Time{}
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case d := <-frames:
			r.handle(ctx, d.frames, d.fresh)
			r.maintain(time.Now())
		case now := <-tick.C:
			if r.cfg.HeartbeatInterval > 0 && now.Sub(lastBeat) >= r.cfg.HeartbeatInterval-r.cfg.HeartbeatInterval/10 {
				lastBeat = now
				r.beat()
			}
			r.maintain(now)
		}
	}
	if r.store != nil {
		r.store.close(r.mirror, r.lastDigest)
	}
	cancel()
	_ = sub.Unsubscribe()
	hmu.Lock()
	closing = true
	hmu.Unlock()
	wg.Wait()
	handlers.Wait()
	r.nc.RemoveStatusListener(status)
	r.log.Info("relay stopped")
	return nil
}

// watch keeps the connection gauge and wakes the sender when NATS returns.
func (r *Relay) watch(ctx context.Context, status <-chan nats.Status, wake chan<- nats.Status) {
	r.setConnected()
	for {
		select {
		case <-ctx.Done():
			return
		case s, ok := <-status:
			if !ok {
				return
			}
			r.setConnected()
			select {
			case wake <- s:
			default:
			}
		}
	}
}

func (r *Relay) setConnected() {
	v := 0.0
	if r.nc.IsConnected() {
		v = 1
	}
	r.m.natsConnected.Set(v)
}

// handle takes one message from the engine through sequence checks, gap
// filling, the mirror, and into the outbox. fresh says it is the first on
// a new connection to the engine.
func (r *Relay) handle(ctx context.Context, frames [][]byte, fresh bool) {
	msg, err := parseFrame(frames)
	if err != nil {
		r.m.dropped.WithLabelValues(dropMalformedFrame).Inc()
		return
	}
	if !topicMatches(msg.topic, r.cfg.Topic) {
		r.m.dropped.WithLabelValues(dropTopic).Inc()
		return
	}
	r.m.batchesIn.Inc()
	// An engine never repeats or goes back in seq: either is a new engine
	// process, whose seq started again from 0.
	switch {
	case !r.haveLast && r.restored != nil:
		if !r.resume(ctx, msg) {
			return
		}
	case !r.haveLast:
		r.newInstance()
		r.fillHistory(ctx, msg.seq)
	case msg.seq <= r.last:
		r.engineRestarted(ctx, msg.seq, "its seq went back")
	case fresh || msg.seq > r.last+1:
		r.followOn(ctx, msg.seq, fresh)
	}
	r.forward(msg.seq, msg.payload)
	r.gauges()
}

// gauges publishes the mirror's size and knowledge.
func (r *Relay) gauges() {
	held, ghost, evicted := r.mirror.Counts()
	r.m.mirrorHeld.Set(float64(held))
	r.m.mirrorGhost.Set(float64(ghost))
	if evicted > r.evicted {
		r.m.evictions.Add(float64(evicted - r.evicted))
		r.evicted = evicted
	}
	state := r.mirror.Position().SnapshotState()
	for _, s := range []string{events.SnapshotExact, events.SnapshotPartial, events.SnapshotInexact} {
		v := 0.0
		if s == state {
			v = 1
		}
		r.m.mirrorState.WithLabelValues(s).Set(v)
	}
}

// newInstance starts a new Kv-Instance: the engine is new to the relay.
// The instance names the engine's lifetime as the relay first saw it, and
// outlives the relay when StateDir keeps it.
func (r *Relay) newInstance() {
	now := time.Now().UnixNano()
	if r.instance == fmt.Sprintf("%s-%d", r.cfg.Pod, now) {
		now++
	}
	r.instance = fmt.Sprintf("%s-%d", r.cfg.Pod, now)
	r.mirror.Reset(r.instance)
	if r.store != nil {
		r.store.appendPosition(true, r.mirror.Position())
	}
}

// fillHistory is for the first batch of an instance: a seq other than 0
// means batches went by before the relay listened (it started or restarted
// after the engine, or missed the engine's first batches while ZeroMQ
// connected). They are asked for from the engine's replay ring, from seq
// 0, so that a relay that starts late still builds a complete mirror while
// the engine's history fits in the ring; what the ring no longer holds
// leaves the mirror inexact (Kv-Snapshot-Exact false).
//
// What the ring no longer holds of the start of the history leaves the
// mirror partial: everything it holds the engine holds, but blocks stored
// before its first batch are missing (a relay that joins a running engine
// without a replay socket, or a publisher that numbers from 1, settles
// so). Holes after the first batch recovered leave it inexact.
func (r *Relay) fillHistory(ctx context.Context, seq uint64) {
	if seq == 0 {
		return
	}
	got, err := r.replay(ctx, 0, seq)
	lost, prefix := r.relayReplayed(got, 0, seq)
	if lost == 0 {
		r.m.gapsFilled.Inc()
		return
	}
	r.m.gapsUnfilled.Inc()
	r.m.lostBatches.Add(float64(lost))
	if prefix {
		r.markPartial()
		r.log.Info("the engine's history before the relay's first batch is not to be had; snapshots are partial until it restarts or clears its cache",
			"first_seq", seq, "missing", lost, "replay", r.rp != nil, "err", err)
		return
	}
	r.markInexact()
	r.log.Warn("sequence gap not filled", "from", 0, "to", seq, "lost", lost, "replay", r.rp != nil, "err", err)
}

// fillGap recovers the batches from <= seq < to from the engine's replay
// socket and relays them in order. What it cannot recover stays a gap,
// which the EPP sees in Kv-Seq, and leaves the mirror inexact.
func (r *Relay) fillGap(ctx context.Context, from, to uint64) {
	got, err := r.replay(ctx, from, to)
	r.settleGap(from, to, got, err)
}

// followOn handles a seq past the last one relayed that may be another
// engine's: one past the next (a gap, unless the engine restarted and its
// new seq has already passed the last one relayed), or the first batch on
// a new connection (fresh), where even the very next seq proves nothing:
// a restarted engine may have published just as many batches before the
// relay reconnected. The replay ring tells them apart: asked from the last
// seq relayed, it holds that very batch, unchanged, if the engine is the
// same, and another if not. A ring that cannot say (none, or one that no
// longer has it) leaves a gap a gap; on a new connection the engine is
// then taken for a new one: its mirror starts empty, which can only
// under-claim, where keeping the old one could claim blocks the new
// engine never stored.
func (r *Relay) followOn(ctx context.Context, to uint64, fresh bool) {
	got, err := r.replay(ctx, r.last, to)
	atLast := len(got) > 0 && got[0].seq == r.last
	switch {
	case atLast && xxhash.Sum64(got[0].payload) == r.lastDigest:
		got = got[1:]
	case atLast:
		r.engineRestarted(ctx, to, "its replay ring holds another batch at the last seq relayed")
		return
	case fresh:
		r.engineRestarted(ctx, to, "a new connection, and the last batch relayed could not be confirmed")
		return
	}
	if to > r.last+1 {
		r.settleGap(r.last+1, to, got, err)
	}
}

// engineRestarted starts a new instance at seq, the first batch of an
// engine that is not the one relayed so far.
func (r *Relay) engineRestarted(ctx context.Context, seq uint64, why string) {
	r.m.restarts.Inc()
	r.log.Info("engine restarted", "last_seq", r.last, "seq", seq, "why", why)
	r.newInstance()
	r.fillHistory(ctx, seq)
}

// settleGap relays what a replay recovered of from <= seq < to and
// accounts for the rest.
func (r *Relay) settleGap(from, to uint64, got []replayed, err error) {
	lost, _ := r.relayReplayed(got, from, to)
	if lost == 0 {
		r.m.gapsFilled.Inc()
		return
	}
	r.m.gapsUnfilled.Inc()
	r.m.lostBatches.Add(float64(lost))
	r.markInexact()
	r.log.Warn("sequence gap not filled", "from", from, "to", to, "lost", lost, "replay", r.rp != nil, "err", err)
}

// replay asks the engine's replay socket for from <= seq < to; nil without
// one.
func (r *Relay) replay(ctx context.Context, from, to uint64) ([]replayed, error) {
	if r.rp == nil {
		return nil, nil
	}
	r.m.replayRequests.Inc()
	return r.rp.fetch(ctx, from, to)
}

// relayReplayed forwards, in order, the replayed batches with from <= seq
// < to. It returns how many of that range it did not have, and whether
// those all came before the first it had (a missing prefix, not holes).
func (r *Relay) relayReplayed(got []replayed, from, to uint64) (lost uint64, prefix bool) {
	next, filled, holes := from, uint64(0), false
	for _, b := range got {
		if b.seq < next {
			r.m.dropped.WithLabelValues(dropStale).Inc()
			continue
		}
		if b.seq >= to {
			break
		}
		if filled > 0 && b.seq != next {
			holes = true
		}
		r.m.batchesIn.Inc()
		r.m.replayed.Inc()
		r.forward(b.seq, b.payload)
		next = b.seq + 1
		filled++
	}
	if filled > 0 && next != to {
		holes = true
	}
	return to - from - filled, !holes
}

func (r *Relay) markInexact() {
	r.mirror.MarkInexact()
	if r.store != nil {
		r.store.appendPosition(false, r.mirror.Position())
	}
}

func (r *Relay) markPartial() {
	r.mirror.MarkPartial()
	if r.store != nil {
		r.store.appendPosition(false, r.mirror.Position())
	}
}

// forward decodes a batch for the mirror and queues it for NATS unchanged.
// A batch that does not decode is still forwarded: the EPP counts it too,
// and the gap it leaves in the EPP's state is the same either way.
func (r *Relay) forward(seq uint64, payload []byte) {
	if err := r.dec.Decode(payload, &r.batch); err != nil {
		r.m.decodeErrors.Inc()
		if now := time.Now(); now.Sub(r.decodeLog) > time.Second {
			r.decodeLog = now
			r.log.Warn("batch does not decode; forwarded all the same", "seq", seq, "err", err)
		}
		r.mirror.Apply(seq, nil, r.blockSize, r.dpRank)
	} else {
		r.learn(&r.batch)
		r.mirror.Apply(seq, &r.batch, r.blockSize, r.dpRank)
	}
	if r.store != nil {
		r.store.appendBatch(seq, r.blockSize, r.dpRank, payload)
	}
	r.box.push(outItem{origin: r.origin(seq), payload: payload})
	r.last, r.haveLast = seq, true
	r.lastDigest = xxhash.Sum64(payload)
}

// learn takes the block size and rank from the batch when the
// configuration left them open or has them wrong.
func (r *Relay) learn(b *events.Batch) {
	if b.HasDPRank && b.DPRank != r.dpRank {
		if !r.rankWarn {
			r.rankWarn = true
			r.log.Warn("batch names another data-parallel rank than configured; using the batch's", "configured", r.dpRank, "batch", b.DPRank)
		}
		r.dpRank = b.DPRank
	}
	if r.blockSize != 0 {
		return
	}
	for i := range b.Events {
		e := &b.Events[i]
		if e.Kind == events.KindBlockStored && e.BlockSize > 0 && len(e.TokenIDs) > 0 {
			r.blockSize = e.BlockSize
			return
		}
	}
}

func (r *Relay) origin(seq uint64) events.Origin {
	return events.Origin{
		Stream:    events.Stream{Endpoint: r.endpoint, DPRank: r.dpRank},
		Pod:       r.cfg.Pod,
		Model:     r.cfg.Model,
		Instance:  r.instance,
		BlockSize: r.blockSize,
		Seq:       seq,
	}
}

// serveSnapshot answers one snapshot request (see docs/snapshot.md).
func (r *Relay) serveSnapshot(req *nats.Msg) {
	if req.Reply == "" {
		return
	}
	base := events.Origin{Stream: events.Stream{Endpoint: r.endpoint}, Pod: r.cfg.Pod, Model: r.cfg.Model}
	switch err := ReplySnapshot(r.nc, req, r.mirror, base, r.cfg.SnapshotChunkBytes); {
	case err == nil:
		r.m.snapshots.Inc()
	case errors.Is(err, ErrNoSnapshot):
		r.m.snapshotErrors.Inc()
	default:
		r.m.snapshotErrors.Inc()
		r.log.Warn("snapshot not served", "err", err)
	}
}
