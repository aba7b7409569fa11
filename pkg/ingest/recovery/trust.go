package recovery

import (
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

var _ events.TailSink = (*Recovery)(nil)

// advance moves p to o's batch or heartbeat if it is newer: a new
// instance, or a later seq of the same one.
func (p *position) advance(o events.Origin) {
	if !p.valid || p.instance != o.Instance || o.Seq > p.seq {
		*p = position{instance: o.Instance, seq: o.Seq, valid: true}
	}
}

// Tail hears a publisher's heartbeat that is ahead of the consumer
// (events.TailSink): o is the last batch the publisher sent. If the stream
// is in step with it (a snapshot may have carried it past the consumer),
// nothing is wrong. If the stream has applied batches but not o, its tail
// was lost: it is resynchronised, as after a gap. If it has applied
// nothing yet, it is a late join: its history is unknown, so it reads
// partial, and its relay is asked once. While a snapshot is awaited the
// install compares its result with the heartbeat instead.
func (r *Recovery) Tail(o events.Origin) {
	st := r.tracked(o.Stream)
	if st == nil {
		if ts, ok := r.target.(events.TailSink); ok {
			ts.Tail(o)
		} else {
			r.target.Uncertain(o.Stream, events.ReasonLostTail)
		}
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if o.Pod != "" && o.Pod != st.pod {
		st.pod = o.Pod
	}
	st.live.advance(o)
	switch {
	case st.holding:
	case st.pos.valid && st.pos.instance == o.Instance && st.pos.seq >= o.Seq:
	case !st.pos.valid:
		r.lateJoinLocked(st)
	default:
		r.m.lostTails.Inc()
		r.uncertainLocked(st, events.ReasonLostTail)
	}
}

// lateJoinLocked handles a stream seen for the first time past its seq 0
// (by a batch or a heartbeat): the target marks it partial, and the relay
// is asked once for the history, unless it was asked already. A resync
// that failed before (the relay could not be reached when the endpoint
// joined) and waits out its backoff is tried at once instead, the first
// time the relay is heard from: it is reachable now, and until that
// attempt has run the stream counts as settling, so that a replica is not
// ready on an index its relays could already fill. Called with st.mu held.
func (r *Recovery) lateJoinLocked(st *stream) {
	r.target.Uncertain(st.id, events.ReasonLateJoin)
	r.mu.Lock()
	ask := !st.joinTried && !st.inFlight && !st.want
	retry := st.want && !st.inFlight && st.failures > 0 && !st.heardRetried
	if ask || retry {
		st.joined = true
	}
	if retry {
		st.heardRetried, st.notBefore = true, time.Time{}
	}
	r.mu.Unlock()
	if ask || retry {
		r.kick()
	}
}

// Distrust reports that the engine behind addr disagrees with the index
// (its cached-token reports, sustainedly): every stream of the endpoint is
// marked uncertain and resynchronised now, whatever its backoff. The
// resync's result then sets the state again: a relay whose snapshot is
// exact makes the stream exact, for the stream was not what disagreed.
func (r *Recovery) Distrust(addr string) {
	sts := r.streamsOf(addr, false)
	if len(sts) == 0 {
		sts = append(sts, r.get(events.Stream{Endpoint: addr}))
	}
	for _, st := range sts {
		r.target.Uncertain(st.id, events.ReasonDisagreement)
		r.target.SetStreamState(st.id, datalayer.StreamUncertain)
		r.m.distrusted.Inc()
		r.want(st, true)
	}
}

// streamsOf returns the streams of the endpoint at addr, every rank, and
// forgets them if remove is set.
func (r *Recovery) streamsOf(addr string, remove bool) []*stream {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*stream
	for s, st := range r.streams {
		if s.Endpoint == addr {
			out = append(out, st)
			if remove {
				delete(r.streams, s)
			}
		}
	}
	return out
}
