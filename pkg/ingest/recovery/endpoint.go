package recovery

import (
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

// endpointGate spaces out the resyncs of one endpoint's streams: one at a
// time, and after a failure of any of them none until the endpoint's own
// backoff has passed. The consumer bounds the streams an endpoint may have
// (its data-parallel ranks); the gate bounds the work they cause, so that
// a relay that keeps failing costs one snapshot request per backoff
// however many streams name it.
type endpointGate struct {
	inFlight  bool
	failures  int
	notBefore time.Time
}

// gate returns the endpoint's gate, made on first use. Called with r.mu held.
func (r *Recovery) gate(addr string) *endpointGate {
	g := r.gates[addr]
	if g == nil {
		g = &endpointGate{}
		r.gates[addr] = g
	}
	return g
}

// gateBlocks reports whether the endpoint's gate holds a resync back now,
// and until when when it is backing off. Called with r.mu held.
func (r *Recovery) gateBlocks(addr string, now time.Time) (blocked bool, until time.Time) {
	g := r.gate(addr)
	switch {
	case g.inFlight:
		return true, time.Time{} // the resync in flight wakes Run when it ends
	case g.notBefore.After(now):
		return true, g.notBefore
	}
	return false, time.Time{}
}

// gateDone records a resync's end on its endpoint's gate, if the endpoint
// is still tracked; failed says it counts as a failure. Called with r.mu
// held.
func (r *Recovery) gateDone(addr string, failed bool, now time.Time) {
	g := r.gates[addr]
	if g == nil {
		return
	}
	g.inFlight = false
	if !failed {
		g.failures, g.notBefore = 0, time.Time{}
		return
	}
	g.failures++
	g.notBefore = now.Add(r.backoff(g.failures))
}

// DefaultMaxHeldBytes is Options.MaxHeldBytes when zero.
const DefaultMaxHeldBytes = 64 << 20

// batchBytes is about what a copy of b takes: its hashes and tokens, and
// a fixed share per event.
func batchBytes(b *events.Batch) int {
	n := 64
	for i := range b.Events {
		e := &b.Events[i]
		n += 128 + 8*len(e.BlockHashes) + 4*len(e.TokenIDs)
	}
	return n
}

// heldBytes sums batchBytes over what a stream holds back. It runs once
// per batch held, over at most MaxHeldBatches.
func heldBytes(held []heldBatch) int {
	n := 0
	for _, h := range held {
		n += batchBytes(h.b)
	}
	return n
}
