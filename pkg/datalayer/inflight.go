package datalayer

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// InFlight is the work this EPP has sent an endpoint and not yet seen
// finish, by its own accounting: dispatched on the pick, moved from
// prefill to decode at the response's first byte, dropped at its end.
// Scraped metrics lag by a scrape interval; this does not, though it
// knows only the requests this EPP routed.
type InFlight struct {
	// Prefilling counts requests whose first token has not come back;
	// PrefillTokens sums their uncached prompt tokens (what the endpoint
	// has still to compute for them).
	Prefilling, PrefillTokens int
	// Decoding counts requests past their first token and not finished;
	// DecodeTokens sums their prompts' lengths (the context every decode
	// step reads for them).
	Decoding, DecodeTokens int
	// DecodeEnds are when the first DecodeEndsKept of the decoding
	// requests are expected to finish (each its first token's time plus
	// its max_tokens at its predicted pace), in Unix nanoseconds,
	// earliest first, zero past the last one known: when the endpoint's
	// batch is full, a new request waits for a seat, and with k requests
	// before it in that wait, for the k-th of these.
	DecodeEnds [DecodeEndsKept]int64
	// OldestPrefill is when the longest-waiting of the prefilling requests
	// was dispatched, the zero time when none is: a request still without
	// its first token long after it was sent says the endpoint's queue is
	// long before any response can say so.
	OldestPrefill time.Time
	// PrefillDoneBy is when the endpoint is expected to have computed the
	// prefills this EPP sent it, from each one's predicted time alone
	// there, taken in the order they were sent (the zero time when none is
	// known): the queue a new request's prefill waits behind, as a time,
	// where PrefillTokens is it as a count. It drains as time passes and
	// is set again from what remains at every first token.
	PrefillDoneBy time.Time
}

// DecodeEndsKept is how many of an endpoint's expected decode ends
// InFlight carries: enough for the seats a full batch frees in the time a
// request waits there, few enough to copy per candidate.
const DecodeEndsKept = 8

// Requests is every request in flight.
func (f InFlight) Requests() int { return f.Prefilling + f.Decoding }

// inflight is an endpoint's live counters.
type inflight struct {
	prefilling, prefillTokens, decoding, decodeTokens atomic.Int64
	// firstEnds are the earliest expected ends of ends, in Unix
	// nanoseconds, earliest first (0: none); mu guards ends, which holds
	// the expected end of every decoding request that said how long it
	// would decode, in ascending order.
	firstEnds [DecodeEndsKept]atomic.Int64
	// oldest is the earliest of starts, the dispatch times of the
	// requests prefilling, in Unix nanoseconds (0: none).
	oldest atomic.Int64
	mu     sync.Mutex
	ends   []int64
	starts []int64
	// doneBy is PrefillDoneBy in Unix nanoseconds (0: none); queue holds,
	// in the order sent, the prefilling requests whose time alone is
	// known. Both are written under mu.
	doneBy atomic.Int64
	queue  []*Dispatch
}

func (c *inflight) load() InFlight {
	if c == nil {
		return InFlight{}
	}
	f := InFlight{
		Prefilling: int(c.prefilling.Load()), PrefillTokens: int(c.prefillTokens.Load()),
		Decoding: int(c.decoding.Load()), DecodeTokens: int(c.decodeTokens.Load()),
	}
	for i := range f.DecodeEnds {
		if f.DecodeEnds[i] = c.firstEnds[i].Load(); f.DecodeEnds[i] == 0 {
			break
		}
	}
	if n := c.oldest.Load(); n != 0 {
		f.OldestPrefill = time.Unix(0, n)
	}
	if n := c.doneBy.Load(); n != 0 {
		f.PrefillDoneBy = time.Unix(0, n)
	}
	return f
}

// enqueue adds d, whose prefill alone takes d.prefillFor, behind the
// prefills already expected.
func (c *inflight) enqueue(d *Dispatch) {
	c.mu.Lock()
	c.queue = append(c.queue, d)
	c.doneBy.Store(max(c.doneBy.Load(), d.start) + int64(d.prefillFor))
	c.mu.Unlock()
}

