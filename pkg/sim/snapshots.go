package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
)

// DefaultHeartbeatInterval is how often an engine publishing over NATS says
// where it is, as a relay does.
const DefaultHeartbeatInterval = time.Second

// ServeSnapshots makes an engine that publishes straight to NATS behave
// as a relay does towards the EPP (docs/snapshot.md, docs/nats.md): it
// answers snapshot requests on its pod's kv.snapshot subject from a mirror
// of what it published, and publishes a heartbeat with its last seq every
// heartbeat (DefaultHeartbeatInterval when zero; negative: none), until ctx
// ends. Without it an EPP that starts beside the engine, or loses its
// stream, has nobody to ask. It returns an error only if it cannot
// subscribe; an engine that publishes no NATS returns at once.
func (e *Engine) ServeSnapshots(ctx context.Context, heartbeat time.Duration) error {
	if e.pub == nil {
		return nil
	}
	nc := e.pub.Conn()
	base := events.Origin{Stream: events.Stream{Endpoint: e.cfg.Address}, Pod: e.cfg.Pod, Model: e.cfg.Model}
	subj := events.SnapshotSubject(e.pub.Namespace(), e.pub.Pool(), e.cfg.Pod)
	sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
		// A refusal (nothing published yet) is an answer too.
		_ = relay.ReplySnapshot(nc, m, e.mirror, base, relay.DefaultSnapshotChunkBytes)
	})
	if err != nil {
		return fmt.Errorf("engine %s: subscribe %s: %w", e.cfg.Pod, subj, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if heartbeat == 0 {
		heartbeat = DefaultHeartbeatInterval
	}
	if heartbeat < 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			e.beat()
		}
	}
}

// beat publishes a heartbeat naming the last batch, under the engine's
// lock so that it follows that batch on the wire.
func (e *Engine) beat() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.emitted {
		return
	}
	_ = e.pub.PublishHeartbeat(e.origin(e.last))
}
