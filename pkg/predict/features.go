package predict

import (
	"math"
	"math/bits"

	"github.com/kvroute/kvroute/pkg/enginesched"
)

// Input is what the EPP knows, when it picks, about one request on one
// endpoint. Token counts are in tokens.
type Input struct {
	// InputTokens is the prompt's length.
	InputTokens int `json:"inputTokens"`
	// GPUTokens, CPUTokens and StorageTokens are the prompt's leading
	// tokens the endpoint holds in each tier (a token in several counts in
	// the fastest); SpeculativeTokens those held only speculatively (an
	// earlier pick is computing them).
	GPUTokens         int `json:"gpuTokens"`
	CPUTokens         int `json:"cpuTokens"`
	StorageTokens     int `json:"storageTokens"`
	SpeculativeTokens int `json:"speculativeTokens"`
	// Waiting, Running and KVUsage are the endpoint's scraped load;
	// MetricsStale says they are older than the staleness bound (and so
	// left out).
	Waiting      int     `json:"waiting"`
	Running      int     `json:"running"`
	KVUsage      float64 `json:"kvUsage"`
	MetricsStale bool    `json:"metricsStale,omitempty"`
	// Prefilling and PrefillTokens are the requests this EPP dispatched to
	// the endpoint whose first token has not come back, and their uncached
	// prompt tokens; Decoding and DecodeTokens those past their first token
	// and not finished, and their prompts' lengths.
	Prefilling    int `json:"prefilling"`
	PrefillTokens int `json:"prefillTokens"`
	Decoding      int `json:"decoding"`
	DecodeTokens  int `json:"decodeTokens"`
	// MaxTokens is the output the request asks for at most (0: unknown).
	MaxTokens int `json:"maxTokens,omitempty"`
	// DecodeEndsMs are how long until the first DecodeEnds of the
	// requests this EPP has decoding on the endpoint are expected to
	// finish, in milliseconds, earliest first (0 for one already overdue):
	// when the batch is full, the k-th of them is the wait for a seat of a
	// request with k-1 others before it.
	DecodeEndsMs [DecodeEndsKept]float64 `json:"decodeEndsMs"`
	DecodeEnds   int                     `json:"decodeEnds,omitempty"`
	// OldestPrefillMs is how long the longest-waiting of the requests this
	// EPP sent the endpoint has been without its first token, in
	// milliseconds (0: none is waiting): a lower bound on the queue's wait
	// that responses have not yet told.
	OldestPrefillMs float64 `json:"oldestPrefillMs,omitempty"`
	// PrefillAheadMs is how long the prefills this EPP sent the endpoint
	// ahead of this request are expected to take still, each at its own
	// predicted time alone, in the order sent (0: none, or not known):
	// the queue's wait where PrefillTokens counts its work, with the time
	// it has already had taken off.
	PrefillAheadMs float64 `json:"prefillAheadMs,omitempty"`
	// Ahead is the engine work the request waits behind before its
	// prefill starts, from the engine's scheduler replayed over the
	// requests this EPP has in flight there (a zero Ahead: none known).
	Ahead enginesched.Ahead `json:"ahead"`
	// StepRestMs is how long the engine's step under way has still to
	// run, in milliseconds, from the pace its tokens stream at (0: none
	// is known to be under way).
	StepRestMs float64 `json:"stepRestMs,omitempty"`
	// StepElapsedMs is how long the step under way has run, in
	// milliseconds, since the endpoint's last token (0: none known): of
	// the replay's first step, when it is the one under way, this much is
	// done.
	StepElapsedMs float64 `json:"stepElapsedMs,omitempty"`
	// RecentPrefillRate is the prefill work this EPP has lately sent the
	// endpoint, in uncached prompt tokens a second: what will likely
	// share the request's decode steps.
	RecentPrefillRate float64 `json:"recentPrefillRate,omitempty"`
	// RecentEnds is how many requests this EPP has lately seen finish on
	// the endpoint, each faded by its age (datalayer.RecentEndsWindow):
	// their conversations' next turns, about to come back, will share the
	// request's decode steps.
	RecentEnds float64 `json:"recentEnds,omitempty"`
	// EndedAgoMs are how long ago the last EndedN requests this EPP saw
	// finish on the endpoint ended, in milliseconds, in no particular
	// order: a finished turn's next comes back after its loop's pause,
	// and shares the decode steps of whatever runs there then.
	EndedAgoMs [EndedKept]float64 `json:"endedAgoMs"`
	EndedN     int                `json:"endedN,omitempty"`
}

