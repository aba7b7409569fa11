package simkit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/sim"
)

// DefaultHeartbeatInterval is how often a Relay says where its engine is,
// as the relay does by default.
const DefaultHeartbeatInterval = relay.DefaultHeartbeatInterval

// Relay is the relay's part towards the EPP (docs/snapshot.md,
// docs/nats.md) for an engine that publishes straight to NATS: as the
// engine's Sink it mirrors every batch the engine published, with the
// relay's Mirror; Run answers snapshot requests on the pod's snapshot
// subject from that mirror, with the relay's responder, and publishes a
// heartbeat naming the last batch. Without it an EPP that starts beside
// the engine, or loses its stream, has nobody to ask.
type Relay struct {
	pub       *events.Publisher
	base      events.Origin
	heartbeat time.Duration
	mirror    *relay.Mirror

	// mu orders a heartbeat after the batch it names: Apply runs after
	// the engine published that batch.
	mu       sync.Mutex
	last     events.Origin
	instance string
	seen     bool
}

var _ sim.Sidecar = (*Relay)(nil)

// NewRelay returns the relay beside the engine configured as cfg,
// publishing on pub, with a heartbeat every heartbeat
// (DefaultHeartbeatInterval when zero; negative: none). It is the
// engine's Sink.
func NewRelay(pub *events.Publisher, cfg sim.EngineConfig, heartbeat time.Duration) *Relay {
	if heartbeat == 0 {
		heartbeat = DefaultHeartbeatInterval
	}
	return &Relay{
		pub:       pub,
		base:      events.Origin{Stream: events.Stream{Endpoint: cfg.Address}, Pod: cfg.Pod, Model: cfg.Model},
		heartbeat: heartbeat,
		mirror:    relay.NewMirror(relay.DefaultMirrorMaxBlocks),
	}
}

// Relays is FleetConfig.Sidecar for a fleet publishing on pub: a Relay
// beside each engine.
func Relays(pub *events.Publisher, heartbeat time.Duration) func(sim.EngineConfig) sim.Sidecar {
	return func(cfg sim.EngineConfig) sim.Sidecar { return NewRelay(pub, cfg, heartbeat) }
}

// Apply implements events.Sink: the engine published batch o.Seq.
func (r *Relay) Apply(o events.Origin, b *events.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.seen || o.Instance != r.instance {
		r.mirror.Reset(o.Instance)
		r.instance, r.seen = o.Instance, true
	}
	r.mirror.Apply(o.Seq, b, o.BlockSize, o.DPRank)
	r.last = o
}

// Uncertain implements events.Sink; the engine hands on every batch, so
// it is never called.
func (r *Relay) Uncertain(events.Stream, events.Reason) {}

// Restart implements events.Sink; a new instance shows in Apply.
func (r *Relay) Restart(events.Stream) {}

// Run serves snapshot requests and heartbeats until ctx ends. It returns
// an error only if it cannot subscribe.
func (r *Relay) Run(ctx context.Context) error {
	if r.pub == nil {
		return fmt.Errorf("relay for %s: no NATS publisher", r.base.Pod)
	}
	nc := r.pub.Conn()
	subj := events.SnapshotSubject(r.pub.Namespace(), r.pub.Pool(), r.base.Pod)
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		// A refusal (nothing published yet) is an answer too.
		_ = relay.ReplySnapshot(nc, m, r.mirror, r.base, relay.DefaultSnapshotChunkBytes)
	})
	if err != nil {
		return fmt.Errorf("relay for %s: subscribe %s: %w", r.base.Pod, subj, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if r.heartbeat < 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(r.heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.beat()
		}
	}
}

func (r *Relay) beat() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.seen {
		return
	}
	_ = r.pub.PublishHeartbeat(r.last)
}
