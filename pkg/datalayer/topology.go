package datalayer

import "fmt"

// The standard node labels topology is read from, and the rack label read
// unless another is configured (Kubernetes has no standard one; llm-d's
// topology-extractor reads this one by default).
const (
	HostnameLabel    = "kubernetes.io/hostname"
	ZoneLabel        = "topology.kubernetes.io/zone"
	RegionLabel      = "topology.kubernetes.io/region"
	DefaultRackLabel = "topology.kubernetes.io/rack"
)

// Topology is where an endpoint runs: its node's host, rack, zone and
// region. An empty field is unknown, and matches nothing.
type Topology struct {
	Host   string `json:"hostname,omitempty"`
	Rack   string `json:"rack,omitempty"`
	Zone   string `json:"zone,omitempty"`
	Region string `json:"region,omitempty"`
}

// IsZero reports whether nothing is known of the endpoint's place.
func (t Topology) IsZero() bool { return t == Topology{} }

// TopologyFromLabels reads a topology from a node's labels; rackLabel ""
// reads DefaultRackLabel.
func TopologyFromLabels(labels map[string]string, rackLabel string) Topology {
	if rackLabel == "" {
		rackLabel = DefaultRackLabel
	}
	return Topology{
		Host:   labels[HostnameLabel],
		Rack:   labels[rackLabel],
		Zone:   labels[ZoneLabel],
		Region: labels[RegionLabel],
	}
}

// Distance is how far apart two endpoints are: the tightest level of
// topology they share. Levels are ordered tightest first, so a smaller
// Distance is nearer.
type Distance uint8

// The distances.
const (
	// SameHost: one node (NVLink or PCIe between the GPUs).
	SameHost Distance = iota
	// SameRack: one rack, different hosts (one switch hop).
	SameRack
	// SameZone: one zone, different racks.
	SameZone
	// SameRegion: one region, different zones.
	SameRegion
	// Apart: known places that share no level.
	Apart
	// Unknown: at least one of the two places is not known at all.
	Unknown

	// NumDistances sizes arrays indexed by Distance.
	NumDistances
)

// Levels are the distances a topology level names, tightest first.
var Levels = [...]Distance{SameHost, SameRack, SameZone, SameRegion}

func (d Distance) String() string {
	switch d {
	case SameHost:
		return "host"
	case SameRack:
		return "rack"
	case SameZone:
		return "zone"
	case SameRegion:
		return "region"
	case Apart:
		return "apart"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// ParseLevel reads a level's name as upstream's parameters give it: host,
// rack, zone or region.
func ParseLevel(s string) (Distance, error) {
	for _, d := range Levels {
		if d.String() == s {
			return d, nil
		}
	}
	return Unknown, fmt.Errorf("topology level %q, want host, rack, zone or region", s)
}

// DistanceTo is the tightest level t and o share. A level counts only
// when both values are set and equal, so two endpoints that both lack a
// rack are not in one rack; a host implies its rack, zone and region, as
// labels from one node do.
func (t Topology) DistanceTo(o Topology) Distance {
	if t.IsZero() || o.IsZero() {
		return Unknown
	}
	same := func(a, b string) bool { return a != "" && a == b }
	switch {
	case same(t.Host, o.Host):
		return SameHost
	case same(t.Rack, o.Rack):
		return SameRack
	case same(t.Zone, o.Zone):
		return SameZone
	case same(t.Region, o.Region):
		return SameRegion
	}
	return Apart
}
