package datalayer

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/enginesched"
)

// InFlight is the work this EPP has sent an endpoint and not yet seen
// finish, by its own accounting: dispatched on the pick, moved from
// prefill to decode at the response's first byte, dropped at its end.
// Scraped metrics lag by a scrape interval; this does not, though it
// knows only the requests this EPP routed.
//
// Its times are Unix nanoseconds, zero where none is known: a snapshot is
// taken for every candidate of every request, and an int64 is a third of
// a time.Time to copy and needs no conversion to read.
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
	// was dispatched, zero when none is: a request still without its
	// first token long after it was sent says the endpoint's queue is
	// long before any response can say so.
	OldestPrefill int64
	// PrefillDoneBy is when the endpoint is expected to have computed the
	// prefills this EPP sent it, from each one's predicted time alone
	// there, taken in the order they were sent (zero when none is known):
	// the queue a new request's prefill waits behind, as a time, where
	// PrefillTokens is it as a count. It drains as time passes and is set
	// again from what remains at every first token.
	PrefillDoneBy int64
	// Ahead is the engine work a request sent now waits behind before its
	// prefill starts: the endpoint's scheduler replayed over these
	// requests (enginesched.Replayer) as they were at the last change to
	// them, replayed at the first read after it. A read while another
	// runs that replay gets the one before it, rather than wait. The zero
	// Ahead when nothing was replayed.
	Ahead enginesched.Ahead
	// StepEnd is when the engine's step under way is expected to end: the
	// last token the endpoint streamed, plus the time between that
	// request's last two tokens (zero when nothing decodes). A request
	// arriving mid-step waits for its end before its own step starts: for
	// a request with little to compute, that is much of its TTFT.
	StepEnd int64
	// StepStart is when the step under way began: the endpoint's last
	// token, which ended the step before it (zero before any token). A
	// request arriving later waits the rest of it.
	StepStart int64
	// ReplayedAt is the time of the last change Ahead was replayed at
	// (zero with the zero Ahead): the prefills ahead have run since.
	ReplayedAt int64
	// RecentPrefill is the uncached prompt tokens this EPP has sent the
	// endpoint lately, each weighed down by exp(-age/RecentPrefillWindow)
	// as of RecentPrefillAt: the prefill work that arrives while a request
	// decodes shares its steps, and the recent rate is the best guess of
	// what will (RecentPrefillRate).
	RecentPrefill   float64
	RecentPrefillAt int64
	// RecentEnds counts the requests this EPP has lately seen finish on
	// the endpoint, each weighed down by exp(-age/RecentEndsWindow) as of
	// RecentEndsAt: in conversations and agent loops a finished turn's
	// next comes back to the same cache within moments, and its prefill
	// shares the steps of whatever decodes there then (RecentEndsNow).
	RecentEnds   float64
	RecentEndsAt int64
	// Ended are when the last EndedKept requests this EPP saw finish on
	// the endpoint ended, in Unix nanoseconds, in no particular order,
	// zero past the last one known: in conversations and agent loops a
	// finished turn's next comes back after its pause (a tool call, the
	// client's next message), so how long ago each ended tells what is
	// about to arrive, which RecentEnds' one fading count blurs.
	Ended [EndedKept]int64
}

// EndedKept is how many of an endpoint's latest ends InFlight holds.
const EndedKept = 8

// RecentPrefillWindow is the time constant RecentPrefill fades with.
const RecentPrefillWindow = time.Second

// RecentPrefillRate is the endpoint's recent prefill work, in uncached
// prompt tokens a second, as of at (Unix nanoseconds).
func (f *InFlight) RecentPrefillRate(at int64) float64 {
	if f.RecentPrefill == 0 || f.RecentPrefillAt == 0 {
		return 0
	}
	return f.RecentPrefill * fade(at-f.RecentPrefillAt, RecentPrefillWindow) / RecentPrefillWindow.Seconds()
}

// fade is what a term of a fading sum weighs age nanoseconds after it
// was added (no more than when added, should the clocks of two
// goroutines disagree). It runs for every candidate of every request, so
// the ratio is taken of the nanoseconds themselves.
func fade(age int64, window time.Duration) float64 {
	return math.Exp(-float64(max(age, 0)) / float64(window))
}

