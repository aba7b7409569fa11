package consumer

import (
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

// verdict is what the sequence tracker makes of a batch before it is applied.
type verdict uint8

const (
	// verdictNext: the expected next batch; apply it.
	verdictNext verdict = iota
	// verdictFirst: the first batch seen from the stream. If its seq is not 0
	// the engine published batches before we listened, so the sink is told
	// the stream is missing its history (Uncertain, ReasonLateJoin) before
	// the batch is applied. Publishers that count from 1 therefore always
	// cause one such report per stream, which leaves it partial, not
	// uncertain: nothing since was missed.
	verdictFirst
	// verdictGap: seq skipped ahead; report the gap, then apply.
	verdictGap
	// verdictRestart: the engine restarted (new instance, or seq went back
	// to 0 or further back than any redelivery would); report the restart,
	// then apply as if the stream were new.
	verdictRestart
	// verdictDuplicate: seen already (or older, from the same instance); drop.
	verdictDuplicate
)

// restartWindow is how far back seq may go within one instance and still be
// taken for a late copy (a relay replaying after a gap) rather than a new
// engine. It only matters for publishers that keep Kv-Instance across an
// engine restart and lose the new engine's batch 0: then the first
// restartWindow batches of the new engine are dropped as duplicates at most.
const restartWindow = 1024

// seqState is one stream's sequence position. It is owned by a single
// worker, so it needs no lock.
type seqState struct {
	instance string
	last     uint64
	seen     time.Time // when the last batch was accepted, for idle eviction
}

// classify says what to do with o given the stream's state st (nil for a
// stream never seen). It does not change st: the caller commits only once
// the batch has decoded, so that an undecodable batch shows up as a gap
// before the next one.
func classify(st *seqState, o events.Origin) verdict {
	switch {
	case st == nil:
		return verdictFirst
	case o.Instance != st.instance:
		return verdictRestart
	case o.Seq == st.last+1:
		return verdictNext
	case o.Seq > st.last:
		return verdictGap
	case o.Seq == st.last:
		return verdictDuplicate
	case o.Seq == 0 || st.last-o.Seq > restartWindow:
		return verdictRestart
	}
	return verdictDuplicate
}

// missed returns how many batches a verdictGap skipped.
func missed(st *seqState, o events.Origin) uint64 { return o.Seq - st.last - 1 }

// commit records o as the stream's latest applied batch.
func (st *seqState) commit(o events.Origin, now time.Time) {
	st.instance, st.last, st.seen = o.Instance, o.Seq, now
}
