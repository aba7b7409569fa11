package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/pkg/events"
)

// Errors returned by NewConsumer and Run.
var (
	// ErrOptions: the options cannot describe a subscription.
	ErrOptions = errors.New("invalid consumer options")
	// ErrUsed: Run was called a second time; a Consumer runs once.
	ErrUsed = errors.New("consumer already run")
)

// ConsumerOptions configure a Consumer. Zero values mean the documented
// defaults.
type Options struct {
	// Namespace and Pool select the subjects kv.events.<Namespace>.<Pool>.>.
	// Both are required.
	Namespace, Pool string
	// Workers is how many goroutines decode and apply batches (default 4).
	// Streams are sharded over them, so one busy engine delays only the
	// streams that share its worker.
	Workers int
	// QueueLen is each worker's queue, in batches (default 1024). When a
	// queue is full the NATS client buffers, and past its limits it drops
	// messages and reports a slow consumer, which the sink hears about.
	QueueLen int
	// PendingLimit is how many messages the NATS client may buffer for a
	// core subscription before it drops and reports a slow consumer
	// (default nats.DefaultSubPendingMsgsLimit). Ignored for JetStream,
	// whose ordered consumer fetches only what it has room for.
	PendingLimit int
	// JetStream consumes through an ordered JetStream consumer on Stream
	// instead of a core NATS subscription, so a restarted EPP can replay
	// what the stream retained (see EnsureStream).
	JetStream bool
	// Stream is the JetStream stream's name (default StreamName(Namespace, Pool)).
	Stream string
	// DeliverNew starts a JetStream consumer at new messages instead of
	// replaying all the stream holds. Ignored for core NATS.
	DeliverNew bool
	// IdleTimeout is how long a stream's sequence state is kept without a
	// batch (default 1h), which bounds memory as pods come and go. A stream
	// that returns after that is treated as new.
	IdleTimeout time.Duration
	// Membership, when set, is what each batch's identity is held to: its
	// Kv-Endpoint must be an endpoint discovery assigns to the pod its
	// subject names. Batches of other endpoints are rejected before they
	// are queued, so they leave no state behind. Without it only the
	// subject and Kv-Pod are compared.
	Membership Membership
	// MaxRanksPerEndpoint bounds the data-parallel streams of one endpoint
	// (default DefaultMaxRanksPerEndpoint); batches naming further ranks
	// are rejected.
	MaxRanksPerEndpoint int
	// MaxQueuedBytes bounds the payload bytes waiting in the workers'
	// queues together (default 256 MiB). Past it the NATS client buffers
	// and, past its own limits, drops and reports a slow consumer.
	MaxQueuedBytes int64
	// Logger receives rate-limited reports of rejected messages (default
	// slog.Default()).
	Logger *slog.Logger
}

// drainTimeout bounds how long Run waits, at shutdown, for messages the
// NATS client already holds; past it they are abandoned.
const drainTimeout = 2 * time.Second

// subscribeTimeout bounds the round trip that confirms a subscription.
const subscribeTimeout = 10 * time.Second

// item is one unit of a worker's queue: a message to decode and apply, or,
// when reason is set, a notice that every stream of the worker is uncertain.
type item struct {
	origin    events.Origin
	data      []byte
	recv      time.Time
	reason    events.Reason
	heartbeat bool
	// held is the payload bytes this item holds of MaxQueuedBytes.
	held int64
}

