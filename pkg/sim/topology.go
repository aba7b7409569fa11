package sim

import (
	"sync"
	"time"
)

// Place is where an engine runs, as its node's labels would say: host,
// rack, zone and region. An empty field is unknown and matches nothing.
type Place struct {
	Host, Rack, Zone, Region string
}

// Near is how near two engines are: the tightest level their places
// share.
type Near uint8

// The levels, tightest first.
const (
	NearHost Near = iota
	NearRack
	NearZone
	NearRegion
	// NearNone: the places share no level, or one is unknown.
	NearNone
)

func (n Near) String() string {
	return [...]string{"host", "rack", "zone", "region", "none"}[min(n, NearNone)]
}

// NearTo is the tightest level p and q share.
func (p Place) NearTo(q Place) Near {
	same := func(a, b string) bool { return a != "" && a == b }
	switch {
	case same(p.Host, q.Host):
		return NearHost
	case same(p.Rack, q.Rack):
		return NearRack
	case same(p.Zone, q.Zone):
		return NearZone
	case same(p.Region, q.Region):
		return NearRegion
	}
	return NearNone
}

// Link is a transfer path's cost: a fixed latency per pull and a
// bandwidth in bytes per second (0: unbounded).
type Link struct {
	Latency   time.Duration
	Bandwidth float64
}

// places maps the engines' addresses to their places, for a decode
// engine to find how far the prefill engine its kv_transfer_params name
// is.
type places struct {
	mu sync.RWMutex
	m  map[string]Place
}

func (ps *places) set(addr string, p Place) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.m == nil {
		ps.m = map[string]Place{}
	}
	ps.m[addr] = p
}

func (ps *places) of(addr string) (Place, bool) {
	ps.mu.RLock()
	defer ps.mu.RUnlock()
	p, ok := ps.m[addr]
	return p, ok
}
