// Package topologyaffinity is upstream's topology-affinity-scorer: in the
// later stage of a split request it scores each candidate by how near it
// is to the earlier pick, on upstream's fixed curve (same host 1, rack
// 0.2, zone 0.05, region 0.02, else 0). Without an earlier pick or a known
// place for it, every candidate scores 0, adding nothing to the profile.
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
const Type = "topology-affinity-scorer"

// Params are upstream's parameters.
type Params struct {
	// TopologyProducerName names the topology-extractor whose pod labels
	// are read; empty reads the one named topology-extractor, if any.
	TopologyProducerName string `json:"topologyProducerName"`
}

// Scorer is the topology-affinity-scorer.
type Scorer struct {
	name     plugin.TypedName
	producer string
	ext      *topology.Extractor
}

var (
	_ framework.Scorer   = (*Scorer)(nil)
	_ framework.Resolver = (*Scorer)(nil)
)

// New makes the scorer; ext nil reads the nodes' topology alone.
func New(name string, ext *topology.Extractor) *Scorer {
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, ext: ext}
}

// Factory makes the scorer from its parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	s := New(name, nil)
	s.producer = p.TopologyProducerName
	return s, nil
}

// ResolveRefs implements framework.Resolver.
func (s *Scorer) ResolveRefs(fh framework.Handle) error {
	ext, err := topology.Resolve(fh, Type, s.name.Name, s.producer)
	s.ext = ext
	return err
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Affinity }

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	peer, ok := topology.Peer(cs, s.ext)
	for i, c := range cands {
		out[i] = 0
		if ok {
			out[i] = topology.Proximity(peer.DistanceTo(s.ext.Of(c)))
		}
	}
}