// Consumer receives KV-event batches from NATS and hands them to a Sink.
//
// Each Stream (endpoint, rank) is served by one worker, chosen by a hash of
// the stream, so its batches reach the sink in the order they arrived. Per
// stream, the consumer tracks Kv-Instance and Kv-Seq:
//   - the next seq is applied;
//   - a seq already seen, or older within the same instance, is dropped;
//   - a seq past the next is a gap: Uncertain(ReasonGap), then Apply;
//   - a new instance, or seq going back to 0 (or further back than any
//     redelivery would), is a restart: Restart, then Apply;
//   - the first batch of a stream, or of a restarted engine, whose seq is
//     not 0 is preceded by Uncertain(ReasonLateJoin): the engine published
//     batches the sink never saw, but none since;
//   - a heartbeat (Kv-Heartbeat) naming a batch past the last one
//     received is a lost tail: the sink's Tail hears it (or, for a plain
//     Sink, Uncertain(ReasonLostTail)), and the stream's position moves to
//     it, so that a quiet stream's lost last batches are found within a
//     heartbeat.
//
// Before anything else, each batch is bound to the pod its subject names
// (the part of a message the server's permissions vouch for): Kv-Pod may
// only agree with it, Kv-Endpoint must be an endpoint discovery gives that
// pod (Options.Membership), and an endpoint has at most
// MaxRanksPerEndpoint data-parallel streams. A batch that breaks any of
// these is counted by reason (kvroute_events_rejected_total) and dropped
// before it is queued, so it changes nothing and leaves no state behind.
//
// A reconnect or a slow-consumer report from the NATS client makes every
// known stream uncertain (ReasonReconnect, ReasonSlowConsumer), delivered
// through each stream's worker; so do drops the client makes later in the
// same slow-consumer episode, which it does not report (the subscription's
// drop count is read every 250ms). Rejected messages (bad headers, undecodable
// payloads) are counted, logged at most once a second per kind, and never
// reach the sink; an undecodable batch leaves its seq unconsumed, so the
// stream's next batch reports the gap it left.
type Consumer struct {
	nc   *nats.Conn
	opts Options
	sink events.Sink
	log  *slog.Logger
	m    *consumerMetrics

	queues []chan item

	// mu guards sending on queues against their closing at shutdown: senders
	// (the NATS delivery goroutine, connection callbacks) hold it for reading.
	mu        sync.RWMutex
	accepting bool

	used   atomic.Bool
	active atomic.Bool
	sub    atomic.Pointer[nats.Subscription] // core mode, to recognise our slow-consumer errors

	// slowDropped is the subscription's drop count already added to the
	// metrics; the error callback and shutdown both update it.
	slowMu      sync.Mutex
	slowDropped int

	admit  *admitter
	queued *semaphore.Weighted

	headerLog, decodeLog, consumeLog, rejectLog *rate.Limiter
}

// NewConsumer returns a Consumer for the pool opts names, delivering to
// sink. Its metrics are registered with reg unless reg is nil. Nothing is
// subscribed until Run.
func New(nc *nats.Conn, opts Options, sink events.Sink, reg prometheus.Registerer) (*Consumer, error) {
	if nc == nil {
		return nil, events.ErrNoConn
	}
	if sink == nil {
		return nil, fmt.Errorf("%w: nil sink", ErrOptions)
	}
	if opts.Namespace == "" || opts.Pool == "" {
		return nil, fmt.Errorf("%w: namespace and pool are required", ErrOptions)
	}
	if opts.Workers < 0 || opts.QueueLen < 0 || opts.PendingLimit < 0 || opts.IdleTimeout < 0 || opts.MaxRanksPerEndpoint < 0 || opts.MaxQueuedBytes < 0 {
		return nil, fmt.Errorf("%w: negative workers, queue length, pending limit, idle timeout, rank or byte bound", ErrOptions)
	}
	if opts.MaxRanksPerEndpoint == 0 {
		opts.MaxRanksPerEndpoint = DefaultMaxRanksPerEndpoint
	}
	if opts.MaxQueuedBytes == 0 {
		opts.MaxQueuedBytes = DefaultMaxQueuedBytes
	}
	if opts.Workers == 0 {
		opts.Workers = 4
	}
	if opts.QueueLen == 0 {
		opts.QueueLen = 1024
	}
	if opts.PendingLimit == 0 {
		opts.PendingLimit = nats.DefaultSubPendingMsgsLimit
	}
	if opts.Stream == "" {
		opts.Stream = events.StreamName(opts.Namespace, opts.Pool)
	}
	if opts.IdleTimeout == 0 {
		opts.IdleTimeout = time.Hour
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	c := &Consumer{
		nc:         nc,
		opts:       opts,
		sink:       sink,
		log:        log.With("component", "kv-events-consumer", "subject", events.PoolSubject(opts.Namespace, opts.Pool)),
		m:          newConsumerMetrics(),
		queues:     make([]chan item, opts.Workers),
		admit:      newAdmitter(opts.Membership, opts.MaxRanksPerEndpoint, opts.IdleTimeout),
		queued:     semaphore.NewWeighted(opts.MaxQueuedBytes),
		headerLog:  rate.NewLimiter(rate.Every(time.Second), 1),
		decodeLog:  rate.NewLimiter(rate.Every(time.Second), 1),
		consumeLog: rate.NewLimiter(rate.Every(time.Second), 1),
		rejectLog:  rate.NewLimiter(rate.Every(time.Second), 1),
	}
	for i := range c.queues {
		c.queues[i] = make(chan item, opts.QueueLen)
	}
	if reg != nil {
		cs := append(c.m.collectors(),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "kvroute_events_connected",
				Help: "1 while the consumer is subscribed over a live NATS connection, else 0.",
			}, func() float64 {
				if c.Connected() {
					return 1
				}
				return 0
			}),
			newQueueDepth(c.queues), c.admit.vec)
		for _, col := range cs {
			if err := reg.Register(col); err != nil {
				return nil, fmt.Errorf("register kv-event consumer metrics: %w", err)
			}
		}
	}
	return c, nil
}

