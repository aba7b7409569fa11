package consumer

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
)

// Label values of the consumer's metrics.
const (
	resultApplied     = "applied"
	resultDuplicate   = "duplicate"
	resultBadHeader   = "bad_header"
	resultDecodeError = "decode_error"
	resultSkipped     = "skipped"

	dropSlowConsumer = "slow_consumer"
)

// consumerMetrics are the consumer's Prometheus metrics. Counters that the
// hot path touches are resolved to their label values once, up front.
type consumerMetrics struct {
	// kvroute_events_batches_total{result}: batches received, by what became
	// of them: applied, duplicate (seq already seen, dropped), bad_header
	// (contract headers missing or malformed, dropped), decode_error
	// (payload is not a vLLM batch, dropped).
	batches                                         *prometheus.CounterVec
	applied, duplicate, badHeader, decodeErrorBatch prometheus.Counter

	// kvroute_events_events_total{type,result}: events in decoded batches.
	// result is applied, or skipped for events the decoder left out (unknown
	// tag or tier, counted under type="unknown").
	events        *prometheus.CounterVec
	eventsApplied [events.KindAllBlocksCleared + 1]prometheus.Counter
	eventsSkipped prometheus.Counter

	// kvroute_events_blocks_total: block hashes named by applied events, the
	// unit the ingest budget is stated in.
	blocks prometheus.Counter

	// kvroute_events_decode_errors_total: payloads that failed to decode; the
	// same count as batches_total{result="decode_error"}, kept as its own
	// series because it is what an alert on a broken publisher watches.
	decodeErrors prometheus.Counter

	// kvroute_events_gaps_total: seq gaps seen between two batches of one
	// stream (a stream's first batch is not counted, even if its seq is not 0).
	gaps prometheus.Counter
	// kvroute_events_missed_batches_total: batches those gaps skipped.
	missedBatches prometheus.Counter

	// kvroute_events_engine_restarts_total: engine restarts detected (new
	// Kv-Instance, or seq going back).
	restarts prometheus.Counter

	// kvroute_events_uncertain_total{reason}: Uncertain reports sent to the
	// sink, one per stream affected (gap, reconnect, slow_consumer).
	uncertain *prometheus.CounterVec

	// kvroute_events_dropped_messages_total{reason}: messages that never
	// reached the sink: bad_header, decode_error, duplicate, and
	// slow_consumer (dropped by the NATS client before we saw them).
	dropped                                           *prometheus.CounterVec
	droppedBadHeader, droppedDecode, droppedDuplicate prometheus.Counter
	droppedSlow                                       prometheus.Counter

	// kvroute_events_heartbeats_total: publisher heartbeats received;
	// kvroute_events_lost_tails_total: those that named a batch past the
	// last one received (the stream's tail was lost).
	heartbeats, lostTails prometheus.Counter

	// kvroute_events_lag_seconds: receive time minus the batch's own
	// timestamp (vLLM's ts), i.e. engine-to-EPP delay, clock skew included.
	lag prometheus.Histogram

	// kvroute_events_connected (gauge, 1 or 0) and
	// kvroute_events_queue_depth{worker} (batches waiting per worker) are
	// read from the consumer at scrape time; NewConsumer registers them.
}

// lagBuckets run from 100µs to 10s, roughly ×2.15 apart: the fine end shows
// whether the 5 ms freshness budget holds, the coarse end shows backlogs.
var lagBuckets = prometheus.ExponentialBucketsRange(100e-6, 10, 16)

func newConsumerMetrics() *consumerMetrics {
	m := &consumerMetrics{
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_events_batches_total",
			Help: "KV-event batches received, by result (applied, duplicate, bad_header, decode_error).",
		}, []string{"result"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_events_events_total",
			Help: "KV events in decoded batches, by event type and result (applied, skipped).",
		}, []string{"type", "result"}),
		blocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_blocks_total",
			Help: "Blocks named by applied KV events.",
		}),
		decodeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_decode_errors_total",
			Help: "KV-event payloads that failed to decode.",
		}),
		gaps: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_gaps_total",
			Help: "Sequence gaps seen within a stream.",
		}),
		missedBatches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_missed_batches_total",
			Help: "Batches skipped by sequence gaps.",
		}),
		restarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_engine_restarts_total",
			Help: "Engine restarts detected from Kv-Instance or the sequence going back.",
		}),
		uncertain: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_events_uncertain_total",
			Help: "Streams reported uncertain to the sink, by reason.",
		}, []string{"reason"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_events_dropped_messages_total",
			Help: "Messages that never reached the sink, by reason.",
		}, []string{"reason"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_heartbeats_total",
			Help: "Publisher heartbeats received (Kv-Heartbeat).",
		}),
		lostTails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_events_lost_tails_total",
			Help: "Heartbeats that named a batch past the last one received: the stream's last batches were lost.",
		}),
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_events_lag_seconds",
			Help:    "Receive time minus the batch timestamp.",
			Buckets: lagBuckets,
		}),
	}
	m.applied = m.batches.WithLabelValues(resultApplied)
	m.duplicate = m.batches.WithLabelValues(resultDuplicate)
	m.badHeader = m.batches.WithLabelValues(resultBadHeader)
	m.decodeErrorBatch = m.batches.WithLabelValues(resultDecodeError)
	for _, k := range []events.Kind{events.KindBlockStored, events.KindBlockRemoved, events.KindAllBlocksCleared} {
		m.eventsApplied[k] = m.events.WithLabelValues(k.String(), resultApplied)
	}
	m.eventsSkipped = m.events.WithLabelValues("unknown", resultSkipped)
	m.droppedBadHeader = m.dropped.WithLabelValues(resultBadHeader)
	m.droppedDecode = m.dropped.WithLabelValues(resultDecodeError)
	m.droppedDuplicate = m.dropped.WithLabelValues(resultDuplicate)
	m.droppedSlow = m.dropped.WithLabelValues(dropSlowConsumer)
	for _, r := range []events.Reason{events.ReasonGap, events.ReasonReconnect, events.ReasonSlowConsumer, events.ReasonLateJoin, events.ReasonLostTail} {
		m.uncertain.WithLabelValues(r.String())
	}
	return m
}

func (m *consumerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{
		m.batches, m.events, m.blocks, m.decodeErrors, m.gaps, m.missedBatches,
		m.restarts, m.uncertain, m.dropped, m.lag, m.heartbeats, m.lostTails,
	}
}

// queueDepth reports each worker's queue length at scrape time, which costs
// the hot path nothing.
type queueDepth struct {
	desc   *prometheus.Desc
	queues []chan item
}

func newQueueDepth(queues []chan item) *queueDepth {
	return &queueDepth{
		desc: prometheus.NewDesc("kvroute_events_queue_depth",
			"Batches waiting in each consumer worker's queue.", []string{"worker"}, nil),
		queues: queues,
	}
}

func (q *queueDepth) Describe(ch chan<- *prometheus.Desc) { ch <- q.desc }

func (q *queueDepth) Collect(ch chan<- prometheus.Metric) {
	for i, c := range q.queues {
		ch <- prometheus.MustNewConstMetric(q.desc, prometheus.GaugeValue, float64(len(c)), strconv.Itoa(i))
	}
}
