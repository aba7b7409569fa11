// Package topology is upstream's topology-extractor and what the topology
// plugins share: an endpoint's place (its node's host, rack, zone and
// region, which discovery reads), overlaid with the pod labels the
// extractor's parameters name, and the peer a later stage of a split
// request is placed near.
package topology

import (
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// ExtractorType is the extractor's registered type name, upstream's.
const ExtractorType = "topology-extractor"

// Extractor says where an endpoint runs. Discovery gives every endpoint
// its node's topology; a pod label the parameters name, when the pod has
// it, overrides its field (upstream reads these labels from the pod, so a
// deployment that labels its pods with a slice or rack keeps its meaning).
type Extractor struct {
	name plugin.TypedName
	p    ExtractorParams
}

var _ plugin.Plugin = (*Extractor)(nil)

// ExtractorParams name the pod labels read for each field, upstream's
// parameters with upstream's defaults.
type ExtractorParams struct {
	Hostname string `json:"hostname"`
	Rack     string `json:"rack"`
	Zone     string `json:"zone"`
	Region   string `json:"region"`
}

// NewExtractor makes an extractor; an empty label name reads the
// standard label.
func NewExtractor(name string, p ExtractorParams) *Extractor {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	p.Hostname = or(p.Hostname, datalayer.HostnameLabel)
	p.Rack = or(p.Rack, datalayer.DefaultRackLabel)
	p.Zone = or(p.Zone, datalayer.ZoneLabel)
	p.Region = or(p.Region, datalayer.RegionLabel)
	return &Extractor{name: plugin.TypedName{Type: ExtractorType, Name: name}, p: p}
}

// ExtractorFactory makes a topology-extractor.
func ExtractorFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p ExtractorParams
	if err := framework.DecodeParams(ExtractorType, name, raw, &p); err != nil {
		return nil, err
	}
	return NewExtractor(name, p), nil
}

// TypedName implements plugin.Plugin.
func (e *Extractor) TypedName() plugin.TypedName { return e.name }

// Of is where c runs: its node's topology with the configured pod labels
// over it. A nil extractor gives the node's topology alone.
func (e *Extractor) Of(c *datalayer.Candidate) datalayer.Topology {
	t := c.Topology
	if e == nil || len(c.Labels) == 0 {
		return t
	}
	set := func(dst *string, label string) {
		if v, ok := c.Labels[label]; ok && v != "" {
			*dst = v
		}
	}
	set(&t.Host, e.p.Hostname)
	set(&t.Rack, e.p.Rack)
	set(&t.Zone, e.p.Zone)
	set(&t.Region, e.p.Region)
	return t
}

// Resolve finds the extractor a consumer names (topologyProducerName),
// or, when it names none, the configuration's instance named
// topology-extractor if there is one; nil means the nodes' topology alone.
func Resolve(fh framework.Handle, typ, name, producer string) (*Extractor, error) {
	ref := producer
	if ref == "" {
		ref = ExtractorType
	}
	p, ok := fh.Plugin(ref)
	if !ok {
		if producer != "" {
			return nil, framework.ParamError(typ, name, "topologyProducerName names plugin %q, which the configuration does not define", producer)
		}
		return nil, nil
	}
	e, ok := p.(*Extractor)
	if !ok {
		if producer != "" {
			return nil, framework.ParamError(typ, name, "topologyProducerName names plugin %q of type %s, which is not a %s", producer, p.TypedName().Type, ExtractorType)
		}
		return nil, nil
	}
	return e, nil
}

// Peer is the place of the pick this stage is placed near (the decode
// pick, when the prefill profile runs after it), false when there is none
// or nothing is known of its place.
func Peer(cs *framework.CycleState, e *Extractor) (datalayer.Topology, bool) {
	if cs == nil {
		return datalayer.Topology{}, false
	}
	c, ok := cs.Peer()
	if !ok {
		return datalayer.Topology{}, false
	}
	t := e.Of(c)
	return t, !t.IsZero()
}

// Proximity is upstream's score of each distance: shaped by the KV
// transfer's bandwidth at that distance (a host's NVLink far above a
// rack's NIC, each further switch hop less), so that one host wins
// outright and the looser levels still break ties.
func Proximity(d datalayer.Distance) float64 {
	switch d {
	case datalayer.SameHost:
		return 1
	case datalayer.SameRack:
		return 0.2
	case datalayer.SameZone:
		return 0.05
	case datalayer.SameRegion:
		return 0.02
	}
	return 0
}