// dequeue takes d out of the prefill queue. At its first token, at, what
// was sent before it is taken as done, and what remains is expected from
// at on, in the order it was sent; a request that ended without one (at
// 0) only takes its own time off.
func (c *inflight) dequeue(d *Dispatch, at int64) {
	c.mu.Lock()
	if i := slices.Index(c.queue, d); i >= 0 {
		c.queue = slices.Delete(c.queue, i, i+1)
	}
	var by int64
	switch {
	case len(c.queue) == 0:
	case at == 0:
		by = c.doneBy.Load() - int64(d.prefillFor)
	default:
		by = at
		for _, q := range c.queue {
			by = max(by, q.start) + int64(q.prefillFor)
		}
	}
	c.doneBy.Store(by)
	c.mu.Unlock()
}

// setEnd moves d's expected end to t (0: none) in ends, kept in order,
// and publishes ends' first ones; with decoding, only while d decodes (a
// request that ended meanwhile has had its end taken out, and must not
// have it put back). It runs on the response path (at the first token,
// every few tokens after it, at the end), never per candidate; d.end is
// written only here, under mu.
func (c *inflight) setEnd(d *Dispatch, t int64, decoding bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if decoding && d.state.Load() != 1 {
		return
	}
	from := len(c.ends)
	if d.end != 0 {
		if i, ok := slices.BinarySearch(c.ends, d.end); ok {
			c.ends = slices.Delete(c.ends, i, i+1)
			from = i
		}
	}
	if t != 0 {
		i, _ := slices.BinarySearch(c.ends, t)
		c.ends = slices.Insert(c.ends, i, t)
		from = min(from, i)
	}
	d.end = t
	c.publishEnds(from)
}

// publishEnds publishes ends' first ones from position i on, where they
// changed; the caller holds mu. A reader meanwhile may see some of the old
// and some of the new: an estimate either way, never a time not expected.
func (c *inflight) publishEnds(i int) {
	for ; i < DecodeEndsKept; i++ {
		var t int64
		if i < len(c.ends) {
			t = c.ends[i]
		}
		c.firstEnds[i].Store(t)
	}
}

// addStart and removeStart keep starts and publish its earliest in
// oldest; they run once per request (on the pick and the response path),
// never per candidate.
func (c *inflight) addStart(t int64) {
	c.mu.Lock()
	c.starts = append(c.starts, t)
	c.oldest.Store(earliest(c.starts))
	c.mu.Unlock()
}

func (c *inflight) removeStart(t int64) {
	c.mu.Lock()
	if i := slices.Index(c.starts, t); i >= 0 {
		c.starts[i] = c.starts[len(c.starts)-1]
		c.starts = c.starts[:len(c.starts)-1]
	}
	c.oldest.Store(earliest(c.starts))
	c.mu.Unlock()
}

func earliest(ts []int64) int64 {
	var first int64
	for _, t := range ts {
		if first == 0 || t < first {
			first = t
		}
	}
	return first
}

// Dispatch is one request's place in an endpoint's in-flight accounting.
// Its methods are idempotent and safe on a nil Dispatch, so the response
// path can call them however the response ends.
type Dispatch struct {
	c       *inflight
	prefill int64
	prompt  int64
	// outputs is the output tokens the request may generate (its
	// max_tokens) and perToken their predicted pace after the first (0:
	// unknown); first is when its first token came, end when it is
	// expected to finish (under c.mu), and nextPace how many tokens must
	// have come before Progress sets end again.
	outputs  int
	perToken time.Duration
	first    int64
	end      int64
	nextPace int
	// start is when it was dispatched, in Unix nanoseconds; prefillFor
	// how long its prefill alone is expected to take (0: unknown).
	start      int64
	prefillFor time.Duration
	// state: 0 prefilling, 1 decoding, 2 done.
	state atomic.Uint32
}

// Dispatch records that a request goes, at at, to the endpoint named
// name, with prefillTokens of its promptTokens still to compute there. It
// returns nil when no such endpoint is present.
func (ds *Datastore) Dispatch(name string, at time.Time, prefillTokens, promptTokens int) *Dispatch {
	d := new(Dispatch)
	if !ds.DispatchInto(d, name, at, prefillTokens, promptTokens) {
		return nil
	}
	return d
}