// EndedKept is how many of an endpoint's latest ends an Input holds.
const EndedKept = 8

// Uncached is the prompt tokens the endpoint has to compute.
func (in *Input) Uncached() int {
	return max(in.InputTokens-in.GPUTokens-in.CPUTokens-in.StorageTokens-in.SpeculativeTokens, 0)
}

// NumFeatures is the length of a feature vector.
const NumFeatures = 30

// Vector is a feature vector. Features are scaled to be of order one
// (thousands of tokens, counts of requests, shares), so that one ridge
// strength suits them all.
type Vector [NumFeatures]float64

// The regimes a model is piecewise over, by the endpoint's queue: idle
// (the request's own prefill is all it waits for), queued (prefills ahead
// of it, seats free), or full (it waits for a running request to finish
// before it even gets a seat). Each behaves unlike the others, so each has
// its own coefficients.
const (
	RegimeIdle = iota
	RegimeQueued
	RegimeFull
	NumRegimes
)

// Regime is the queue state in's endpoint is in, given the endpoint's batch
// limit as learned (seats; 0 when unknown).
func (in *Input) Regime(seats int) int {
	waiting, _, _, _ := in.scraped()
	switch {
	case seats > 0 && in.occupancy()+1 > float64(seats):
		return RegimeFull
	case waiting > 0 || in.Prefilling > 0:
		return RegimeQueued
	}
	return RegimeIdle
}

// occupancy is how many requests the endpoint holds, running or waiting:
// the scrape counts every router's but lags by a scrape interval, this
// EPP's own accounting counts only its own but is current, and each of
// its requests is one the scrape counts or will; so the larger of the two.
func (in *Input) occupancy() float64 {
	waiting, running, _, _ := in.scraped()
	return max(running+waiting, float64(in.Prefilling+in.Decoding))
}

// TTFTFeatures fills v with the features time to first token is
// predicted from: the request's own prefill (uncached tokens, the
// attention over its context, tokens loaded from each slower tier,
// speculative tokens that may or may not be computed by then) and what
// stands before it (the endpoint's queue and batch, the prefill work this
// EPP dispatched there and has not seen start decoding, the engine work
// the scheduler's replay counts ahead, and the step under way).
//
// seats is the endpoint's batch limit as learned (the most requests it has
// been seen running; 0 when unknown): requests beyond it wait for a running
// one to finish, which costs far more than a place in the prefill queue.
func (in *Input) TTFTFeatures(v *Vector, seats int) {
	un := float64(in.Uncached())
	waiting, running, kv, stale := in.scraped()
	full := 0.0
	if seats > 0 {
		full = max(0, in.occupancy()+1-float64(seats))
	}
	*v = Vector{
		1,
		un / 1e3,
		float64(in.GPUTokens) / 1e3,
		float64(in.CPUTokens) / 1e3,
		float64(in.StorageTokens) / 1e3,
		float64(in.SpeculativeTokens) / 1e3,
		un * float64(in.InputTokens) / 1e7,
		waiting,
		running,
		kv,
		float64(in.PrefillTokens) / 1e3,
		float64(in.Prefilling),
		float64(in.Decoding),
		float64(in.DecodeTokens) / 1e4,
		float64(in.Prefilling) * un / 1e3,
		stale,
		busy(in),
		busy(in) * un / 1e3,
		full,
		seatWaitMs(in, full) / 100,
		drain(in, waiting),
		clampFinite(in.OldestPrefillMs, 0, 1e6) / 100,
		clampFinite(in.PrefillAheadMs, 0, 1e6) / 100,
	}
	in.replayFeatures(v, un)
	v[28] = clampFinite(in.StepRestMs, 0, 1e6) / 100
	if in.Ahead.UnderWay {
		v[29] = clampFinite(in.StepElapsedMs, 0, 1e4) / 100
	}
}

