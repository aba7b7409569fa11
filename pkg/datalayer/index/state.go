package index

import (
	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// badness orders the states by how little they let the index claim: an
// endpoint reads as its least trustworthy stream.
var badness = [datalayer.NumStreamStates]int{
	datalayer.StreamNone:       0,
	datalayer.StreamExact:      1,
	datalayer.StreamPartial:    2,
	datalayer.StreamRecovering: 3,
	datalayer.StreamUncertain:  4,
}

// worse returns the less trustworthy of a and b.
func worse(a, b datalayer.StreamState) datalayer.StreamState {
	if b < datalayer.NumStreamStates && (a >= datalayer.NumStreamStates || badness[b] > badness[a]) {
		return b
	}
	return a
}

// lateJoin is a stream's state once its history before the first batch
// seen is known to be missing: an exact (or new) stream becomes partial, a
// stream already in doubt stays so.
func lateJoin(s datalayer.StreamState) datalayer.StreamState {
	switch s {
	case datalayer.StreamNone, datalayer.StreamExact:
		return datalayer.StreamPartial
	}
	return s
}

// SetStreamState sets one stream's state, as recovery decides it: recovering
// while a resync is due or under way, exact or partial once one succeeded,
// uncertain when it failed. The endpoint's other streams keep theirs.
func (ix *Index) SetStreamState(s events.Stream, state datalayer.StreamState) {
	if state >= datalayer.NumStreamStates {
		return
	}
	ep := ix.member(s.Endpoint)
	if ep == nil {
		return
	}
	ep.mu.Lock()
	if !ep.gone {
		ep.stream(s.DPRank).state = state
		ep.refreshState()
	}
	ep.mu.Unlock()
}

// StreamState returns one stream's state (StreamNone for a stream the
// index has no record of).
func (ix *Index) StreamState(s events.Stream) datalayer.StreamState {
	ep := ix.member(s.Endpoint)
	if ep == nil {
		return datalayer.StreamNone
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if st := ep.streams[s.DPRank]; st != nil {
		return st.state
	}
	return datalayer.StreamNone
}

// Streams returns the data-parallel ranks the index has a stream for at addr.
func (ix *Index) Streams(addr string) []events.Stream {
	ep := ix.member(addr)
	if ep == nil {
		return nil
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	out := make([]events.Stream, 0, len(ep.streams))
	for rank := range ep.streams {
		out = append(out, events.Stream{Endpoint: addr, DPRank: rank})
	}
	return out
}

// Holdings returns every block key addr holds for real (speculative
// holdings aside), each with the set of tiers holding it as a bit mask
// (1<<events.Tier), over all of its streams and, for a hybrid model, all
// of their KV-cache groups (a block any group holds). It is for checking
// the index against an engine's ground truth and for tooling, not for the
// request path: it copies the endpoint's whole state under its apply lock.
func (ix *Index) Holdings(addr string) map[uint64]uint8 {
	ep := ix.member(addr)
	if ep == nil {
		return nil
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	n := 0
	for _, st := range ep.streams {
		n += len(st.handles)
	}
	out := make(map[uint64]uint8, n)
	for _, st := range ep.streams {
		for _, hv := range st.handles {
			out[hv&keyMask] |= uint8(hv &^ keyMask)
		}
		for g, sub := range st.groups {
			gm := groupMask(g)
			for _, hv := range sub.handles {
				out[hv&keyMask^gm] |= uint8(hv &^ keyMask)
			}
		}
	}
	return out
}
