package index

import (
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// Errors returned by InstallSnapshot.
var (
	// ErrNotMember: the snapshot's endpoint is not (or no longer) in the pool.
	ErrNotMember = errors.New("endpoint is not a member of the index")
	// ErrIncompleteInstall: part of the snapshot could not be applied (the
	// holding bound was reached, or a run named a parent the snapshot never
	// stored). What could be applied is installed; the stream stays
	// uncertain.
	ErrIncompleteInstall = errors.New("snapshot installed incompletely")
	// ErrUnknownParentInSnapshot: the only part that could not be applied
	// is runs naming a parent the snapshot never stored, which is what a
	// partial snapshot (a relay that joined late) is expected to hold. It
	// is an ErrIncompleteInstall.
	ErrUnknownParentInSnapshot = fmt.Errorf("%w: runs name parents the snapshot never stored", ErrIncompleteInstall)
)

// InstallSnapshot replaces what the stream o names holds with the state the
// chunks rebuild (docs/snapshot.md): under the endpoint's apply lock it
// forgets the stream's holdings, applies every chunk's events in order
// (chunks are not live batches, so the sequence check does not apply to
// them), and sets the stream's position to o.Seq under o.Instance, so that
// live batches up to o.Seq are then dropped as duplicates.
//
// The stream is left recovering: its endpoint's State says
// StreamRecovering from before the first holding is dropped until the
// caller, having applied the live batches it held back, sets the state the
// snapshot earned (MarkStreamExact, or SetStreamState). A lookup that runs
// during an install therefore sees a partly rebuilt endpoint, but flagged
// as not exact, never a half-installed state claimed exact.
func (ix *Index) InstallSnapshot(o events.Origin, chunks []*events.Batch) error {
	ep := ix.member(o.Endpoint)
	if ep == nil {
		return fmt.Errorf("install snapshot of %s: %w", o.Stream, ErrNotMember)
	}
	now := ix.now()
	var d delta
	ep.mu.Lock()
	if ep.gone {
		ep.mu.Unlock()
		return fmt.Errorf("install snapshot of %s: %w", o.Stream, ErrNotMember)
	}
	st := ep.stream(o.DPRank)
	st.state = datalayer.StreamRecovering
	ep.refreshState()

	ix.clearStream(ep, st, &d)
	// Applying marks the stream uncertain when it runs into the holding
	// bound; starting from exact tells that apart afterwards. The endpoint's
	// published state is not refreshed meanwhile, so nobody sees it.
	st.state = datalayer.StreamExact
	unknownParent := false
	for _, b := range chunks {
		ep.noteBlockSize(o, b)
		if ix.applyEvents(ep, st, o, b, now, &d) {
			unknownParent = true
		}
	}
	full := st.state == datalayer.StreamUncertain
	ep.addHeld(&d)
	st.instance, st.seq, st.hasSeq = o.Instance, o.Seq, true
	st.state = datalayer.StreamRecovering
	ep.refreshState()
	ep.last.Store(now.UnixNano())
	ep.mu.Unlock()
	ix.stats.add(&d)
	switch {
	case full:
		return fmt.Errorf("install snapshot of %s at seq %d: %w", o.Stream, o.Seq, ErrIncompleteInstall)
	case unknownParent:
		return fmt.Errorf("install snapshot of %s at seq %d: %w", o.Stream, o.Seq, ErrUnknownParentInSnapshot)
	}
	return nil
}

// MarkStreamExact declares one stream in step again, after a
// resynchronisation has rebuilt what it holds; the endpoint's other
// streams keep their state.
func (ix *Index) MarkStreamExact(s events.Stream) {
	ep := ix.member(s.Endpoint)
	if ep == nil {
		return
	}
	ep.mu.Lock()
	if !ep.gone {
		ep.stream(s.DPRank).state = datalayer.StreamExact
		ep.refreshState()
	}
	ep.mu.Unlock()
}

// StreamPosition returns the instance and seq of the last batch applied to a
// stream (or installed from a snapshot); ok is false when it has none.
func (ix *Index) StreamPosition(s events.Stream) (instance string, seq uint64, ok bool) {
	ep := ix.member(s.Endpoint)
	if ep == nil {
		return "", 0, false
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	st := ep.streams[s.DPRank]
	if st == nil || !st.hasSeq {
		return "", 0, false
	}
	return st.instance, st.seq, true
}