// replayFeatures sets the features of the engine's work from the
// scheduler's replay: until the request's prefill is done, the steps that
// decode, the sequences and the context they decode, and the prompt tokens
// of the requests ahead with the context they attend to. The request's own
// steps past its first carry the decodes of its first. Each is a sum of
// one kind of work, whose cost per unit the model learns: what a step
// costs is the sum of its work's (TTFT is then the sum over the steps it
// waits through), and steps differ many-fold by what they carry.
func (in *Input) replayFeatures(v *Vector, un float64) {
	a := &in.Ahead
	if a.Steps <= 0 {
		return
	}
	own := float64(a.OwnSteps(int(min(un, 1e9))) - 1)
	decodeSteps := float64(a.DecodeSteps)
	if a.Decoding > 0 {
		decodeSteps += own
	}
	v[23] = clampFinite(decodeSteps, 0, 1e7) / 100
	v[24] = clampFinite(float64(a.SeqSteps)+own*float64(a.Decoding), 0, 1e9) / 1e3
	v[25] = clampFinite(float64(a.DecodeContext)+own*float64(a.DecodingContext), 0, 1e13) / 1e6
	v[26] = clampFinite(float64(a.PrefillTokens), 0, 1e9) / 1e3
	v[27] = clampFinite(float64(a.PrefillContext), 0, 1e15) / 1e7
}

// DecodeEndsKept is how many of an endpoint's expected decode ends an
// Input holds.
const DecodeEndsKept = 8

// seatWaitMs is how long a request waits for a seat in a full batch, from
// the decode ends the EPP expects: with full seats to free, the full-th
// end; past the ends known, the seats go on freeing as far apart as the
// known ones did. 0 when the batch is not full or no end is known.
func seatWaitMs(in *Input, full float64) float64 {
	n := min(max(in.DecodeEnds, 0), DecodeEndsKept)
	if full <= 0 || n == 0 {
		return 0
	}
	k := int(math.Ceil(min(full, 1e6)))
	last := clampFinite(in.DecodeEndsMs[n-1], 0, 1e6)
	if k <= n {
		return clampFinite(in.DecodeEndsMs[k-1], 0, 1e6)
	}
	return last + float64(k-n)*last/float64(n)
}

// drain estimates, in hundreds of decode steps, how long the requests
// ahead of this one keep it from a seat: each of the ahead+1 admissions
// waits for a running request to finish, and the running ones finish at
// about one per output length over their number. It matters when the
// engine queues (its batch or its KV cache is full); the model learns what
// a step costs there.
func drain(in *Input, waiting float64) float64 {
	ahead := max(waiting, float64(in.Prefilling))
	if ahead == 0 {
		return 0
	}
	out := float64(in.MaxTokens)
	if out <= 0 {
		out = 128
	}
	return (ahead + 1) * out / max(float64(in.Decoding), 1) / 100
}

// cachedAfterWait moves, in TTFT features v, the speculative tokens to
// the held ones where this EPP has prefills in flight on the endpoint: one
// of them is computing those tokens, so they are cached once the wait
// behind it, which the queue's features count, is over. Priced besides as
// tokens of their own, the request would be rated behind that prefill
// slower than a cold prefill elsewhere, and a prefix group split over two
// caches. Predict applies it; learning sees the features as they are.
func (in *Input) cachedAfterWait(v *Vector) {
	if in.SpeculativeTokens > 0 && in.Prefilling > 0 {
		v[2] += v[5]
		v[5] = 0
	}
}

// alone keeps, of TTFT features, only the request's own work: what it
// would cost with nothing queued or running beside it. Its speculative
// tokens count as cached: an earlier request is computing them, so they
// are that request's engine time, not this one's.
func alone(v *Vector) {
	v[2] += v[5]
	v[5] = 0
	for i := 7; i < NumFeatures; i++ {
		v[i] = 0
	}
}

// busy is 1 when the endpoint is decoding: a request arriving then waits
// for the step under way to end before its own begins, where on an idle
// engine it starts at once.
func busy(in *Input) float64 {
	if (!in.MetricsStale && in.Running > 0) || in.Decoding > 0 {
		return 1
	}
	return 0
}

