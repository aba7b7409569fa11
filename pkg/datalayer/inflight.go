package datalayer

import "sync/atomic"

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
}

// Requests is every request in flight.
func (f InFlight) Requests() int { return f.Prefilling + f.Decoding }

// inflight is an endpoint's live counters.
type inflight struct {
	prefilling, prefillTokens, decoding, decodeTokens atomic.Int64
}

func (c *inflight) load() InFlight {
	if c == nil {
		return InFlight{}
	}
	return InFlight{
		Prefilling: int(c.prefilling.Load()), PrefillTokens: int(c.prefillTokens.Load()),
		Decoding: int(c.decoding.Load()), DecodeTokens: int(c.decodeTokens.Load()),
	}
}

// Dispatch is one request's place in an endpoint's in-flight accounting.
// Its methods are idempotent and safe on a nil Dispatch, so the response
// path can call them however the response ends.
type Dispatch struct {
	c       *inflight
	prefill int64
	prompt  int64
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

// FirstToken moves the request from prefill to decode.
func (d *Dispatch) FirstToken() {
	if d == nil || !d.state.CompareAndSwap(0, 1) {
		return
	}
	d.c.prefilling.Add(-1)
	d.c.prefillTokens.Add(-d.prefill)
	d.c.decoding.Add(1)
	d.c.decodeTokens.Add(d.prompt)
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
	}
}

// InFlight returns the endpoint named name's in-flight work.
func (ds *Datastore) InFlight(name string) InFlight {
	if e, ok := ds.snap.Load().byName[name]; ok {
		return e.load.load()
	}
	return InFlight{}
}
