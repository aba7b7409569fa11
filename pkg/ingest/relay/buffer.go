package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
)

// outItem is one batch waiting for NATS: the payload exactly as the engine
// sent it, and the headers' origin.
type outItem struct {
	origin  events.Origin
	payload []byte
	// heartbeat: not a batch but the relay's position (Kv-Heartbeat).
	heartbeat bool
}

// outbox is the bounded FIFO between the relay's intake and NATS. While
// NATS is away it fills; past its bounds it drops the oldest batches, whose
// loss the EPP sees as a gap in Kv-Seq, rather than the newest, which carry
// the engine's current state.
type outbox struct {
	mu         sync.Mutex
	items      []outItem
	head       int
	bytes      int
	maxBatches int
	maxBytes   int
	// ready has room for one wake-up, so a push never blocks on the sender.
	ready chan struct{}
	m     *metrics
}

func newOutbox(maxBatches, maxBytes int, m *metrics) *outbox {
	return &outbox{maxBatches: maxBatches, maxBytes: maxBytes, ready: make(chan struct{}, 1), m: m}
}

// push appends it, dropping the oldest batches past the bounds. A batch
// larger than the byte bound alone is still kept: dropping it would only
// turn an oversized batch into a gap earlier than NATS would.
func (o *outbox) push(it outItem) {
	o.mu.Lock()
	o.items = append(o.items, it)
	o.bytes += len(it.payload)
	o.trim()
	o.gauges()
	o.mu.Unlock()
	select {
	case o.ready <- struct{}{}:
	default:
	}
}

// pushHeartbeat appends a heartbeat, or replaces the one at the back, so
// that heartbeats do not pile up while NATS is away: only the newest says
// anything.
func (o *outbox) pushHeartbeat(it outItem) {
	o.mu.Lock()
	if n := len(o.items); n > o.head && o.items[n-1].heartbeat {
		o.items[n-1] = it
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	o.push(it)
}

// unpop puts back at the front a batch the sender took but could not
// publish; the bounds apply to it as if it had never left.
func (o *outbox) unpop(it outItem) {
	o.mu.Lock()
	if o.head > 0 {
		o.head--
		o.items[o.head] = it
	} else {
		o.items = append([]outItem{it}, o.items...)
	}
	o.bytes += len(it.payload)
	o.trim()
	o.gauges()
	o.mu.Unlock()
}

func (o *outbox) trim() {
	for n := len(o.items) - o.head; n > 1 && (n > o.maxBatches || o.bytes > o.maxBytes); n-- {
		o.bytes -= len(o.items[o.head].payload)
		o.items[o.head] = outItem{}
		o.head++
		o.m.dropped.WithLabelValues(dropBufferFull).Inc()
	}
}

// pop takes the oldest batch.
func (o *outbox) pop() (outItem, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.head == len(o.items) {
		return outItem{}, false
	}
	it := o.items[o.head]
	o.items[o.head] = outItem{}
	o.head++
	o.bytes -= len(it.payload)
	if o.head == len(o.items) {
		o.items, o.head = o.items[:0], 0
	} else if o.head > 1024 && o.head > len(o.items)/2 {
		o.items = append(o.items[:0], o.items[o.head:]...)
		o.head = 0
	}
	o.gauges()
	return it, true
}

// depth returns the batches and bytes waiting.
func (o *outbox) depth() (int, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.items) - o.head, o.bytes
}

func (o *outbox) gauges() {
	o.m.bufferBatches.Set(float64(len(o.items) - o.head))
	o.m.bufferBytes.Set(float64(o.bytes))
}

// sender publishes the outbox in order for as long as ctx lives. While the
// connection is down it waits for it to come back; nats.go reconnects on
// its own, forever when dialled with DialNATS.
type sender struct {
	nc     *nats.Conn
	pub    *events.Publisher
	box    *outbox
	status chan nats.Status
	m      *metrics
	log    *slog.Logger
}

// retryEvery bounds the wait for a status change, which nats.go may drop
// when its listener channel is full.
const retryEvery = 250 * time.Millisecond

func (s *sender) run(ctx context.Context) {
	for {
		it, ok := s.box.pop()
		if !ok {
			select {
			case <-ctx.Done():
				s.drain()
				return
			case <-s.box.ready:
			}
			continue
		}
		if s.publish(it) {
			continue
		}
		s.box.unpop(it)
		t := time.NewTimer(retryEvery)
		select {
		case <-ctx.Done():
			t.Stop()
			s.drain()
			return
		case <-s.status:
		case <-t.C:
		}
		t.Stop()
	}
}

// publish sends it and says whether it is done with: published, or dropped
// because NATS will never take it. A false return means retry later.
func (s *sender) publish(it outItem) bool {
	if !s.nc.IsConnected() {
		return false
	}
	if it.heartbeat {
		if err := s.pub.PublishHeartbeat(it.origin); err != nil {
			return errors.Is(err, events.ErrBadHeader)
		}
		s.m.heartbeats.Inc()
		return true
	}
	err := s.pub.Publish(it.origin, it.payload)
	switch {
	case err == nil:
		s.m.batchesOut.Inc()
		return true
	case errors.Is(err, nats.ErrMaxPayload), errors.Is(err, events.ErrBadHeader):
		s.m.dropped.WithLabelValues(dropPublishError).Inc()
		s.log.Warn("batch dropped: NATS cannot take it", "seq", it.origin.Seq, "bytes", len(it.payload), "err", err)
		return true
	}
	return false
}

// drain publishes what it can at shutdown without waiting for a
// connection, and flushes, so that a clean stop loses nothing it need not.
func (s *sender) drain() {
	for {
		it, ok := s.box.pop()
		if !ok {
			break
		}
		if !s.publish(it) {
			s.box.unpop(it)
			return
		}
	}
	if s.nc.IsConnected() {
		_ = s.nc.FlushTimeout(time.Second)
	}
}
