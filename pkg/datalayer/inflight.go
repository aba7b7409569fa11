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
	// NextDecodeEnd is when the first of the decoding requests is expected
	// to finish (its first token's time plus its max_tokens at its
	// predicted pace), the zero time when none is: when the endpoint's
	// batch is full, a new request waits for that seat.
	NextDecodeEnd time.Time
}

// Requests is every request in flight.
func (f InFlight) Requests() int { return f.Prefilling + f.Decoding }

// inflight is an endpoint's live counters.
type inflight struct {
	prefilling, prefillTokens, decoding, decodeTokens atomic.Int64
	// nextEnd is the earliest expected end among ends, in Unix
	// nanoseconds (0: none); mu guards ends, which holds the expected end
	// of every decoding request that said how long it would decode.
	nextEnd atomic.Int64
	mu      sync.Mutex
	ends    []int64
}

func (c *inflight) load() InFlight {
	if c == nil {
		return InFlight{}
	}
	f := InFlight{
		Prefilling: int(c.prefilling.Load()), PrefillTokens: int(c.prefillTokens.Load()),
		Decoding: int(c.decoding.Load()), DecodeTokens: int(c.decodeTokens.Load()),
	}
	if n := c.nextEnd.Load(); n != 0 {
		f.NextDecodeEnd = time.Unix(0, n)
	}
	return f
}

// addEnd and removeEnd keep ends and nextEnd; they run on the response
// path, once per request, never per pick.
func (c *inflight) addEnd(end int64) {
	c.mu.Lock()
	c.ends = append(c.ends, end)
	c.setNext()
	c.mu.Unlock()
}

func (c *inflight) removeEnd(end int64) {
	c.mu.Lock()
	if i := slices.Index(c.ends, end); i >= 0 {
		c.ends[i] = c.ends[len(c.ends)-1]
		c.ends = c.ends[:len(c.ends)-1]
	}
	c.setNext()
	c.mu.Unlock()
}

func (c *inflight) setNext() {
	var next int64
	for _, e := range c.ends {
		if next == 0 || e < next {
			next = e
		}
	}
	c.nextEnd.Store(next)
}

// Dispatch is one request's place in an endpoint's in-flight accounting.
// Its methods are idempotent and safe on a nil Dispatch, so the response
// path can call them however the response ends.
type Dispatch struct {
	c       *inflight
	prefill int64
	prompt  int64
	// decodeFor is how long the request is expected to decode (0:
	// unknown); end is when, once its first token came.
	decodeFor time.Duration
	end       int64
	// state: 0 prefilling, 1 decoding, 2 done.
	state atomic.Uint32
}

// Dispatch records that a request goes to the endpoint named name, with
// prefillTokens of its promptTokens still to compute there. It returns nil
// when no such endpoint is present.
func (ds *Datastore) Dispatch(name string, prefillTokens, promptTokens int) *Dispatch {
	e, ok := ds.snap.Load().byName[name]
	if !ok {
		return nil
	}
	d := &Dispatch{c: e.load, prefill: int64(max(prefillTokens, 0)), prompt: int64(max(promptTokens, 0))}
	d.c.prefilling.Add(1)
	d.c.prefillTokens.Add(d.prefill)
	return d
}

// ExpectDecode says how long the request is expected to decode once its
// first token comes (its max_tokens at its predicted pace), so that the
// endpoint's NextDecodeEnd can be known. Call it before FirstToken.
func (d *Dispatch) ExpectDecode(dur time.Duration) {
	if d != nil && dur > 0 {
		d.decodeFor = dur
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
	d.c.decoding.Add(1)
	d.c.decodeTokens.Add(d.prompt)
	if d.decodeFor > 0 {
		d.end = at.Add(d.decodeFor).UnixNano()
		d.c.addEnd(d.end)
	}
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
	case 1:
		d.c.decoding.Add(-1)
		d.c.decodeTokens.Add(-d.prompt)
		if d.end != 0 {
			d.c.removeEnd(d.end)
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