// TPOTFeatures fills v with the features time per output token is
// predicted from: the batch the request will decode in (its size and the
// context it reads), the prefill work that will share its steps, and its
// own context. What shares its steps arrives mostly after it: the recent
// rate of prefill work sent there, and the requests that have just ended
// (counted by how long ago) or are expected to end soon (in conversations
// and agent loops their next turns come back to the same cache while this
// one decodes); the prefill queue ahead and the batch the replay sees tell
// how loaded the endpoint is when it starts.
func (in *Input) TPOTFeatures(v *Vector, seats int) {
	waiting, running, kv, stale := in.scraped()
	*v = Vector{
		1,
		running,
		waiting,
		kv,
		float64(in.Decoding),
		float64(in.DecodeTokens) / 1e4,
		float64(in.Prefilling),
		float64(in.PrefillTokens) / 1e3,
		float64(in.InputTokens) / 1e3,
		float64(in.MaxTokens) / 1e3,
		stale,
		clampFinite(in.RecentPrefillRate, 0, 1e9) / 1e4,
		endsWithin(in, soonMs),
		clampFinite(float64(in.Ahead.PrefillTokens), 0, 1e9) / 1e3,
		float64(in.Ahead.Decoding),
		clampFinite(in.PrefillAheadMs, 0, 1e6) / 100,
		clampFinite(in.RecentEnds, 0, 1e6),
	}
	endedByAge(in, v[tpotEndedFrom:tpotEndedFrom+endedBins])
}

// The ends TPOT counts, by age: under endedFirstMs, then in bins each
// twice as wide as the one before, endedBins in all (0–100, 100–200,
// 200–400, 400–800 and 800–1600 ms: ends older than endedLastMs are not
// counted), as features tpotEndedFrom on, after the 17 the literal above
// sets. What comes back when is the loops' pause, which the model learns
// from the counts' coefficients rather than assuming one.
const (
	tpotEndedFrom = 17
	endedFirstMs  = 100
	endedBins     = 5
	endedLastMs   = endedFirstMs << (endedBins - 1)
)

// endedByAge counts in's ends by age into bins (endedBins long).
func endedByAge(in *Input, bins []float64) {
	for _, d := range in.EndedAgoMs[:min(max(in.EndedN, 0), EndedKept)] {
		if !(d >= 0 && d < endedLastMs) { // NaN too
			continue
		}
		// The bin is how many times endedFirstMs must double to pass d.
		bins[bits.Len(uint(d/endedFirstMs))]++
	}
}

// soonMs is the horizon of the decode ends that TPOT counts: about the
// decode of a short response.
const soonMs = 300

// endsWithin is how many of the decode ends in expects fall within ms of
// the request's arrival.
func endsWithin(in *Input, ms float64) float64 {
	n := 0
	for _, d := range in.DecodeEndsMs[:min(max(in.DecodeEnds, 0), DecodeEndsKept)] {
		if d < ms {
			n++
		}
	}
	return float64(n)
}

func (in *Input) scraped() (waiting, running, kv, stale float64) {
	if in.MetricsStale {
		return 0, 0, 0, 1
	}
	return float64(in.Waiting), float64(in.Running), clampFinite(in.KVUsage, 0, 1), 0
}

func clampFinite(v, lo, hi float64) float64 {
	if math.IsNaN(v) {
		return lo
	}
	return min(max(v, lo), hi)
}

// ttftMonotone and tpotMonotone mark the features that can only make a
// request slower: more uncached tokens, more queued work, a fuller batch.
// Their coefficients are kept at zero or above, so that a model fitted on
// a quiet stretch does not extrapolate a longer queue into a shorter wait.
// TTFT's feature 29, the time the step under way has run, is left free:
// it takes time off.
var (
	ttftMonotone = mask(1, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28)
	tpotMonotone = mask(1, 2, 4, 5, 6, 7, 8, 11)
)

func mask(idx ...int) (m [NumFeatures]bool) {
	for _, i := range idx {
		m[i] = true
	}
	return m
}

func dot(a, b *Vector) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

// How many leading features TTFTFeatures, alone and TPOTFeatures may set;
// the rest they leave zero.
const (
	ttftFeatures  = 30
	aloneFeatures = 7
	tpotFeatures  = tpotEndedFrom + endedBins
)

// dotN is dot over the first n features, in the same order: when the rest
// of b is zero and a is finite, it is dot exactly (adding a zero product
// changes no sum).
func dotN(a, b *Vector, n int) float64 {
	as, bs := a[:n], b[:n]
	var s float64
	for i := range as {
		s += as[i] * bs[i]
	}
	return s
}