// RecentEndsWindow is the time constant RecentEnds fades with: about the
// pause between an agent's turns (a tool call, a client's next message).
const RecentEndsWindow = 300 * time.Millisecond

// RecentEndsNow is RecentEnds as of at (Unix nanoseconds).
func (f *InFlight) RecentEndsNow(at int64) float64 {
	if f.RecentEnds == 0 || f.RecentEndsAt == 0 {
		return 0
	}
	return f.RecentEnds * fade(at-f.RecentEndsAt, RecentEndsWindow)
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
	// oldest is the earliest dispatch time of the requests in sent still
	// prefilling, in Unix nanoseconds (0: none).
	oldest atomic.Int64
	mu     sync.Mutex
	ends   []int64
	// doneBy is PrefillDoneBy in Unix nanoseconds (0: none); queue holds,
	// in the order sent, the prefilling requests whose time alone is
	// known, and prefills every prefilling one (for oldest). All are
	// written under mu; both lists hold the times they are read for, so
	// that walking them under mu touches no Dispatch: on a busy endpoint
	// they are long, and every dispatch, first token and end walks one.
	doneBy   atomic.Int64
	queue    []pending
	prefills []pending
	// sent holds every request in flight, in the order sent, for the
	// replay (under mu). changes counts the changes that call for a
	// replay (written under mu), and planned is the count the replay in
	// ahead was taken at: they differ while ahead is out of date. The
	// replay runs under planMu, never mu, so that no dispatch, first
	// token or end waits for one; replayer and seqs are its scratch.
	// limits are the engines' limits as configured, shared by the
	// datastore's endpoints; seats is the most requests the endpoint has
	// been seen running, its seats where none is configured.
	sent             []*Dispatch
	changes, planned atomic.Int64
	planMu           sync.Mutex
	replayer         enginesched.Replayer
	seqs             []enginesched.Seq
	ahead            publishedAhead
	limits           *atomic.Pointer[enginesched.Limits]
	seats            atomic.Int64
	// stepEnd is StepEnd in Unix nanoseconds (0: unknown), lastToken
	// StepStart.
	stepEnd, lastToken atomic.Int64
	// lastAt is the latest time a change was told at, replanned the
	// lastAt of the last replan (both under mu).
	lastAt, replanned int64
	// recent is RecentPrefill's bits as of recentAt (Unix nanoseconds),
	// ended RecentEnds' as of endedAt; all written under mu.
	recent, recentAt atomic.Int64
	ended, endedAt   atomic.Int64
	// lastEnds is Ended, as a ring whose next slot is endsNext (under
	// mu).
	lastEnds [EndedKept]atomic.Int64
	endsNext int
	// ranks counts per data-parallel rank (ranks.go).
	ranks rankLoads
}

// publishedAhead is a replay's counts and when it ran, each in an atomic,
// so that publishing allocates nothing on the request path. A reader
// meanwhile may see some of one replay's counts and some of the next's:
// an estimate either way, of work that was ahead at one of the two.
type publishedAhead struct {
	steps, decodeSteps, seqSteps, decodeContext, prefillTokens, prefillContext atomic.Int64
	decoding, decodingContext, budget, firstChunk, flags, at                   atomic.Int64
}

func (p *publishedAhead) store(a enginesched.Ahead, at int64) {
	p.steps.Store(int64(a.Steps))
	p.decodeSteps.Store(int64(a.DecodeSteps))
	p.seqSteps.Store(int64(a.SeqSteps))
	p.decodeContext.Store(a.DecodeContext)
	p.prefillTokens.Store(int64(a.PrefillTokens))
	p.prefillContext.Store(a.PrefillContext)
	p.decoding.Store(int64(a.Decoding))
	p.decodingContext.Store(a.DecodingContext)
	p.budget.Store(int64(a.Budget))
	p.firstChunk.Store(int64(a.FirstChunk))
	var flags int64
	if a.Unseated {
		flags |= 1
	}
	if a.UnderWay {
		flags |= 2
	}
	p.flags.Store(flags)
	p.at.Store(at)
}

