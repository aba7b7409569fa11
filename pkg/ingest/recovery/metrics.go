package recovery

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
)

// metrics are the kvroute_recovery_* series.
type metrics struct {
	// resyncs_total{result}: resyncs by outcome; ok is the only one that
	// leaves the stream exact, partial leaves it partial (settled).
	resyncs *prometheus.CounterVec
	// resync_duration_seconds: request to installed, for installed snapshots.
	duration prometheus.Histogram
	// snapshot_blocks: blocks named by each installed snapshot.
	blocks prometheus.Histogram
	// in_flight: snapshots requested and not yet installed or abandoned.
	inFlight prometheus.Gauge
	// buffered_batches: live batches held back behind awaited snapshots.
	held prometheus.Gauge
	// lost_tails_total: heartbeats that showed a stream's tail lost.
	lostTails prometheus.Counter
	// distrusted_total: streams marked uncertain because the engine's
	// cached-token reports disagreed with the index.
	distrusted prometheus.Counter
}

// results maps a resync's error to its label; the first match wins.
var results = []struct {
	err   error
	label string
}{
	{errPartial, "partial"},
	{ErrNoResponders, "no_responders"},
	{ErrRefused, "refused"},
	{ErrTimeout, "timeout"},
	{ErrInvalid, "invalid"},
	{ErrTooLarge, "too_large"},
	{ErrNoPod, "no_pod"},
	{ErrOverflow, "overflow"},
	{ErrInstanceMismatch, "instance_mismatch"},
	{ErrAborted, "aborted"},
	{ErrInexact, "inexact"},
	{ErrGap, "gap"},
	{ErrDoubt, "doubt"},
	{index.ErrIncompleteInstall, "incomplete"},
	{index.ErrNotMember, "not_member"},
	{context.Canceled, "cancelled"},
}

func resultLabel(err error) string {
	if err == nil {
		return "ok"
	}
	for _, r := range results {
		if errors.Is(err, r.err) {
			return r.label
		}
	}
	return "error"
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_recovery_resyncs_total",
			Help: "Stream resynchronisations from relay snapshots, by result (ok leaves the stream exact, partial partial).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_recovery_resync_duration_seconds",
			Help:    "Time from snapshot request to installed snapshot.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}),
		blocks: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_recovery_snapshot_blocks",
			Help:    "Blocks named by each installed snapshot.",
			Buckets: prometheus.ExponentialBuckets(16, 4, 10),
		}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_recovery_in_flight",
			Help: "Snapshot resyncs under way.",
		}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_recovery_buffered_batches",
			Help: "Live batches held back while their stream's snapshot is awaited.",
		}),
		lostTails: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_recovery_lost_tails_total",
			Help: "Streams found to have lost their last batches by a heartbeat, and resynchronised.",
		}),
		distrusted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_recovery_distrusted_total",
			Help: "Streams marked uncertain and resynchronised because their engine's cached-token reports disagreed with the index.",
		}),
	}
	// Every result is exported from the start, so that rates and alerts
	// need no absent() guards.
	m.resyncs.WithLabelValues("ok")
	for _, r := range results {
		m.resyncs.WithLabelValues(r.label)
	}
	m.resyncs.WithLabelValues("error")
	if reg != nil {
		for _, c := range []prometheus.Collector{m.resyncs, m.duration, m.blocks, m.inFlight, m.held, m.lostTails, m.distrusted} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register recovery metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *metrics) result(err error) { m.resyncs.WithLabelValues(resultLabel(err)).Inc() }
