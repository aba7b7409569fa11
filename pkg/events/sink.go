package events

import "fmt"

// Stream identifies one engine's event stream: an endpoint the gateway routes
// to, and the data-parallel rank of the engine behind it. Its fields come from
// the NATS headers of the contract, held to the pod the subject names.
type Stream struct {
	// Endpoint is the ip:port the gateway routes to (Kv-Endpoint).
	Endpoint string
	// DPRank is the data-parallel rank (Kv-DP-Rank); ranks are separate engines
	// with separate caches and separate hash handles.
	DPRank int
}

func (s Stream) String() string { return fmt.Sprintf("%s/rank%d", s.Endpoint, s.DPRank) }

// Origin is what the headers say about the engine that produced a batch,
// beyond the stream it belongs to.
type Origin struct {
	Stream
	Pod       string // Kv-Pod
	Model     string // Kv-Model
	Instance  string // Kv-Instance, changes when the engine restarts
	BlockSize int    // Kv-Block-Size
	Seq       uint64 // Kv-Seq, vLLM's batch sequence number
}

// Reason says why a stream's state became uncertain.
type Reason uint8

// The reasons a stream can become uncertain.
const (
	// ReasonGap: one or more batches were never received (a seq gap).
	ReasonGap Reason = iota + 1
	// ReasonReconnect: the NATS connection dropped; anything may have been lost.
	ReasonReconnect
	// ReasonSlowConsumer: the NATS client dropped messages it could not keep up with.
	ReasonSlowConsumer
	// ReasonUnknownParent: a stored run named a parent the index never saw.
	ReasonUnknownParent
	// ReasonLateJoin: the first batch seen of the stream (or of a new
	// engine instance) is not its seq 0: what the engine stored before is
	// unknown, but nothing after it was missed, so everything applied from
	// here on is held. The stream is partial, not uncertain.
	ReasonLateJoin
	// ReasonLostTail: the publisher's heartbeat names a seq past the last
	// batch received: the last batches were lost, and no later seq would
	// have shown it.
	ReasonLostTail
	// ReasonDisagreement: the engine's own reports of cached prompt tokens
	// disagree with the index's predictions for it, sustainedly.
	ReasonDisagreement

	// NumReasons sizes arrays indexed by Reason (index 0 is unused).
	NumReasons
)

func (r Reason) String() string {
	switch r {
	case ReasonGap:
		return "gap"
	case ReasonReconnect:
		return "reconnect"
	case ReasonSlowConsumer:
		return "slow_consumer"
	case ReasonUnknownParent:
		return "unknown_parent"
	case ReasonLateJoin:
		return "late_join"
	case ReasonLostTail:
		return "lost_tail"
	case ReasonDisagreement:
		return "disagreement"
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Sink receives decoded batches. The consumer calls it from several workers,
// but every call for one Stream comes from the same worker, in sequence
// order, so a Sink needs no ordering of its own; it must still be safe for
// concurrent calls on different streams.
type Sink interface {
	// Apply applies one batch. b and its slices are reused after Apply returns:
	// a Sink must copy whatever it keeps.
	Apply(o Origin, b *Batch)
	// Uncertain reports that the stream's state may be missing batches. The
	// sink keeps what it has but must treat its answers for that endpoint as
	// approximate until it resynchronises (see the recovery design).
	Uncertain(s Stream, r Reason)
	// Restart reports that the engine behind the stream restarted (a new
	// instance, or seq going back): everything it held is gone. It is called
	// before the new engine's first batch is applied.
	Restart(s Stream)
}

// TailSink is a Sink that also hears the publisher's heartbeats: o names
// the last batch the publisher sent (Kv-Seq under Kv-Instance), so that a
// sink whose own position is behind it knows its tail was lost. A sink
// that has moved past the consumer (it installed a snapshot) judges from
// its own position; the consumer calls Tail only for heartbeats ahead of
// the last batch it delivered, in order with the stream's batches.
type TailSink interface {
	Sink
	Tail(o Origin)
}