// load is the counts last published, and when; the zero Ahead and 0 when
// none were (nothing in flight).
func (p *publishedAhead) load() (enginesched.Ahead, int64) {
	at := p.at.Load()
	if at == 0 {
		return enginesched.Ahead{}, 0
	}
	flags := p.flags.Load()
	return enginesched.Ahead{
		Steps: int(p.steps.Load()), DecodeSteps: int(p.decodeSteps.Load()), SeqSteps: int(p.seqSteps.Load()),
		DecodeContext: p.decodeContext.Load(), PrefillTokens: int(p.prefillTokens.Load()), PrefillContext: p.prefillContext.Load(),
		Decoding: int(p.decoding.Load()), DecodingContext: p.decodingContext.Load(),
		Budget: int(p.budget.Load()), FirstChunk: int(p.firstChunk.Load()),
		Unseated: flags&1 != 0, UnderWay: flags&2 != 0,
	}, at
}

// pending is a prefilling request, with when it was sent and how long
// its prefill alone is expected to take (0: unknown).
type pending struct {
	d          *Dispatch
	start, dur int64
}

// removePending takes d out of ps, keeping the order.
func removePending(ps []pending, d *Dispatch) []pending {
	for i := range ps {
		if ps[i].d == d {
			return slices.Delete(ps, i, i+1)
		}
	}
	return ps
}

// defaultOutputs is the output a request that did not say how long it
// may be is replayed with (a seat it holds frees after that many steps).
const defaultOutputs = 256

// sawRunning records that the endpoint was seen running n requests.
func (c *inflight) sawRunning(n int) { raiseTo(&c.seats, int64(n)) }

// sawToken records that the endpoint streamed a token at t: a step ended
// then, and the next began.
func (c *inflight) sawToken(t int64) { raiseTo(&c.lastToken, t) }

// raiseTo sets v to n if n is larger, atomically.
func raiseTo(v *atomic.Int64, n int64) {
	for {
		was := v.Load()
		if n <= was || v.CompareAndSwap(was, n) {
			return
		}
	}
}

// changed records a change to the requests in flight that calls for a
// replay; the caller holds mu. It costs nothing more: the first read
// after it replays (loadInto), once for however many changes came since
// the last, so that a dispatch, first token or end is O(1) in replays
// however busy the endpoint, and one replay is never waited for under mu.
func (c *inflight) changed() {
	c.changes.Add(1)
	c.replanned = c.lastAt
}

// replan replays the endpoint's scheduler over the requests in flight, as
// they are at the latest change, and publishes what a request sent now
// waits behind; the caller holds planMu. Only the requests the replay
// takes are read under mu (enginesched.MaxSeqs of them, and one to say
// more are there), so that what a dispatch waits for is bounded however
// many are in flight; the replay itself runs with mu let go.
func (c *inflight) replan() {
	c.seqs = c.seqs[:0]
	c.mu.Lock()
	changes, at := c.changes.Load(), c.lastAt
	stepStart := c.lastToken.Load()
	for _, d := range c.sent[:min(len(c.sent), enginesched.MaxSeqs+1)] {
		outputs := d.outputs
		if outputs == 0 {
			outputs = defaultOutputs
		}
		tokens := int(d.seen.Load())
		s := enginesched.Seq{Outputs: outputs - tokens}
		if tokens == 0 {
			s.Prefill, s.Context = int(d.prefill), int(d.prompt-d.prefill)
			s.Started = d.start < stepStart
		} else {
			s.Context = int(d.prompt) + tokens
		}
		c.seqs = append(c.seqs, s)
	}
	c.mu.Unlock()
	var lim enginesched.Limits
	if c.limits != nil {
		if l := c.limits.Load(); l != nil {
			lim = *l
		}
	}
	if lim.MaxNumSeqs <= 0 {
		lim.MaxNumSeqs = int(c.seats.Load())
	}
	if len(c.seqs) == 0 {
		c.ahead.store(enginesched.Ahead{}, 0) // an idle engine's
	} else {
		c.ahead.store(c.replayer.Replay(c.seqs, lim), max(at, 1))
	}
	c.planned.Store(changes)
}

// progressReplanEvery spaces the replans a request's progress asks for,
// in the time the changes are told at: every decoding request reports
// every fourth token, and an endpoint may run hundreds at once, whose
// replays would then cost more than the routing. A change to which
// requests are in flight or to their stage (sent, first token, end), or
// a request's last two tokens, calls for a replay at once; other
// progress, when the last call is at least this old.
const progressReplanEvery = 2 * time.Millisecond