// DispatchInto is Dispatch made in d, which must be new (its zero value),
// so that a caller can keep it in memory of its own; it reports false,
// leaving d unused, when no such endpoint is present.
func (ds *Datastore) DispatchInto(d *Dispatch, name string, at time.Time, prefillTokens, promptTokens int) bool {
	e, ok := ds.snap.Load().byName[name]
	if !ok {
		return false
	}
	d.c, d.prefill, d.prompt, d.start = e.load, int64(max(prefillTokens, 0)), int64(max(promptTokens, 0)), at.UnixNano()
	d.c.prefilling.Add(1)
	d.c.prefillTokens.Add(d.prefill)
	d.c.addStart(d.start)
	return true
}

// ExpectDecode says how the request is expected to decode once its first
// token comes: up to outputs tokens (its max_tokens), perToken apart, so
// that the endpoint's DecodeEnds can be known. Call it before FirstToken.
func (d *Dispatch) ExpectDecode(outputs int, perToken time.Duration) {
	if d != nil && outputs > 0 && perToken > 0 && d.state.Load() == 0 {
		// Bounded so that no product of the two overflows: a pace slower
		// than a minute a token, or a longer output, says nothing more.
		d.outputs, d.perToken = min(outputs, maxOutputs), min(perToken, time.Minute)
	}
}

// ExpectPrefill says how long the request's prefill alone is expected to
// take on its endpoint, so that the endpoint's PrefillDoneBy can be known.
// Call it once, right after Dispatch.
func (d *Dispatch) ExpectPrefill(dur time.Duration) {
	if d != nil && dur > 0 && d.prefillFor == 0 && d.state.Load() == 0 {
		d.prefillFor = dur
		d.c.enqueue(d)
	}
}

// FirstToken moves the request from prefill to decode; at is when its
// first token came.
func (d *Dispatch) FirstToken(at time.Time) {
	if d == nil || !d.state.CompareAndSwap(0, 1) {
		return
	}
	d.c.prefilling.Add(-1)
	d.c.prefillTokens.Add(-d.prefill)
	d.c.removeStart(d.start)
	if d.prefillFor > 0 {
		d.c.dequeue(d, at.UnixNano())
	}
	d.c.decoding.Add(1)
	d.c.decodeTokens.Add(d.prompt)
	if d.outputs > 0 {
		d.first, d.nextPace = at.UnixNano(), paceFrom
		d.c.setEnd(d, d.first+int64(d.outputs-1)*int64(d.perToken), true)
	}
}

// Past paceFrom tokens, and every paceEvery tokens after, Progress sets a
// decoding request's expected end again from the pace its tokens came at:
// the pace predicted at the pick does not know the prefills that will
// share the request's steps, and a full batch's seats free as its
// requests' real paces say.
const (
	paceFrom  = 4
	paceEvery = 4
	// maxOutputs bounds the output a request is expected to generate.
	maxOutputs = 1 << 24
)

// Progress says that tokens of the request's output tokens (its first
// included) have come back by at. The request's expected end is set again
// from the pace they came at: the rest of its max_tokens at the same pace
// (a request that ends early, at a stop, only frees its seat sooner). Call
// it from the goroutine that calls FirstToken and Done.
func (d *Dispatch) Progress(at time.Time, tokens int) {
	if d == nil || d.outputs == 0 || tokens < d.nextPace || d.state.Load() != 1 {
		return
	}
	d.nextPace = tokens + paceEvery
	now := at.UnixNano()
	pace := max((now-d.first)/int64(tokens-1), 0)
	d.c.setEnd(d, now+int64(max(d.outputs-tokens, 0))*pace, true)
}

// Done removes the request, from whichever stage it had reached.
func (d *Dispatch) Done() {
	if d == nil {
		return
	}
	switch d.state.Swap(2) {
	case 0:
		d.c.prefilling.Add(-1)
		d.c.prefillTokens.Add(-d.prefill)
		d.c.removeStart(d.start)
		if d.prefillFor > 0 {
			d.c.dequeue(d, 0)
		}
	case 1:
		d.c.decoding.Add(-1)
		d.c.decodeTokens.Add(-d.prompt)
		if d.outputs > 0 {
			d.c.setEnd(d, 0, false)
		}
	}
}

// InFlight returns the endpoint named name's in-flight work.
func (ds *Datastore) InFlight(name string) InFlight {
	if e, ok := ds.snap.Load().byName[name]; ok {
		return e.load.load()
	}
	return InFlight{}
}
