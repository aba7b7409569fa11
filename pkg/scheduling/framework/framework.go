// Package framework says what the scheduler's extension points are: profile
// handlers, filters, scorers, pickers and post-pick hooks, the per-cycle
// state they share, and the results they produce. Implementations live in
// their own packages under pkg/scheduling/plugins; the scheduler that runs
// them lives in pkg/scheduling.
package framework

import (
	"context"
	"errors"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
)

// Sentinel errors a scheduling cycle can end with. The request path maps
// ErrNoCandidates to 503 and ErrShed to 429.
var (
	// ErrNoCandidates means there was no endpoint to pick: none was offered,
	// or the filters of the primary profile left none.
	ErrNoCandidates = errors.New("no candidate endpoints")
	// ErrShed means a sheddable request was refused because every candidate
	// is saturated.
	ErrShed = errors.New("request shed: all candidate endpoints are saturated")
)

// Shed is an ErrShed with a reason of its own ("request shed: reason"),
// for an admitter to say why it refused a request.
func Shed(reason string) error { return &shedError{reason: reason} }

type shedError struct{ reason string }

func (e *shedError) Error() string        { return "request shed: " + e.reason }
func (e *shedError) Is(target error) bool { return target == ErrShed }

// Admitter decides, once PrepareData has run and before any profile does,
// whether a request is served at all. A refusal is an error for which
// errors.Is(err, ErrShed) holds (see Shed), saying why; the request path
// answers it with 429.
type Admitter interface {
	plugin.Plugin
	Admit(ctx context.Context, req *request.Request, cands []*datalayer.Candidate) error
}

// ProfileHandler decides which profiles run for a request, possibly over
// several rounds (e.g. a prefill profile chosen after a decode profile), and
// turns their results into the scheduling result.
type ProfileHandler interface {
	plugin.Plugin
	// Pick returns the profiles to run next, given those already run and
	// their results; an empty answer ends the cycle. profiles is in
	// configuration order, so a handler that returns them in that order is
	// deterministic.
	Pick(ctx context.Context, cs *CycleState, req *request.Request, profiles []*Profile, results map[string]*ProfileResult) []*Profile
	// ProcessResults makes the final result from every profile's result.
	ProcessResults(ctx context.Context, cs *CycleState, req *request.Request, results map[string]*ProfileResult) (*Result, error)
}

