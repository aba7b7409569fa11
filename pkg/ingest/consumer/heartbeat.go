package consumer

import (
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

// heartbeat handles a publisher's heartbeat (docs/nats.md): it names the
// last batch the publisher sent, after every batch before it on the same
// subject. If the stream's position is behind it, or the heartbeat names
// an engine instance the stream has not shown, batches were lost that no
// later seq would reveal (the stream may stay quiet for good): the sink is
// told, and the position moves to the heartbeat's so that the next batch
// follows on. A heartbeat at or behind the position says nothing new.
func (w *worker) heartbeat(st *seqState, o events.Origin, recv time.Time) {
	c := w.c
	c.m.heartbeats.Inc()
	if st != nil && st.instance == o.Instance && st.last >= o.Seq {
		st.seen = recv
		return
	}
	c.m.lostTails.Inc()
	if ts, ok := c.sink.(events.TailSink); ok {
		// The sink may have moved past our position (a snapshot); it
		// judges from its own.
		ts.Tail(o)
	} else {
		switch {
		case st == nil:
			// Nothing of the stream was ever received: its whole history
			// is unknown, nothing of it is wrong.
			w.uncertain(o.Stream, events.ReasonLateJoin)
		case st.instance != o.Instance:
			c.m.restarts.Inc()
			c.sink.Restart(o.Stream)
			w.uncertain(o.Stream, events.ReasonLateJoin)
		default:
			w.uncertain(o.Stream, events.ReasonLostTail)
		}
	}
	if st == nil {
		st = new(seqState)
		w.streams[o.Stream] = st
	}
	st.commit(o, recv)
}