// Connected reports whether the consumer is subscribed and its connection
// is up: the readiness of the event path.
func (c *Consumer) Connected() bool { return c.active.Load() && c.nc.IsConnected() }

// Run subscribes and delivers batches until ctx is done, then stops the
// subscription, lets the workers finish what they hold, and returns. Every
// goroutine it starts has ended when it returns. It returns an error only if
// the subscription cannot be made; a Consumer runs once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.used.CompareAndSwap(false, true) {
		return ErrUsed
	}
	var wg sync.WaitGroup
	c.mu.Lock()
	c.accepting = true
	c.mu.Unlock()
	for _, q := range c.queues {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.work(q)
		}()
	}
	stopWorkers := func() {
		c.mu.Lock()
		c.accepting = false
		for _, q := range c.queues {
			close(q)
		}
		c.mu.Unlock()
		wg.Wait()
	}

	c.installHandlers()
	var stop func()
	var err error
	if c.opts.JetStream {
		stop, err = c.consumeJetStream(ctx)
	} else {
		stop, err = c.subscribe(ctx)
	}
	if err != nil {
		stopWorkers()
		if ctx.Err() != nil {
			return nil // cancelled while subscribing: a shutdown, not a failure
		}
		return err
	}
	c.active.Store(true)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if sub := c.sub.Load(); sub != nil {
			c.watchDrops(ctx, sub)
		}
	}()
	<-ctx.Done()
	<-watched
	c.active.Store(false)
	stop()
	stopWorkers()
	return nil
}

// dropCheckEvery is how often the subscription's drop count is read.
const dropCheckEvery = 250 * time.Millisecond

// watchDrops reports drops the client made since the last report, until
// ctx is done. The client tells of a slow consumer once per episode, at its
// first drop; the episode's later drops are silent. One of those that takes
// a stream's last batches before the engine falls quiet would leave the
// stream wrong with no later seq to show it, or fall after a snapshot that
// the first report asked for.
func (c *Consumer) watchDrops(ctx context.Context, sub *nats.Subscription) {
	t := time.NewTicker(dropCheckEvery)
	defer t.Stop()
	// owed[i]: worker i has a notice to get. Notices are queued without
	// blocking (a worker may be stuck behind a slow sink, which is what
	// made the drops) and retried each tick, so that the watch keeps
	// counting, and stops with ctx, whatever the workers do.
	owed := make([]bool, len(c.queues))
	// overrun: drops were found at an earlier tick. When a tick finds none
	// the overrun is over, and every stream is reported once more: a
	// resync begun during it may have been answered before its last drops.
	overrun := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		dropped := c.countSlowDrops(sub)
		if dropped || overrun {
			for i := range owed {
				owed[i] = true
			}
		}
		overrun = dropped
		now := time.Now()
		c.mu.RLock()
		for i, q := range c.queues {
			if !owed[i] || !c.accepting {
				continue
			}
			select {
			case q <- item{reason: events.ReasonSlowConsumer, recv: now}:
				owed[i] = false
			default:
			}
		}
		c.mu.RUnlock()
	}
}

