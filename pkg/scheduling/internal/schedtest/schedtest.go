// Package schedtest builds realistic candidates and cycle states for the
// scheduling packages' tests and benchmarks.
package schedtest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Now is the fixed instant tests schedule at.
var Now = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// BlockSize is the block size, in tokens, of every endpoint built here.
const BlockSize = 16

// C describes one candidate.
type C struct {
	Name    string
	Queue   int
	Running int
	KV      float64
	// Stale makes the metrics a minute old; NeverScraped leaves them unset.
	Stale        bool
	NeverScraped bool
	// Prefix, when set, is published under PrefixCacheMatchInfoKey.
	Prefix   *datalayer.PrefixCacheInfo
	Active   []string
	Waiting  []string
	MaxLoRAs int
	// Labels are the pod's labels.
	Labels map[string]string
	// Topology is where the pod runs.
	Topology datalayer.Topology
}

// Build makes the candidate as a PrepareData step would leave it.
func (c C) Build() *datalayer.Candidate {
	ep := &datalayer.Endpoint{Name: c.Name, Address: c.Name + ":8000", Pod: c.Name, Namespace: "default", Model: "m", Labels: c.Labels, Topology: c.Topology}
	m := datalayer.Metrics{
		WaitingQueueSize: c.Queue, RunningRequests: c.Running, KVCacheUsage: c.KV,
		ActiveLoRAs: c.Active, WaitingLoRAs: c.Waiting, MaxLoRAs: c.MaxLoRAs,
		BlockSize: BlockSize, NumGPUBlocks: 10000, UpdateTime: Now.Add(-50 * time.Millisecond),
	}
	switch {
	case c.NeverScraped:
		m.UpdateTime = time.Time{}
	case c.Stale:
		m.UpdateTime = Now.Add(-time.Minute)
	}
	cand := datalayer.NewCandidate(ep, m, datalayer.StreamExact)
	if c.Prefix != nil {
		// Published as a value, as the prefix producer does.
		cand.Put(datalayer.PrefixCacheMatchInfoKey, *c.Prefix)
	}
	return cand
}

// Cands builds every described candidate.
func Cands(cs ...C) []*datalayer.Candidate {
	out := make([]*datalayer.Candidate, len(cs))
	for i, c := range cs {
		out[i] = c.Build()
	}
	return out
}

// Info is a prefix info over total blocks of which the leading gpu, cpu,
// storage and speculative blocks are held.
func Info(total, gpu, cpu, storage, spec int) *datalayer.PrefixCacheInfo {
	p := &datalayer.PrefixCacheInfo{
		TotalBlocks: total, BlockSizeTokens: BlockSize, SpeculativeBlocks: spec, Exact: true,
	}
	p.BlocksByTier[events.TierGPU] = gpu
	p.BlocksByTier[events.TierCPU] = cpu
	p.BlocksByTier[events.TierStorage] = storage
	p.MatchBlocks = gpu + cpu + storage + spec
	p.MatchTokens = p.MatchBlocks * BlockSize
	return p
}

// Cycle is a cycle state at Now with a fixed seed.
func Cycle() *framework.CycleState { return framework.NewCycleState(Now, 1, 2) }

// Names lists the candidates' names.
func Names(cands []*datalayer.Candidate) []string {
	out := make([]string, len(cands))
	for i, c := range cands {
		out[i] = c.Name
	}
	return out
}

// Fleet makes n candidates pod-0..pod-(n-1) with varied load and prefix
// holdings, the shape of a busy pool: every fourth pod holds part of the
// request's 128-block prefix, loads cycle through a range.
func Fleet(n int) []*datalayer.Candidate {
	cs := make([]C, n)
	for i := range cs {
		cs[i] = C{
			Name:    fmt.Sprintf("pod-%d", i),
			Queue:   i % 7,
			Running: 4 + i%13,
			KV:      float64(i%10) / 10,
			Prefix:  Info(128, 0, 0, 0, 0),
		}
		if i%4 == 0 {
			cs[i].Prefix = Info(128, (i*7)%100, 10, 5, 0)
		}
	}
	return Cands(cs...)
}

// NopSpeculator is a framework.Speculator that records nothing, for
// loading configurations with a speculative recorder (the default one).
type NopSpeculator struct{}

// Speculate implements framework.Speculator.
func (NopSpeculator) Speculate(string, []uint64, int) {}

// RecordHistory implements framework.HistoryRecorder.
func (NopSpeculator) RecordHistory(string, []uint64) {}

// ScoreCase is one row of a scorer's table test: the candidates, and the
// score each must get, within 1e-12.
type ScoreCase struct {
	Name  string
	Cands []C
	Want  []float64
}

// RunScoreCases scores each case's candidates with s, in a subtest of its
// own, for an empty request.
func RunScoreCases(t *testing.T, s framework.Scorer, cases []ScoreCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			t.Parallel()
			out := make([]float64, len(tc.Cands))
			s.Score(context.Background(), Cycle(), &request.Request{}, Cands(tc.Cands...), out)
			for i := range out {
				if math.Abs(out[i]-tc.Want[i]) > 1e-12 {
					t.Fatalf("scores = %v, want %v", out, tc.Want)
				}
			}
		})
	}
}

// RunFilter makes a filter with factory and raw parameters ("" for none),
// runs it over the candidates for an empty request, and returns the names
// it keeps.
func RunFilter(t *testing.T, factory framework.Factory, raw string, cs ...C) []string {
	t.Helper()
	var params json.RawMessage
	if raw != "" {
		params = json.RawMessage(raw)
	}
	p, err := factory("f", params, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, ok := p.(framework.Filter)
	if !ok {
		t.Fatalf("%s is not a filter", p.TypedName())
	}
	return Names(f.Filter(context.Background(), Cycle(), &request.Request{}, Cands(cs...)))
}