// progressed records a request's progress told at at, and reports whether
// it is time to replan for it; the caller holds mu. replanned is the
// lastAt of the last change that called for a replay.
func (c *inflight) progressed(at int64) bool {
	c.lastAt = max(c.lastAt, at)
	return c.lastAt-c.replanned >= int64(progressReplanEvery)
}

// replanAt replans for a change told at at.
func (c *inflight) replanAt(at int64) {
	c.mu.Lock()
	c.progressed(at)
	c.changed()
	c.mu.Unlock()
}

// send adds d to the requests in flight, and drop takes it out (one that
// finished its decode at end counts in RecentEnds); both publish the
// oldest prefill and call for a replay.
func (c *inflight) send(d *Dispatch) {
	c.mu.Lock()
	c.lastAt = max(c.lastAt, d.start)
	tokens, at := float64(d.prefill), d.start
	if was := c.recentAt.Load(); was != 0 {
		tokens += math.Float64frombits(uint64(c.recent.Load())) * fade(d.start-was, RecentPrefillWindow)
		at = max(at, was)
	}
	c.recent.Store(int64(math.Float64bits(tokens)))
	c.recentAt.Store(at)
	c.sent = append(c.sent, d)
	c.prefills = append(c.prefills, pending{d: d, start: d.start})
	c.publishOldest()
	c.changed()
	c.mu.Unlock()
}

func (c *inflight) drop(d *Dispatch, finished bool, end int64) {
	c.mu.Lock()
	if i := slices.Index(c.sent, d); i >= 0 {
		c.sent = slices.Delete(c.sent, i, i+1)
	}
	c.prefills = removePending(c.prefills, d)
	if finished {
		at := end
		if at == 0 {
			at = max(c.lastAt, d.start)
		}
		c.lastEnds[c.endsNext].Store(at)
		c.endsNext = (c.endsNext + 1) % EndedKept
		n := 1.0
		if was := c.endedAt.Load(); was != 0 {
			n += math.Float64frombits(uint64(c.ended.Load())) * fade(at-was, RecentEndsWindow)
			at = max(at, was)
		}
		c.ended.Store(int64(math.Float64bits(n)))
		c.endedAt.Store(at)
	}
	c.publishOldest()
	c.changed()
	c.mu.Unlock()
}

func (c *inflight) load() InFlight {
	var f InFlight
	c.loadInto(&f)
	return f
}

// loadInto is load into f, which must be the zero InFlight: a candidate's
// own, so that the snapshot is not built aside and copied.
func (c *inflight) loadInto(f *InFlight) {
	if c == nil {
		return
	}
	f.Prefilling, f.PrefillTokens = int(c.prefilling.Load()), int(c.prefillTokens.Load())
	f.Decoding, f.DecodeTokens = int(c.decoding.Load()), int(c.decodeTokens.Load())
	for i := range f.DecodeEnds {
		if f.DecodeEnds[i] = c.firstEnds[i].Load(); f.DecodeEnds[i] == 0 {
			break
		}
	}
	f.OldestPrefill = c.oldest.Load()
	f.PrefillDoneBy = c.doneBy.Load()
	if c.changes.Load() != c.planned.Load() && c.planMu.TryLock() {
		// Changes since the last replay: one reader replays them, the
		// others take the last replay meanwhile.
		if c.changes.Load() != c.planned.Load() {
			c.replan()
		}
		c.planMu.Unlock()
	}
	if a, at := c.ahead.load(); at != 0 {
		f.Ahead, f.ReplayedAt = a, at
	}
	if at := c.recentAt.Load(); at != 0 {
		f.RecentPrefill, f.RecentPrefillAt = math.Float64frombits(uint64(c.recent.Load())), at
	}
	if at := c.endedAt.Load(); at != 0 {
		f.RecentEnds, f.RecentEndsAt = math.Float64frombits(uint64(c.ended.Load())), at
	}
	for i := range f.Ended {
		f.Ended[i] = c.lastEnds[i].Load()
	}
	if f.Decoding > 0 {
		f.StepEnd = c.stepEnd.Load()
	}
	if f.Requests() > 0 {
		f.StepStart = c.lastToken.Load()
	}
}