// installHandlers chains the consumer's reaction to reconnects and slow
// consumers onto whatever handlers the connection already has. They are
// never removed (the connection allows one handler of each kind, so
// removing ours could drop one installed after it); once Run has returned
// they only pass calls on.
func (c *Consumer) installHandlers() {
	prevReconnect := c.nc.ReconnectHandler()
	c.nc.SetReconnectHandler(func(nc *nats.Conn) {
		if prevReconnect != nil {
			prevReconnect(nc)
		}
		c.broadcast(events.ReasonReconnect)
	})
	prevErr := c.nc.ErrorHandler()
	c.nc.SetErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
		if prevErr != nil {
			prevErr(nc, sub, err)
		}
		if !errors.Is(err, nats.ErrSlowConsumer) {
			return
		}
		// In core mode only our subscription's drops concern us. The
		// JetStream client's subscriptions cannot be told apart from
		// others', so there any slow consumer counts: a false alarm only
		// makes the sink cautious, a missed one makes it wrong.
		if own := c.sub.Load(); own != nil {
			if sub != own {
				return
			}
			c.countSlowDrops(own)
		}
		c.broadcast(events.ReasonSlowConsumer)
	})
}

// countSlowDrops adds the client's drops since the last call to the
// metrics and reports whether there were any. It runs when the client
// reports a slow consumer, every dropCheckEvery, and at shutdown.
func (c *Consumer) countSlowDrops(sub *nats.Subscription) bool {
	c.slowMu.Lock()
	defer c.slowMu.Unlock()
	if n, err := sub.Dropped(); err == nil && n > c.slowDropped {
		c.m.droppedSlow.Add(float64(n - c.slowDropped))
		c.slowDropped = n
		return true
	}
	return false
}

// subscribe starts the core NATS subscription and returns its stopper.
func (c *Consumer) subscribe(ctx context.Context) (func(), error) {
	subj := events.PoolSubject(c.opts.Namespace, c.opts.Pool)
	sub, err := c.nc.Subscribe(subj, func(m *nats.Msg) { c.dispatch(m.Subject, m.Header, m.Data) })
	if err != nil {
		return nil, fmt.Errorf("subscribe %s: %w", subj, err)
	}
	c.sub.Store(sub)
	if err := sub.SetPendingLimits(c.opts.PendingLimit, nats.DefaultSubPendingBytesLimit); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe %s: pending limits: %w", subj, err)
	}
	// Until the server has the subscription, publishes are not ours to
	// see; flushing makes Connected mean "will receive".
	fctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
	defer cancel()
	if err := c.nc.FlushWithContext(fctx); err != nil && ctx.Err() == nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("subscribe %s: %w", subj, err)
	}
	return func() {
		c.countSlowDrops(sub) // while the subscription can still tell
		closed := sub.StatusChanged(nats.SubscriptionClosed)
		if err := sub.Drain(); err == nil {
			select {
			case <-closed:
			case <-time.After(drainTimeout):
			}
		}
		_ = sub.Unsubscribe()
	}, nil
}

