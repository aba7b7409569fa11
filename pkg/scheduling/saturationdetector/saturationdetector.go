// Package saturationdetector decides when an endpoint is saturated, by the queue and
// KV-cache thresholds the saturation filter and admission share. Its Detector
// is the utilization-detector plugin that a configuration's
// saturationDetector names.
package saturationdetector

import (
	"encoding/json"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the detector's registered type name, as upstream names it.
const Type = "utilization-detector"

// Default thresholds, as upstream.
const (
	DefaultQueueDepthThreshold  = 5
	DefaultKVCacheUtilThreshold = 0.8
)

// Thresholds say when an endpoint with fresh metrics is saturated.
type Thresholds struct {
	// QueueDepth: a waiting queue this long or longer is saturated.
	QueueDepth int
	// KVCacheUtil: KV usage this high or higher is saturated.
	KVCacheUtil float64
}

// DefaultThresholds returns upstream's thresholds: queue 5, KV usage 0.8.
func DefaultThresholds() Thresholds {
	return Thresholds{QueueDepth: DefaultQueueDepthThreshold, KVCacheUtil: DefaultKVCacheUtilThreshold}
}

// Over reports whether metrics m exceed the thresholds, regardless of age.
func (t Thresholds) Over(m *datalayer.Metrics) bool {
	return m.WaitingQueueSize >= t.QueueDepth || m.KVCacheUsage >= t.KVCacheUtil
}

// Detector decides whether the pool is saturated for admission.
type Detector struct {
	name       plugin.TypedName
	thresholds Thresholds
	staleness  time.Duration
}

var _ plugin.Plugin = (*Detector)(nil)

// NewDetector makes a detector. Metrics older than staleness count as
// saturated.
func NewDetector(name string, t Thresholds, staleness time.Duration) *Detector {
	return &Detector{name: plugin.TypedName{Type: Type, Name: name}, thresholds: t, staleness: staleness}
}

// Params are the detector's parameters, with upstream's names.
type Params struct {
	QueueDepthThreshold  *int     `json:"queueDepthThreshold,omitempty"`
	KVCacheUtilThreshold *float64 `json:"kvCacheUtilThreshold,omitempty"`
	// MetricsStalenessThreshold is a Go duration ("200ms"); default the
	// process-wide staleness threshold (2s), not upstream's 200ms, so that
	// the scorers and admission agree on when load is unknown.
	MetricsStalenessThreshold string `json:"metricsStalenessThreshold,omitempty"`
}

// Factory makes the detector from its configuration.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	t := DefaultThresholds()
	if p.QueueDepthThreshold != nil {
		if *p.QueueDepthThreshold < 1 {
			return nil, framework.ParamError(Type, name, "queueDepthThreshold = %d, want ≥ 1", *p.QueueDepthThreshold)
		}
		t.QueueDepth = *p.QueueDepthThreshold
	}
	if p.KVCacheUtilThreshold != nil {
		if v := *p.KVCacheUtilThreshold; !(v > 0 && v <= 1) {
			return nil, framework.ParamError(Type, name, "kvCacheUtilThreshold = %v, want a value in (0,1]", v)
		}
		t.KVCacheUtil = *p.KVCacheUtilThreshold
	}
	staleness := framework.StalenessOf(h)
	if p.MetricsStalenessThreshold != "" {
		d, err := time.ParseDuration(p.MetricsStalenessThreshold)
		if err != nil || d <= 0 {
			return nil, framework.ParamError(Type, name, "metricsStalenessThreshold = %q, want a positive duration", p.MetricsStalenessThreshold)
		}
		staleness = d
	}
	return NewDetector(name, t, staleness), nil
}

// TypedName implements plugin.Plugin.
func (d *Detector) TypedName() plugin.TypedName { return d.name }

// Thresholds returns the detector's thresholds.
func (d *Detector) Thresholds() Thresholds { return d.thresholds }

// Saturated reports whether c is saturated at now. Stale metrics count as
// saturated, as upstream: admission must not let sheddable load through on
// the strength of a reading it cannot trust.
func (d *Detector) Saturated(c *datalayer.Candidate, now time.Time) bool {
	return !c.Metrics.Fresh(now, d.staleness) || d.thresholds.Over(c.Metrics)
}

// AllSaturated reports whether every candidate is saturated; true for none.
func (d *Detector) AllSaturated(cands []*datalayer.Candidate, now time.Time) bool {
	for _, c := range cands {
		if !d.Saturated(c, now) {
			return false
		}
	}
	return true
}
