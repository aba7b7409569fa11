// Package leastload holds the load filters of the upstream EPP's first
// scheduler (its v0.5 decision tree): low-queue-filter keeps endpoints whose
// queue is at most a threshold; least-queue-filter and least-kv-cache-filter
// keep the endpoints in the lowest band of queue length or KV-cache usage.
// Endpoints with stale metrics are judged on what was last scraped, as
// upstream judges them.
package leastload

import (
	"context"
	"encoding/json"
	"math"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// The registered type names.
const (
	LowQueueType    = "low-queue-filter"
	LeastQueueType  = "least-queue-filter"
	LeastKVType     = "least-kv-cache-filter"
	DefaultLowQueue = 128
)

// LowQueue keeps the endpoints whose waiting queue is at most Threshold.
type LowQueue struct {
	name      plugin.TypedName
	threshold int
}

var _ framework.Filter = (*LowQueue)(nil)

// LowQueueFactory makes a low-queue-filter; threshold defaults to 128.
func LowQueueFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	p := struct {
		Threshold int `json:"threshold"`
	}{DefaultLowQueue}
	if err := framework.DecodeParams(LowQueueType, name, raw, &p); err != nil {
		return nil, err
	}
	return &LowQueue{name: plugin.TypedName{Type: LowQueueType, Name: name}, threshold: p.Threshold}, nil
}

// TypedName implements plugin.Plugin.
func (f *LowQueue) TypedName() plugin.TypedName { return f.name }

// Filter implements framework.Filter.
func (f *LowQueue) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	out := cands[:0:0]
	for _, c := range cands {
		if c.Metrics.WaitingQueueSize <= f.threshold {
			out = append(out, c)
		}
	}
	return out
}

// Band keeps the endpoints whose reading lies in the lowest 1/n of the
// readings' range, n being the number of candidates: all of them when the
// readings are equal, the least loaded few when they spread.
type Band struct {
	name plugin.TypedName
	read func(*datalayer.Metrics) float64
	// whole: the readings are counts, whose band upstream divides as
	// integers.
	whole bool
}

var _ framework.Filter = (*Band)(nil)

func bandFactory(typ string, whole bool, read func(*datalayer.Metrics) float64) framework.Factory {
	return func(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		var p struct{}
		if err := framework.DecodeParams(typ, name, raw, &p); err != nil {
			return nil, err
		}
		return &Band{name: plugin.TypedName{Type: typ, Name: name}, read: read, whole: whole}, nil
	}
}

// LeastQueueFactory makes a least-queue-filter.
var LeastQueueFactory = bandFactory(LeastQueueType, true, func(m *datalayer.Metrics) float64 { return float64(m.WaitingQueueSize) })

// LeastKVFactory makes a least-kv-cache-filter.
var LeastKVFactory = bandFactory(LeastKVType, false, func(m *datalayer.Metrics) float64 { return m.KVCacheUsage })

// TypedName implements plugin.Plugin.
func (f *Band) TypedName() plugin.TypedName { return f.name }

// Filter implements framework.Filter.
func (f *Band) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	if len(cands) == 0 {
		return cands
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range cands {
		v := f.read(c.Metrics)
		lo, hi = math.Min(lo, v), math.Max(hi, v)
	}
	top := lo + (hi-lo)/float64(len(cands))
	if f.whole {
		top = lo + math.Floor((hi-lo)/float64(len(cands)))
	}
	out := cands[:0:0]
	for _, c := range cands {
		if v := f.read(c.Metrics); v >= lo && v <= top {
			out = append(out, c)
		}
	}
	return out
}