// consumeJetStream starts an ordered consumer on the pool's stream and
// returns its stopper. The ordered consumer recreates itself past any
// delivery gap, so within one connection JetStream loses nothing; the
// sequence tracking still applies, for gaps made upstream of the stream.
func (c *Consumer) consumeJetStream(ctx context.Context) (func(), error) {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{events.PoolSubject(c.opts.Namespace, c.opts.Pool)},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
	}
	if c.opts.DeliverNew {
		cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	}
	cons, err := js.OrderedConsumer(ctx, c.opts.Stream, cfg)
	if err != nil {
		return nil, fmt.Errorf("ordered consumer on stream %s: %w", c.opts.Stream, err)
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { c.dispatch(m.Subject(), m.Headers(), m.Data()) },
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if c.consumeLog.Allow() {
				c.log.Warn("jetstream consume error", "stream", c.opts.Stream, "err", err)
			}
		}))
	if err != nil {
		return nil, fmt.Errorf("consume stream %s: %w", c.opts.Stream, err)
	}
	return func() {
		closed := cc.Closed()
		cc.Drain()
		select {
		case <-closed:
		case <-time.After(drainTimeout):
			cc.Stop()
			<-closed
		}
		// The server would keep the ephemeral consumer until its inactive
		// threshold passes; an EPP that restarts often should not leave a
		// trail of them.
		if info := cons.CachedInfo(); info != nil {
			dctx, cancel := context.WithTimeout(context.Background(), drainTimeout)
			defer cancel()
			if err := js.DeleteConsumer(dctx, c.opts.Stream, info.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				c.log.Debug("delete ordered consumer", "stream", c.opts.Stream, "consumer", info.Name, "err", err)
			}
		}
	}, nil
}

// dispatch runs on the NATS delivery goroutine: it reads the headers, which
// is all sharding needs, holds them to the subject's pod (see admitter),
// and queues the message for its stream's worker. Decoding is left to the
// workers so that it runs in parallel.
func (c *Consumer) dispatch(subject string, h nats.Header, data []byte) {
	recv := time.Now()
	o, err := events.ParseOrigin(h)
	if err != nil {
		c.m.badHeader.Inc()
		c.m.droppedBadHeader.Inc()
		if c.headerLog.Allow() {
			c.log.Warn("rejected kv-event message", "reason", resultBadHeader, "err", err)
		}
		return
	}
	if r := c.admit.admit(subject, &o, recv); r != admitted {
		c.admit.rejected[r].Inc()
		if c.rejectLog.Allow() {
			c.log.Warn("rejected kv-event message", "reason", rejectionNames[r], "subject", truncate(subject),
				"endpoint", truncate(o.Endpoint), "pod", truncate(o.Pod), "rank", o.DPRank)
		}
		return
	}
	// A message larger than the whole bound takes all of it, so that it
	// waits for an empty queue rather than forever.
	held := min(int64(len(data)), c.opts.MaxQueuedBytes)
	_ = c.queued.Acquire(context.Background(), held)
	q := c.queues[shard(o.Stream, len(c.queues))]
	hb := events.IsHeartbeat(h)
	c.mu.RLock()
	if c.accepting {
		q <- item{origin: o, data: data, recv: recv, held: held, heartbeat: hb}
	} else {
		c.queued.Release(held)
	}
	c.mu.RUnlock()
}

// DefaultMaxQueuedBytes is Options.MaxQueuedBytes when zero.
const DefaultMaxQueuedBytes = 256 << 20

// truncate keeps a value from the network short enough for a log line.
func truncate(s string) string {
	const limit = 128
	if len(s) <= limit {
		return s
	}
	return s[:limit] + "…"
}

// broadcast queues an uncertainty notice for every worker, so that each
// reports it for its own streams in order with their batches. The client
// calls back after it has resubscribed, so a batch received just after a
// reconnect may be applied before the notice; that batch's own seq check
// still reports any gap the outage made.
func (c *Consumer) broadcast(r events.Reason) {
	now := time.Now()
	c.mu.RLock()
	defer c.mu.RUnlock()
	if !c.accepting {
		return
	}
	for _, q := range c.queues {
		q <- item{reason: r, recv: now}
	}
}

// shard maps a stream to a worker. Both the endpoint and the rank take
// part, so the ranks of one pod spread over workers.
func shard(s events.Stream, n int) int {
	h := xxhash.Sum64String(s.Endpoint) ^ uint64(s.DPRank)*0x9e3779b97f4a7c15
	return int(h % uint64(n))
}

