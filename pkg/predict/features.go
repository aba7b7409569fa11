package predict

import "math"

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
}

// Uncached is the prompt tokens the endpoint has to compute.
func (in *Input) Uncached() int {
	return max(in.InputTokens-in.GPUTokens-in.CPUTokens-in.StorageTokens-in.SpeculativeTokens, 0)
}

// NumFeatures is the length of a feature vector.
const NumFeatures = 16

// Vector is a feature vector. Features are scaled to be of order one
// (thousands of tokens, counts of requests, shares), so that one ridge
// strength suits them all.
type Vector [NumFeatures]float64

// The regimes a model is piecewise over: an endpoint with a queue behaves
// unlike an idle one (a request waits for a seat, not only for its own
// prefill), so each has its own coefficients.
const (
	RegimeIdle = iota
	RegimeQueued
	NumRegimes
)

// Regime is the queue state in's endpoint is in.
func (in *Input) Regime() int {
	if (!in.MetricsStale && in.Waiting > 0) || in.Prefilling > 0 {
		return RegimeQueued
	}
	return RegimeIdle
}

// TTFTFeatures fills v with the features time to first token is
// predicted from: the request's own prefill (uncached tokens, the
// attention over its context, tokens loaded from each slower tier,
// speculative tokens that may or may not be computed by then) and what
// stands before it (the endpoint's queue and batch, and the prefill work
// this EPP dispatched there and has not seen start decoding).
func (in *Input) TTFTFeatures(v *Vector) {
	un := float64(in.Uncached())
	waiting, running, kv, stale := in.scraped()
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
	}
}

// TPOTFeatures fills v with the features time per output token is
// predicted from: the batch the request will decode in (its size and the
// context it reads), the prefill work that will share its steps, and its
// own context.
func (in *Input) TPOTFeatures(v *Vector) {
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
	}
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

func dot(a, b *Vector) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}
