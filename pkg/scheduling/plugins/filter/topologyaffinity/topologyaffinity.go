// Package topologyaffinity is upstream's topology-affinity-filter: in the
// later stage of a split request (the prefill profile after the decode
// pick, or decode after prefill when prefill runs first) it keeps the
// candidates at most minAffinity away from the earlier pick. It fails
// open: with no earlier pick, no known place for it, or no candidate near
// enough, every candidate passes, since nearness is a preference and must
// never leave a request without a pod.
package topologyaffinity

import (
	"context"
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/topology"
)

// Type is the plugin's registered type name, upstream's.
const Type = "topology-affinity-filter"

// Params are upstream's parameters.
type Params struct {
	// MinAffinity is the farthest level kept: host (the default), rack,
	// zone or region.
	MinAffinity string `json:"minAffinity"`
	// TopologyProducerName names the topology-extractor whose pod labels
	// are read; empty reads the one named topology-extractor, if any.
	TopologyProducerName string `json:"topologyProducerName"`
}

// Filter is the topology-affinity-filter.
type Filter struct {
	name     plugin.TypedName
	min      datalayer.Distance
	producer string
	ext      *topology.Extractor
}

var (
	_ framework.Filter   = (*Filter)(nil)
	_ framework.Resolver = (*Filter)(nil)
)

// New makes the filter keeping candidates at most min away from the peer.
func New(name string, min datalayer.Distance, ext *topology.Extractor) *Filter {
	return &Filter{name: plugin.TypedName{Type: Type, Name: name}, min: min, ext: ext}
}

// Factory makes the filter from its parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	if p.MinAffinity == "" {
		p.MinAffinity = datalayer.SameHost.String()
	}
	min, err := datalayer.ParseLevel(p.MinAffinity)
	if err != nil {
		return nil, framework.ParamError(Type, name, "minAffinity: %v", err)
	}
	f := New(name, min, nil)
	f.producer = p.TopologyProducerName
	return f, nil
}

// ResolveRefs implements framework.Resolver.
func (f *Filter) ResolveRefs(fh framework.Handle) error {
	ext, err := topology.Resolve(fh, Type, f.name.Name, f.producer)
	f.ext = ext
	return err
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	peer, ok := topology.Peer(cs, f.ext)
	if !ok {
		return cands
	}
	var out []*datalayer.Candidate
	for i, c := range cands {
		if peer.DistanceTo(f.ext.Of(c)) <= f.min {
			if out == nil {
				// Written whole before it is read, as the role filters do.
				out = datalayer.RequestMemoryOverwritten[*datalayer.Candidate](cands, f, len(cands)-i)[:0]
			}
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return cands
	}
	return out
}
