// Package kvlink is what moving a split request's KV blocks from the
// prefill pod to the decode pod costs: the model's KV bytes per token over
// the link between the two pods, which depends on how near they are. The
// decider weighs it against local prefill; the latency-scorer adds it to
// each prefill pod's predicted latency when it picks the prefill pod
// after the decode pod, so that a nearer pod wins only by the time its
// link saves.
package kvlink

import (
	"fmt"
	"math"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// Params are the link parameters, as a plugin's configuration names them
// (embedded in the plugin's parameters); DefaultParams gives the defaults.
type Params struct {
	// KVBytesPerToken is the model's KV cache per token, in bytes: layers ×
	// KV heads × head size × 2 (K and V) × bytes per element (131072 for
	// Llama 3 8B in 16 bits). A block moves blockSize times this.
	KVBytesPerToken float64 `json:"kvBytesPerToken"`
	// TransferGBps is the link's bandwidth between prefill and decode
	// pods, in gigabytes (1e9 bytes) per second.
	TransferGBps float64 `json:"transferGBps"`
	// TransferLatencyMs is a transfer's fixed cost, in milliseconds
	// (connector handshake, the decode pod's pull request).
	TransferLatencyMs float64 `json:"transferLatencyMs"`
	// TransferByDistance is the link between a prefill pod and the decode
	// pod by how near they are (host, rack, zone or region: the tightest
	// level their nodes share); each level given whole. Pods farther
	// apart, of unknown place, or at a level not given use TransferGBps
	// and TransferLatencyMs.
	TransferByDistance map[string]Link `json:"transferByDistance"`
}

// Link is a KV transfer path's bandwidth and fixed cost.
type Link struct {
	GBps      float64 `json:"gbps"`
	LatencyMs float64 `json:"latencyMs"`
}

// DefaultTransferByDistance is what a transfer costs by distance unless
// configured: a host's GPUs over NVLink or PCIe (100 GB/s, 0.2 ms), a
// rack's 200 Gb/s NIC through one switch (25 GB/s, 0.5 ms), a zone's
// 100 Gb/s over several hops (12.5 GB/s, 1 ms, the default link), a
// region's links between zones (2.5 GB/s, 5 ms). Measured figures
// (kvroute_pd_transfer_duration_seconds, by distance) should replace them.
func DefaultTransferByDistance() map[string]Link {
	return map[string]Link{
		"host":   {GBps: 100, LatencyMs: 0.2},
		"rack":   {GBps: 25, LatencyMs: 0.5},
		"zone":   {GBps: 12.5, LatencyMs: 1},
		"region": {GBps: 2.5, LatencyMs: 5},
	}
}

// DefaultParams are a Llama-3-8B-sized KV over a 100 Gb/s link with 1 ms
// per transfer, faster within a rack or a host (DefaultTransferByDistance).
func DefaultParams() Params {
	return Params{KVBytesPerToken: 131072, TransferGBps: 12.5, TransferLatencyMs: 1, TransferByDistance: DefaultTransferByDistance()}
}

// Model prices transfers.
type Model struct {
	bytesPerToken float64
	// links are the link at each distance, indexed by datalayer.Distance:
	// the configured level's, else the default link.
	links [datalayer.NumDistances]link
}

// link is a Link in the units the hot path uses.
type link struct {
	// bytesPerMs is the bandwidth in bytes per millisecond.
	bytesPerMs, latencyMs float64
}

// New makes the model, refusing parameters out of range with an error
// that names the parameter.
func New(p Params) (*Model, error) {
	finite := func(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
	switch {
	case !(p.KVBytesPerToken > 0) || !finite(p.KVBytesPerToken):
		return nil, fmt.Errorf("kvBytesPerToken = %v, want > 0", p.KVBytesPerToken)
	case !(p.TransferGBps > 0) || !finite(p.TransferGBps):
		return nil, fmt.Errorf("transferGBps = %v, want > 0", p.TransferGBps)
	case !(p.TransferLatencyMs >= 0) || !finite(p.TransferLatencyMs):
		return nil, fmt.Errorf("transferLatencyMs = %v, want ≥ 0", p.TransferLatencyMs)
	}
	m := &Model{bytesPerToken: p.KVBytesPerToken}
	for i := range m.links {
		m.links[i] = link{bytesPerMs: p.TransferGBps * 1e6, latencyMs: p.TransferLatencyMs}
	}
	for level, l := range p.TransferByDistance {
		dist, err := datalayer.ParseLevel(level)
		if err != nil {
			return nil, fmt.Errorf("transferByDistance: %v", err)
		}
		if !(l.GBps > 0) || !finite(l.GBps) || !(l.LatencyMs >= 0) || !finite(l.LatencyMs) {
			return nil, fmt.Errorf("transferByDistance.%s = {gbps: %v, latencyMs: %v}, want gbps > 0 and latencyMs ≥ 0", level, l.GBps, l.LatencyMs)
		}
		m.links[dist] = link{bytesPerMs: l.GBps * 1e6, latencyMs: l.LatencyMs}
	}
	return m, nil
}

// TransferMsAt is the predicted time to move the KV of uncached prompt
// tokens between pods at distance dist, in whole blocks of blockSize
// tokens (vLLM's connector moves blocks), in milliseconds.
func (m *Model) TransferMsAt(uncached, blockSize int, dist datalayer.Distance) float64 {
	if uncached <= 0 {
		return 0
	}
	tokens := uncached
	if blockSize > 1 {
		tokens = (uncached + blockSize - 1) / blockSize * blockSize
	}
	l := m.links[min(dist, datalayer.Unknown)]
	return l.latencyMs + float64(tokens)*m.bytesPerToken/l.bytesPerMs
}