// work is one worker: it owns a decoder, a reused batch and the sequence
// state of the streams sharded to it, and runs until its queue is closed.
func (c *Consumer) work(q <-chan item) {
	w := worker{c: c, streams: make(map[events.Stream]*seqState)}
	for it := range q {
		w.handle(it)
		if it.held > 0 {
			c.queued.Release(it.held)
		}
	}
}

type worker struct {
	c       *Consumer
	dec     events.Decoder
	batch   events.Batch
	streams map[events.Stream]*seqState
	swept   time.Time
}

func (w *worker) handle(it item) {
	c := w.c
	if it.recv.Sub(w.swept) > c.opts.IdleTimeout/2 {
		w.sweep(it.recv)
	}
	if it.reason != 0 {
		for s := range w.streams {
			w.uncertain(s, it.reason)
		}
		return
	}
	o := it.origin
	st := w.streams[o.Stream]
	if it.heartbeat {
		w.heartbeat(st, o, it.recv)
		return
	}
	v := classify(st, o)
	if v == verdictDuplicate {
		c.m.duplicate.Inc()
		c.m.droppedDuplicate.Inc()
		return
	}
	if err := w.dec.Decode(it.data, &w.batch); err != nil {
		// The state is left as it was, so the stream's next batch shows
		// up as a gap and the sink learns that this one is missing.
		c.m.decodeErrorBatch.Inc()
		c.m.decodeErrors.Inc()
		c.m.droppedDecode.Inc()
		if c.decodeLog.Allow() {
			c.log.Warn("rejected kv-event message", "reason", resultDecodeError,
				"stream", o.Stream.String(), "pod", o.Pod, "seq", o.Seq, "err", err)
		}
		return
	}
	switch v {
	case verdictFirst:
		if o.Seq != 0 {
			w.uncertain(o.Stream, events.ReasonLateJoin)
		}
	case verdictGap:
		c.m.gaps.Inc()
		c.m.missedBatches.Add(float64(missed(st, o)))
		w.uncertain(o.Stream, events.ReasonGap)
	case verdictRestart:
		c.m.restarts.Inc()
		c.sink.Restart(o.Stream)
		if o.Seq != 0 {
			w.uncertain(o.Stream, events.ReasonLateJoin)
		}
	}
	b := &w.batch
	c.sink.Apply(o, b)

	w.count(b, it.recv)

	if st == nil {
		st = new(seqState)
		w.streams[o.Stream] = st
	}
	st.commit(o, it.recv)
}

// count updates the metrics of an applied batch, adding per kind first so
// that a batch costs a few atomic adds, not one per event.
func (w *worker) count(b *events.Batch, recv time.Time) {
	m := w.c.m
	m.applied.Inc()
	var kinds [len(m.eventsApplied)]int
	blocks := 0
	for i := range b.Events {
		e := &b.Events[i]
		blocks += len(e.BlockHashes)
		if int(e.Kind) < len(kinds) {
			kinds[e.Kind]++
		}
	}
	for k, n := range kinds {
		if n > 0 && m.eventsApplied[k] != nil {
			m.eventsApplied[k].Add(float64(n))
		}
	}
	m.blocks.Add(float64(blocks))
	if b.Skipped > 0 {
		m.eventsSkipped.Add(float64(b.Skipped))
	}
	// A timestamp beyond year 5000 is garbage, not a clock; skip it
	// rather than overflow the conversion.
	if b.TS > 0 && b.TS < 1e11 {
		lag := recv.Sub(time.Unix(0, int64(b.TS*1e9))).Seconds()
		m.lag.Observe(max(lag, 0))
	}
}

func (w *worker) uncertain(s events.Stream, r events.Reason) {
	w.c.m.uncertain.WithLabelValues(r.String()).Inc()
	w.c.sink.Uncertain(s, r)
}

// sweep forgets streams idle for longer than IdleTimeout.
func (w *worker) sweep(now time.Time) {
	w.swept = now
	for s, st := range w.streams {
		if now.Sub(st.seen) > w.c.opts.IdleTimeout {
			delete(w.streams, s)
		}
	}
}