// Filter narrows the candidates. It returns a subset of cands (it may reuse
// the slice's backing array) and must not invent endpoints.
type Filter interface {
	plugin.Plugin
	Filter(ctx context.Context, cs *CycleState, req *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate
}

// ScorerCategory says what a scorer pulls towards, so that a profile's mix
// can be reasoned about: affinity keeps related requests together (prefix,
// LoRA), distribution spreads them (randomness, round robin), balance evens
// out load (queue, KV usage).
type ScorerCategory uint8

// The scorer categories.
const (
	Affinity ScorerCategory = iota
	Distribution
	Balance
)

func (c ScorerCategory) String() string {
	switch c {
	case Affinity:
		return "affinity"
	case Distribution:
		return "distribution"
	case Balance:
		return "balance"
	}
	return "unknown"
}

// Scorer rates each candidate in [0,1], higher is better. Scores are written
// into out, which has len(cands) entries, out[i] for cands[i]: a slice
// rather than a map keeps a scheduling cycle free of per-scorer allocations.
// The scheduler clamps every score to [0,1] and treats NaN as 0. A scorer
// must not keep out after it returns (the scheduler reuses it).
type Scorer interface {
	plugin.Plugin
	Category() ScorerCategory
	Score(ctx context.Context, cs *CycleState, req *request.Request, cands []*datalayer.Candidate, out []float64)
}

// Picker chooses from the scored candidates: the primary first, then any
// fallbacks. It must pick only from scored, and must not keep scored after it
// returns (the scheduler reuses it).
type Picker interface {
	plugin.Plugin
	Pick(ctx context.Context, cs *CycleState, scored []ScoredCandidate) *ProfileResult
}

// PostPick runs after a profile's picker, e.g. to record that the picked
// endpoint will soon hold the request's prefix. It must not block.
type PostPick interface {
	plugin.Plugin
	PostPick(ctx context.Context, cs *CycleState, req *request.Request, res *ProfileResult)
}

// ScoredCandidate is a candidate with its profile's weighted score.
type ScoredCandidate struct {
	*datalayer.Candidate
	Score float64
}

// WeightedScorer is a scorer with its weight in a profile.
type WeightedScorer struct {
	Scorer
	Weight float64
}

// Profile is one named pipeline: filters in order, weighted scorers, a
// picker, and post-pick hooks.
type Profile struct {
	Name      string
	Filters   []Filter
	Scorers   []WeightedScorer
	Picker    Picker
	PostPicks []PostPick
}

// ProfileResult is what one profile picked: the primary endpoint first, then
// fallbacks in order of preference. Empty when the filters left nothing.
type ProfileResult struct {
	Picked []*datalayer.Candidate
	// Scored is every candidate the profile scored with its weighted
	// score, picked or not; kept only when the scheduler is asked to
	// (scheduling.Options.KeepScores), so that an operator can see why a
	// pod won.
	Scored []ScoredCandidate
}

// Result is a whole scheduling cycle's answer.
type Result struct {
	// PrimaryProfile names the profile whose pick the request is sent to;
	// with disaggregated serving, the decode profile.
	PrimaryProfile string
	// Profiles holds every profile's result by profile name.
	Profiles map[string]*ProfileResult
	// PrefillProfile names the profile whose pick prefills the request
	// before the primary pick decodes it; empty when the primary pick
	// prefills it itself.
	PrefillProfile string
	// EncodeProfile names the profile whose picks encode the request's
	// multimodal parts; empty when none do.
	EncodeProfile string
	// Decision is which stages run on pods of their own; empty for a
	// handler that never splits a request.
	Decision Decision
	// Reason says in a word why the decision was made (a metric label
	// value from a small fixed set, such as "cached" or "no-prefill-pod").
	Reason string
}

// Decision names the stages a request is split into, with upstream's
// decision_type values.
type Decision string

// The decisions.
const (
	DecodeOnly          Decision = "decode-only"
	PrefillDecode       Decision = "prefill-decode"
	EncodeDecode        Decision = "encode-decode"
	EncodePrefillDecode Decision = "encode-prefill-decode"
)

// DecisionOf is the decision for the stages that run apart from decode.
func DecisionOf(encode, prefill bool) Decision {
	switch {
	case encode && prefill:
		return EncodePrefillDecode
	case encode:
		return EncodeDecode
	case prefill:
		return PrefillDecode
	}
	return DecodeOnly
}

// Prefill returns the pod that prefills the request for the primary pick,
// nil when the primary pick prefills it itself.
func (r *Result) Prefill() *datalayer.Candidate {
	if r == nil || r.PrefillProfile == "" {
		return nil
	}
	if p := r.Profiles[r.PrefillProfile]; p != nil && len(p.Picked) > 0 {
		return p.Picked[0]
	}
	return nil
}

// Encoders returns the pods that encode the request's multimodal parts,
// none when the primary pick encodes them itself.
func (r *Result) Encoders() []*datalayer.Candidate {
	if r == nil || r.EncodeProfile == "" {
		return nil
	}
	if p := r.Profiles[r.EncodeProfile]; p != nil {
		return p.Picked
	}
	return nil
}

// Targets returns the primary profile's picks, primary first.
func (r *Result) Targets() []*datalayer.Candidate {
	if r == nil {
		return nil
	}
	if p := r.Profiles[r.PrimaryProfile]; p != nil {
		return p.Picked
	}
	return nil
}

// Decider decides, once the decode pod is picked, whether a stage of the
// request (its prefill, or the encoding of its multimodal parts) runs on
// pods of its own. decode is nil when the stage is decided before decode
// is picked (a prefill-first handler's encode stage).
type Decider interface {
	plugin.Plugin
	Disaggregate(ctx context.Context, cs *CycleState, req *request.Request, decode *datalayer.Candidate) Verdict
}

// Verdict is a decider's answer.
type Verdict struct {
	// Split: the stage runs on pods of its own.
	Split bool
	// Reason says why in a word, a metric label value from a fixed set
	// (the Reason* constants, or a decider's own few).
	Reason string
}

// Reasons deciders and profile handlers give.
const (
	// ReasonCached: the decode pod holds enough of the prompt that its own
	// prefill of the rest is cheaper.
	ReasonCached = "cached"
	// ReasonUncached: the part of the prompt the decode pod lacks is long
	// enough to prefill elsewhere.
	ReasonUncached = "uncached"
	// ReasonShortPrompt: the prompt is too short to split.
	ReasonShortPrompt = "short-prompt"
	// ReasonDisabled: the decider is configured never to split.
	ReasonDisabled = "disabled"
	// ReasonAlways: the decider splits every request.
	ReasonAlways = "always"
	// ReasonNoDecider: no decider is configured for the stage.
	ReasonNoDecider = "no-decider"
	// ReasonNoPrefixInfo: nothing says what the decode pod holds.
	ReasonNoPrefixInfo = "no-prefix-info"
	// ReasonNoPrefillPod: the decider split the request, and no prefill
	// pod could be picked.
	ReasonNoPrefillPod = "no-prefill-pod"
	// ReasonNoEncodePod: the decider split the request's encoding, and no
	// encode pod could be picked.
	ReasonNoEncodePod = "no-encode-pod"
	// ReasonPrefillFirst: the handler runs prefill on a pod of its own
	// for every request (stageOrder prefill-first).
	ReasonPrefillFirst = "prefill-first"
)