// enqueue adds d, whose prefill alone takes d.prefillFor, behind the
// prefills already expected.
func (c *inflight) enqueue(d *Dispatch) {
	c.mu.Lock()
	c.queue = append(c.queue, pending{d: d, start: d.start, dur: int64(d.prefillFor)})
	c.doneBy.Store(max(c.doneBy.Load(), d.start) + int64(d.prefillFor))
	c.mu.Unlock()
}

// dequeue takes d out of the prefill queue. At its first token, at, what
// was sent before it is taken as done, and what remains is expected from
// at on, in the order it was sent; a request that ended without one (at
// 0) only takes its own time off.
func (c *inflight) dequeue(d *Dispatch, at int64) {
	c.mu.Lock()
	c.queue = removePending(c.queue, d)
	var by int64
	switch {
	case len(c.queue) == 0:
	case at == 0:
		by = c.doneBy.Load() - int64(d.prefillFor)
	default:
		by = at
		for _, q := range c.queue {
			by = max(by, q.start) + q.dur
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
//
// at is when the change was told (0: no replay called for); a first
// token calls for one always, progress when it is time
// (progressReplanEvery).
func (c *inflight) setEnd(d *Dispatch, t int64, decoding bool, at int64, first bool) {
	c.mu.Lock()
	if decoding && d.state.Load() != 1 {
		c.mu.Unlock()
		return
	}
	if at != 0 && (c.progressed(at) || first) {
		c.changed()
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
	c.mu.Unlock()
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

// publishOldest publishes in oldest the earliest dispatch time of the
// requests still prefilling (prefills); the caller holds mu. It runs a
// few times per request (sent, first token, end), never per candidate.
func (c *inflight) publishOldest() {
	var first int64
	for _, p := range c.prefills {
		if first == 0 || p.start < first {
			first = p.start
		}
	}
	c.oldest.Store(first)
}

// prefillEnded takes d out of the prefilling requests once its first
// token has come, and publishes oldest again.
func (c *inflight) prefillEnded(d *Dispatch) {
	c.mu.Lock()
	c.prefills = removePending(c.prefills, d)
	c.publishOldest()
	c.mu.Unlock()
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
	// seen is how many tokens had come when Progress was last told (the
	// replay reads it), at seenAt (Unix nanoseconds, owned by the
	// response path's goroutine).
	seen   atomic.Int64
	seenAt int64
	// start is when it was dispatched, in Unix nanoseconds; prefillFor
	// how long its prefill alone is expected to take (0: unknown).
	start      int64
	prefillFor time.Duration
	// state: 0 prefilling, 1 decoding, 2 done.
	state atomic.Uint32
	// notes is the datastore's listener when the dispatch was made, name
	// its endpoint's, and id its id there once announced (0: not).
	notes *dispatchNotes
	name  string
	id    uint64
	// rank is the counters of the data-parallel rank it was sent to (nil:
	// none named, OnRank).
	rank *rankCounters
}

// Dispatch records that a request goes, at at, to the endpoint named
// name, with prefillTokens of its promptTokens still to compute there and
// at most outputs tokens to generate (its max_tokens; 0: unknown). It
// returns nil when no such endpoint is present.
func (ds *Datastore) Dispatch(name string, at time.Time, prefillTokens, promptTokens, outputs int) *Dispatch {
	d := new(Dispatch)
	if !ds.DispatchInto(d, name, at, prefillTokens, promptTokens, outputs) {
		return nil
	}
	return d
}

// DispatchInto is Dispatch made in d, which must be new (its zero value),
// so that a caller can keep it in memory of its own; it reports false,
// leaving d unused, when no such endpoint is present.
func (ds *Datastore) DispatchInto(d *Dispatch, name string, at time.Time, prefillTokens, promptTokens, outputs int) bool {
	e, ok := ds.snap.Load().byName[name]
	if !ok {
		return false
	}
	d.c, d.prefill, d.prompt, d.start = e.load, int64(max(prefillTokens, 0)), int64(max(promptTokens, 0)), at.UnixNano()
	if n := ds.notes.Load(); n != nil {
		d.notes, d.name = n, name
	}
	// Bounded so that no product with a pace overflows: a longer output
	// says nothing more.
	d.outputs = min(max(outputs, 0), maxOutputs)
	d.c.prefilling.Add(1)
	d.c.prefillTokens.Add(d.prefill)
	d.c.send(d)
	return true
}

// ExpectDecode says at what pace the request is expected to decode once
// its first token comes, perToken apart, so that the endpoint's
// DecodeEnds can be known from its first token on. Call it before
// FirstToken; it means nothing for a request dispatched without outputs.
func (d *Dispatch) ExpectDecode(perToken time.Duration) {
	if d != nil && d.outputs > 0 && perToken > 0 && d.state.Load() == 0 {
		// A pace slower than a minute a token says nothing more.
		d.perToken = min(perToken, time.Minute)
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
	d.rankFirstToken()
	d.c.prefillEnded(d)
	if d.prefillFor > 0 {
		d.c.dequeue(d, at.UnixNano())
	}
	d.c.sawRunning(int(d.c.decoding.Add(1)))
	d.c.decodeTokens.Add(d.prompt)
	d.first, d.nextPace = at.UnixNano(), paceFrom
	d.seen.Store(1)
	d.seenAt = d.first
	d.c.sawToken(d.first)
	var end int64
	if d.perToken > 0 {
		end = d.first + int64(d.outputs-1)*int64(d.perToken)
	}
	d.c.setEnd(d, end, true, d.first, true)
	d.tell(NoteFirst, d.first, end)
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
	if d == nil || d.state.Load() != 1 {
		return
	}
	now := at.UnixNano()
	if seen := int(d.seen.Load()); tokens > seen && now >= d.seenAt {
		// Tokens come at the ends of the engine's steps: the next is
		// expected as far after this one as the last came before it.
		step := (now - d.seenAt) / int64(tokens-seen)
		d.c.stepEnd.Store(now + step)
		d.c.sawToken(now)
		d.seen.Store(int64(tokens))
		d.seenAt = now
	}
	switch {
	case d.outputs == 0:
	case tokens >= d.nextPace:
		d.nextPace = tokens + paceEvery
		pace := max((now-d.first)/int64(tokens-1), 0)
		d.c.setEnd(d, now+int64(max(d.outputs-tokens, 0))*pace, true, now, false)
	case tokens >= d.outputs-1:
		// Between every fourth token the replay reads the count when it
		// next runs; a request about to end is replayed at each of its
		// last two tokens, always, as its seat is about to free.
		d.c.replanAt(now)
	}
}

// Done removes the request, from whichever stage it had reached.
func (d *Dispatch) Done() { d.DoneAt(time.Time{}) }

// Fail removes a request whose response failed (an error, an answer
// outlier detection found implausible): unlike DoneAt it does not count
// as a request that ended, since a failure says nothing of when the
// endpoint's real work ends.
func (d *Dispatch) Fail() { d.finish(time.Time{}, false) }

// DoneAt is Done for a response that ended at at: one that had begun
// decoding counts in the endpoint's RecentEnds from then (the zero at:
// from the last change told).
func (d *Dispatch) DoneAt(at time.Time) { d.finish(at, true) }

// finish is DoneAt; an end counts (RecentEnds) only when ended says so.
func (d *Dispatch) finish(at time.Time, ended bool) {
	if d == nil {
		return
	}
	state := d.state.Swap(2)
	d.rankFinish(state)
	switch state {
	case 0:
		d.c.prefilling.Add(-1)
		d.c.prefillTokens.Add(-d.prefill)
		if d.prefillFor > 0 {
			d.c.dequeue(d, 0)
		}
	case 1:
		d.c.decoding.Add(-1)
		d.c.decodeTokens.Add(-d.prompt)
		d.c.setEnd(d, 0, false, 0, false)
	default:
		return
	}
	var end int64
	if !at.IsZero() {
		end = at.UnixNano()
	}
	d.c.drop(d, ended && state == 1, end)
	if ended {
		d.tell(NoteDone, end, 0)
	} else {
		d.tell(NoteFailed, end, 0)
	}
}

// InFlight returns the endpoint named name's in-flight work.
func (ds *Datastore) InFlight(name string) InFlight {
	if e, ok := ds.snap.Load().byName[name]; ok {
		return e.load.load()
	}
	return InFlight{}
}
