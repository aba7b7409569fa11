package relay

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
)

// Reasons a batch is dropped, the values of dropped_batches_total{reason}.
const (
	// dropBufferFull: the outbound buffer was full while NATS was away, and
	// the oldest batch made room for a newer one.
	dropBufferFull = "buffer_full"
	// dropMalformedFrame: a ZeroMQ message that is not [topic, seq(8), payload].
	dropMalformedFrame = "malformed_frame"
	// dropPublishError: NATS refused a batch while connected (e.g. larger than
	// the server's max payload); retrying would block every later batch.
	dropPublishError = "publish_error"
	// dropStale: a replayed batch that the relay has already passed.
	dropStale = "stale"
	// dropTopic: a message on a topic outside the subscription, from a
	// publisher that does not filter for its subscribers.
	dropTopic = "topic"
)

// metrics are the relay's Prometheus metrics, all under kvroute_relay_.
type metrics struct {
	batchesIn      prometheus.Counter
	batchesOut     prometheus.Counter
	gapsFilled     prometheus.Counter
	gapsUnfilled   prometheus.Counter
	lostBatches    prometheus.Counter
	replayRequests prometheus.Counter
	replayed       prometheus.Counter
	dropped        *prometheus.CounterVec
	bufferBatches  prometheus.Gauge
	bufferBytes    prometheus.Gauge
	natsConnected  prometheus.Gauge
	restarts       prometheus.Counter
	mirrorBlocks   *prometheus.GaugeVec
	mirrorHeld     prometheus.Gauge
	mirrorGhost    prometheus.Gauge
	evictions      prometheus.Counter
	snapshots      prometheus.Counter
	snapshotErrors prometheus.Counter
	decodeErrors   prometheus.Counter

	heartbeats        prometheus.Counter
	mirrorState       *prometheus.GaugeVec
	resumes           *prometheus.CounterVec
	restores          *prometheus.CounterVec
	checkpoints       prometheus.Counter
	checkpointErrors  prometheus.Counter
	checkpointBytes   prometheus.Gauge
	checkpointSeconds prometheus.Histogram
	journalBytes      prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "kvroute", Subsystem: "relay", Name: name, Help: help})
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "kvroute", Subsystem: "relay", Name: name, Help: help})
	}
	m := &metrics{
		batchesIn:      counter("batches_in_total", "Batches received from the engine's ZeroMQ publisher, replayed ones included."),
		batchesOut:     counter("batches_out_total", "Batches published to NATS."),
		gapsFilled:     counter("gaps_filled_total", "Sequence gaps filled completely from the engine's replay socket."),
		gapsUnfilled:   counter("gaps_unfilled_total", "Sequence gaps left with missing batches (no replay socket, timeout, or the batches had left the replay buffer)."),
		lostBatches:    counter("lost_batches_total", "Batches of unfilled gaps that were never recovered."),
		replayRequests: counter("replay_requests_total", "Requests sent to the engine's replay socket."),
		replayed:       counter("replayed_batches_total", "Batches recovered from the replay socket."),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "relay", Name: "dropped_batches_total",
			Help: "Batches dropped by the relay, by reason: buffer_full, malformed_frame, publish_error, stale, topic.",
		}, []string{"reason"}),
		bufferBatches: gauge("buffer_depth_batches", "Batches waiting in the outbound buffer."),
		bufferBytes:   gauge("buffer_depth_bytes", "Payload bytes waiting in the outbound buffer."),
		natsConnected: gauge("nats_connected", "1 while the NATS connection is up."),
		restarts:      counter("engine_restarts_total", "Engine restarts seen (seq going back); each starts a new Kv-Instance."),
		mirrorBlocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "relay", Name: "mirror_blocks",
			Help: "Blocks in the mirror: held in some tier, or ghost ancestors kept for a held descendant's chain.",
		}, []string{"state"}),
		evictions:      counter("mirror_evictions_total", "Mirror entries evicted by --mirror-max-blocks."),
		snapshots:      counter("snapshots_served_total", "Snapshot requests answered with a snapshot."),
		snapshotErrors: counter("snapshot_errors_total", "Snapshot requests that could not be answered with a snapshot."),
		decodeErrors:   counter("decode_errors_total", "Payloads that did not decode as a vLLM batch (still forwarded)."),
		heartbeats:     counter("heartbeats_total", "Heartbeats published (Kv-Heartbeat: the last batch sent, so that a lost tail is found)."),
		mirrorState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "kvroute", Subsystem: "relay", Name: "mirror_state",
			Help: "1 for the mirror's current knowledge of its engine (exact, partial, inexact), 0 for the others.",
		}, []string{"state"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "relay", Name: "resumes_total",
			Help: "First batches after a start from saved state, by verdict: same_engine (Kv-Instance kept), new_engine (it restarted meanwhile), unverified (kept, the replay ring could not confirm it).",
		}, []string{"verdict"}),
		restores: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "kvroute", Subsystem: "relay", Name: "state_restores_total",
			Help: "Starts with a state directory, by result: restored (the mirror rebuilt from checkpoint and journal) or discarded (unreadable, or another relay's).",
		}, []string{"result"}),
		checkpoints:      counter("checkpoints_total", "Checkpoints of the mirror written to the state directory."),
		checkpointErrors: counter("checkpoint_errors_total", "Failed writes of the state directory (checkpoint or journal); a restart before the next good checkpoint starts afresh."),
		checkpointBytes:  gauge("checkpoint_bytes", "Size of the last checkpoint written."),
		checkpointSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "kvroute", Subsystem: "relay", Name: "checkpoint_duration_seconds",
			Help: "Time to encode and write one checkpoint, in the background.", Buckets: prometheus.ExponentialBuckets(0.001, 3, 10),
		}),
		journalBytes: gauge("journal_bytes", "Bytes in the current journal generation, since the last checkpoint."),
	}
	for _, s := range []string{events.SnapshotExact, events.SnapshotPartial, events.SnapshotInexact} {
		m.mirrorState.WithLabelValues(s)
	}
	for _, v := range []string{"same_engine", "new_engine", "unverified"} {
		m.resumes.WithLabelValues(v)
	}
	for _, v := range []string{"restored", "discarded"} {
		m.restores.WithLabelValues(v)
	}
	for _, r := range []string{dropBufferFull, dropMalformedFrame, dropPublishError, dropStale, dropTopic} {
		m.dropped.WithLabelValues(r)
	}
	m.mirrorHeld = m.mirrorBlocks.WithLabelValues("held")
	m.mirrorGhost = m.mirrorBlocks.WithLabelValues("ghost")
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.batchesIn, m.batchesOut, m.gapsFilled, m.gapsUnfilled, m.lostBatches,
		m.replayRequests, m.replayed, m.dropped, m.bufferBatches, m.bufferBytes, m.natsConnected,
		m.restarts, m.mirrorBlocks, m.evictions, m.snapshots, m.snapshotErrors, m.decodeErrors,
		m.heartbeats, m.mirrorState, m.resumes, m.restores, m.checkpoints, m.checkpointErrors, m.checkpointBytes,
		m.checkpointSeconds, m.journalBytes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("relay metrics: %w", err)
		}
	}
	return m, nil
}
