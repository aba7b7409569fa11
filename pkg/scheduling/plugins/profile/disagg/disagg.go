// Package disagg holds the profile handlers of disaggregated serving, with
// upstream's names and meaning: disagg-profile-handler runs a decode
// profile, then, as its deciders say, an encode and a prefill profile
// (or, with stageOrder prefill-first, prefill before decode); and the
// deprecated pd-profile-handler, its P/D-only predecessor. The result's
// primary pick is the decode pod; its prefill and encode picks go out as
// x-prefiller-host-port and x-encoder-hosts-ports. Before a later stage
// runs, the earlier stage's pick is in the cycle state
// (framework.PeerEndpointKey), for the topology plugins to place the
// later pick near it.
//
// A split that finds no pod for its stage is never dropped silently: the
// handler applies its fallback (serve decode-only, or refuse the request
// with ErrNoCandidates) and counts it.
package disagg

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/readmostly"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// The registered type names, upstream's.
const (
	Type   = "disagg-profile-handler"
	PDType = "pd-profile-handler"
)

// Default profile names, upstream's.
const (
	DefaultDecodeProfile  = "decode"
	DefaultPrefillProfile = "prefill"
	DefaultEncodeProfile  = "encode"
)

// StageOrder says which stage runs first.
type StageOrder string

// The stage orders.
const (
	// DecodeFirst picks the decode pod first; the deciders then look at
	// what it holds.
	DecodeFirst StageOrder = "decode-first"
	// PrefillFirst picks a prefill pod for every request, then decode.
	PrefillFirst StageOrder = "prefill-first"
)

// Fallback is what a split whose stage found no pod becomes.
type Fallback string

// The fallbacks.
const (
	// FallbackDecodeOnly serves the request on the decode pod alone.
	FallbackDecodeOnly Fallback = "decode-only"
	// FallbackRefuse refuses the request (503, with the reason).
	FallbackRefuse Fallback = "refuse"
)

// ErrNoStagePod is the refusal of a split request whose prefill or encode
// stage found no pod; it wraps framework.ErrNoCandidates, so that the
// request path answers 503.
var ErrNoStagePod = fmt.Errorf("%w: the request was split and no pod serves a stage", framework.ErrNoCandidates)

// Options configure a Handler.
type Options struct {
	Decode, Prefill, Encode string
	// PrefillDecider and EncodeDecider decide the stages; nil disables one.
	PrefillDecider, EncodeDecider framework.Decider
	Order                         StageOrder
	Fallback                      Fallback
	// OnlyWithPrefillPods: a cycle whose candidates include no prefill
	// pod that does not decode runs the decode profile alone and answers
	// as single-profile-handler would, deciding and counting nothing.
	OnlyWithPrefillPods bool
	// Metrics count decisions and fallbacks; nil counts nothing.
	Metrics *Metrics
}

// Handler runs the stages of disaggregated serving.
type Handler struct {
	name plugin.TypedName
	o    Options
	// prefillRef and encodeRef are the deciders' names, resolved once
	// every plugin is made (ResolveRefs).
	prefillRef, encodeRef string
	// pdDefault: a pd-profile-handler naming no decider uses the plugin
	// named prefix-based-pd-decider if there is one, else splits always.
	pdDefault bool
	models    *modelLabels
	verdicts  verdictSet
}

var (
	_ framework.ProfileHandler = (*Handler)(nil)
	_ framework.Resolver       = (*Handler)(nil)
	_ plugin.Consumer          = (*Handler)(nil)
)

// New makes a handler of type typ.
func New(typ, name string, o Options) *Handler {
	if o.Decode == "" {
		o.Decode = DefaultDecodeProfile
	}
	if o.Prefill == "" {
		o.Prefill = DefaultPrefillProfile
	}
	if o.Encode == "" {
		o.Encode = DefaultEncodeProfile
	}
	if o.Order == "" {
		o.Order = DecodeFirst
	}
	if o.Fallback == "" {
		o.Fallback = FallbackDecodeOnly
	}
	return &Handler{name: plugin.TypedName{Type: typ, Name: name}, o: o, models: newModelLabels()}
}

// TypedName implements plugin.Plugin.
func (h *Handler) TypedName() plugin.TypedName { return h.name }

// Consumes implements plugin.Consumer: the decode pod's prefix match, as
// upstream's handler declares it (for the decider pd-profile-handler makes
// of its threshold; configured deciders declare their own).
func (h *Handler) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

// ResolveRefs implements framework.Resolver: the deciders named in the
// parameters must be deciders of the same configuration.
func (h *Handler) ResolveRefs(fh framework.Handle) error {
	find := func(param, ref string) (framework.Decider, error) {
		p, ok := fh.Plugin(ref)
		if !ok {
			return nil, framework.ParamError(h.name.Type, h.name.Name, "%s names plugin %q, which the configuration does not define", param, ref)
		}
		d, ok := p.(framework.Decider)
		if !ok {
			return nil, framework.ParamError(h.name.Type, h.name.Name, "%s names plugin %q of type %s, which is not a decider", param, ref, p.TypedName().Type)
		}
		return d, nil
	}
	var err error
	if h.prefillRef != "" {
		if h.o.PrefillDecider, err = find("deciders.prefill", h.prefillRef); err != nil {
			return err
		}
	}
	if h.encodeRef != "" {
		if h.o.EncodeDecider, err = find("deciders.encode", h.encodeRef); err != nil {
			return err
		}
	}
	if h.pdDefault {
		if p, ok := fh.Plugin(defaultPDDecider); ok {
			if d, ok := p.(framework.Decider); ok {
				h.o.PrefillDecider = d
			}
		}
	}
	return nil
}

// verdicts are one cycle's decisions, kept in its state between the
// handler's rounds. A stored *verdicts is never written again.
type verdicts struct {
	prefill, encode framework.Verdict
}

// undecided is the verdicts of stages no decider decides.
var undecided = verdicts{prefill: framework.Verdict{Reason: framework.ReasonNoDecider}, encode: framework.Verdict{Reason: framework.ReasonNoDecider}}

// maxVerdicts bounds the distinct verdicts a handler keeps: its deciders
// give a few (a split or not, and a reason from a small set), and beyond
// that bound each cycle's verdicts are its own.
const maxVerdicts = 32

// verdictSet hands out the verdicts a handler's cycles store, one shared
// copy of each, so that a decision allocates none.
type verdictSet struct {
	all readmostly.List[verdicts, *verdicts]
}

func (s *verdictSet) of(v verdicts) *verdicts {
	// A copy: v escaping would cost every call an allocation.
	return s.all.GetOrAdd(v, maxVerdicts, func() *verdicts {
		p := new(verdicts)
		*p = v
		return p
	})
}

const stateKey = "disagg-profile-handler/verdicts"

// has returns the profile named name, as a slice of profiles that holds it
// alone (nil when there is none): a handler's usual answer, which then
// costs no allocation. Its capacity ends at the profile, so that nothing
// appended to it writes into profiles.
func (h *Handler) has(profiles []*framework.Profile, name string) []*framework.Profile {
	for i, p := range profiles {
		if p.Name == name {
			return profiles[i : i+1 : i+1]
		}
	}
	return nil
}

// Pick implements framework.ProfileHandler.
func (h *Handler) Pick(ctx context.Context, cs *framework.CycleState, req *request.Request, profiles []*framework.Profile, results map[string]*framework.ProfileResult) []*framework.Profile {
	if h.o.Order == PrefillFirst {
		return h.pickPrefillFirst(ctx, cs, req, profiles, results)
	}
	if len(results) == 0 {
		return h.has(profiles, h.o.Decode)
	}
	decodeRes, ran := results[h.o.Decode]
	if !ran {
		return h.has(profiles, h.o.Decode)
	}
	if decodeRes == nil || len(decodeRes.Picked) == 0 || len(results) > 1 {
		return nil
	}
	if h.o.OnlyWithPrefillPods && !hasPrefillPods(cs.Candidates()) {
		return nil
	}
	decode := decodeRes.Picked[0]
	// The later stages are placed near the decode pick (topology plugins).
	cs.Write(framework.PeerEndpointKey, decode)
	v := undecided
	var encode, prefill []*framework.Profile
	if h.o.EncodeDecider != nil {
		if p := h.has(profiles, h.o.Encode); p != nil {
			if v.encode = h.o.EncodeDecider.Disaggregate(ctx, cs, req, decode); v.encode.Split {
				encode = p
			}
		}
	}
	if h.o.PrefillDecider != nil {
		if p := h.has(profiles, h.o.Prefill); p != nil {
			if v.prefill = h.o.PrefillDecider.Disaggregate(ctx, cs, req, decode); v.prefill.Split {
				prefill = p
			}
		}
	}
	cs.Write(stateKey, h.verdicts.of(v))
	switch {
	case encode == nil:
		return prefill
	case prefill == nil:
		return encode
	}
	return []*framework.Profile{encode[0], prefill[0]}
}

func (h *Handler) pickPrefillFirst(ctx context.Context, cs *framework.CycleState, req *request.Request, profiles []*framework.Profile, results map[string]*framework.ProfileResult) []*framework.Profile {
	if _, ran := results[h.o.Decode]; ran {
		return nil
	}
	if _, decided := cs.Read(stateKey); !decided {
		v := undecided
		var next []*framework.Profile
		if p := h.has(profiles, h.o.Prefill); p != nil {
			v.prefill = framework.Verdict{Split: true, Reason: framework.ReasonPrefillFirst}
			next = p
		}
		if p := h.has(profiles, h.o.Encode); p != nil && h.o.EncodeDecider != nil {
			if v.encode = h.o.EncodeDecider.Disaggregate(ctx, cs, req, nil); v.encode.Split {
				next = append(next, p[0])
			}
		}
		cs.Write(stateKey, h.verdicts.of(v))
		if len(next) > 0 {
			return next
		}
	}
	if r := results[h.o.Prefill]; r != nil && len(r.Picked) > 0 {
		// Decode is placed near the prefill pick (topology plugins).
		cs.Write(framework.PeerEndpointKey, r.Picked[0])
	}
	return h.has(profiles, h.o.Decode)
}

// ProcessResults implements framework.ProfileHandler: decode is primary,
// and a stage the deciders split that found no pod takes the fallback.
func (h *Handler) ProcessResults(_ context.Context, cs *framework.CycleState, req *request.Request, results map[string]*framework.ProfileResult) (*framework.Result, error) {
	decodeRes := results[h.o.Decode]
	if decodeRes == nil || len(decodeRes.Picked) == 0 {
		return nil, fmt.Errorf("%s: decode profile %q picked no pod: %w", h.name, h.o.Decode, framework.ErrNoCandidates)
	}
	v := &undecided
	if s, ok := cs.Read(stateKey); ok {
		v = s.(*verdicts)
	} else if h.o.OnlyWithPrefillPods && h.o.Order == DecodeFirst {
		// No prefill pod in the pool: the decode profile's pick alone.
		return &framework.Result{PrimaryProfile: h.o.Decode, Profiles: results}, nil
	}
	series := h.models.series(req.Model)
	// The scheduler's map is the result's, with only the stages that ran
	// on pods of their own beside decode. It is looked up only for as
	// many results as it holds, and walked for others only when it holds
	// more than the stages (this handler chose none).
	rest := len(results) - 1
	var prefillRes, encodeRes *framework.ProfileResult
	var ranPrefill, ranEncode bool
	switch {
	case h.o.Prefill == h.o.Decode:
		prefillRes, ranPrefill = decodeRes, true
	case rest > 0:
		if prefillRes, ranPrefill = results[h.o.Prefill]; ranPrefill {
			rest--
		}
	}
	switch {
	case h.o.Encode == h.o.Decode:
		encodeRes, ranEncode = decodeRes, true
	case h.o.Encode == h.o.Prefill:
		encodeRes, ranEncode = prefillRes, ranPrefill
	case rest > 0:
		if encodeRes, ranEncode = results[h.o.Encode]; ranEncode {
			rest--
		}
	}
	if rest > 0 {
		for name := range results {
			if name != h.o.Decode && name != h.o.Prefill && name != h.o.Encode {
				delete(results, name)
			}
		}
	}
	out := &framework.Result{PrimaryProfile: h.o.Decode, Profiles: results}
	decode := decodeRes.Picked[0]
	reason := v.prefill.Reason
	prefill := false
	if v.prefill.Split {
		r := prefillRes
		switch {
		case r != nil && len(r.Picked) > 0 && r.Picked[0] != decode:
			prefill = true
			out.PrefillProfile = h.o.Prefill
		case r != nil && len(r.Picked) > 0:
			// The decode pod serves prefill too and was picked for it:
			// it prefills locally, with no transfer to itself.
			reason = ReasonSamePod
		default:
			reason = framework.ReasonNoPrefillPod
			if err := h.fallback(series.label, "prefill"); err != nil {
				return nil, err
			}
		}
	}
	encode := false
	if v.encode.Split {
		if r := encodeRes; r != nil && len(r.Picked) > 0 {
			encode = true
			out.EncodeProfile = h.o.Encode
		} else {
			if err := h.fallback(series.label, "encode"); err != nil {
				return nil, err
			}
			if h.o.PrefillDecider == nil {
				reason = framework.ReasonNoEncodePod
			}
		}
	}
	if h.o.PrefillDecider == nil && h.o.Order != PrefillFirst && v.encode.Reason != framework.ReasonNoDecider && reason == framework.ReasonNoDecider {
		reason = v.encode.Reason
	}
	// Deleting a key the map lacks would still hash it.
	if !prefill && ranPrefill && h.o.Prefill != h.o.Decode {
		delete(results, h.o.Prefill)
	}
	if !encode && ranEncode && h.o.Encode != h.o.Decode {
		delete(results, h.o.Encode)
	}
	out.Decision = framework.DecisionOf(encode, prefill)
	out.Reason = reason
	series.count(h.o.Metrics, h.name, out.Decision, reason)
	return out, nil
}

// hasPrefillPods reports whether any candidate is a prefill pod that does
// not decode.
func hasPrefillPods(cands []*datalayer.Candidate) bool {
	for _, c := range cands {
		if bylabel.PrefillOnly(c.Role()) {
			return true
		}
	}
	return false
}

// ReasonSamePod: the prefill profile picked the decode pod itself.
const ReasonSamePod = "same-pod"

// fallback applies the configured fallback for a stage that found no pod,
// counting it.
func (h *Handler) fallback(model, stage string) error {
	h.o.Metrics.fallback(h.name, model, stage, h.o.Fallback)
	if h.o.Fallback == FallbackRefuse {
		return fmt.Errorf("%s: the decider split the request's %s and no %s pod is ready: %w", h.name, stage, stage, ErrNoStagePod)
	}
	return nil
}

// Params are disagg-profile-handler's parameters: upstream's, in its
// nested form or its deprecated flat one (not mixed), and kvroute's
// fallback.
type Params struct {
	StageOrder string `json:"stageOrder"`
	Profiles   struct {
		Decode  string `json:"decode"`
		Prefill string `json:"prefill"`
		Encode  string `json:"encode"`
	} `json:"profiles"`
	Deciders struct {
		Prefill string `json:"prefill"`
		Encode  string `json:"encode"`
	} `json:"deciders"`
	// Fallback is what a split whose stage found no pod becomes:
	// decode-only (the default) or refuse.
	Fallback string `json:"fallback"`
	// OnlyWithPrefillPods: in a cycle without a prefill pod that does not
	// decode, run the decode profile alone, as single-profile-handler.
	OnlyWithPrefillPods bool `json:"onlyWithPrefillPods"`
}

type flatParams struct {
	StageOrder               string `json:"stageOrder"`
	DecodeProfile            string `json:"decodeProfile"`
	PrefillProfile           string `json:"prefillProfile"`
	EncodeProfile            string `json:"encodeProfile"`
	PrefillDeciderPluginName string `json:"prefillDeciderPluginName"`
	EncodeDeciderPluginName  string `json:"encodeDeciderPluginName"`
	DeciderPluginName        string `json:"deciderPluginName"`
	Fallback                 string `json:"fallback"`
	OnlyWithPrefillPods      bool   `json:"onlyWithPrefillPods"`
}

// ParseStageOrder reads a stage order as upstream does: case, dashes and
// underscores aside, decode-first (or decode, or empty) or prefill-first
// (or prefill).
func ParseStageOrder(s string) (StageOrder, error) {
	switch strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(s)) {
	case "", "decodefirst", "decode":
		return DecodeFirst, nil
	case "prefillfirst", "prefill":
		return PrefillFirst, nil
	}
	return "", fmt.Errorf("stageOrder %q, want %s or %s", s, DecodeFirst, PrefillFirst)
}

func parseFallback(s string) (Fallback, error) {
	switch Fallback(s) {
	case "", FallbackDecodeOnly:
		return FallbackDecodeOnly, nil
	case FallbackRefuse:
		return FallbackRefuse, nil
	}
	return "", fmt.Errorf("fallback %q, want %s or %s", s, FallbackDecodeOnly, FallbackRefuse)
}

// Factory makes a disagg-profile-handler.
func Factory(name string, raw json.RawMessage, fh framework.Handle) (plugin.Plugin, error) {
	var p Params
	if errNested := framework.DecodeParams(Type, name, raw, &p); errNested != nil {
		var f flatParams
		if errFlat := framework.DecodeParams(Type, name, raw, &f); errFlat != nil {
			return nil, fmt.Errorf("%w (give either the nested profiles and deciders or the deprecated flat parameters, not both)", errNested)
		}
		p = Params{StageOrder: f.StageOrder, Fallback: f.Fallback, OnlyWithPrefillPods: f.OnlyWithPrefillPods}
		p.Profiles.Decode, p.Profiles.Prefill, p.Profiles.Encode = f.DecodeProfile, f.PrefillProfile, f.EncodeProfile
		p.Deciders.Prefill, p.Deciders.Encode = f.PrefillDeciderPluginName, f.EncodeDeciderPluginName
		if p.Deciders.Prefill == "" {
			p.Deciders.Prefill = f.DeciderPluginName
		}
	}
	order, err := ParseStageOrder(p.StageOrder)
	if err != nil {
		return nil, framework.ParamError(Type, name, "%v", err)
	}
	if order == PrefillFirst && p.Deciders.Prefill != "" {
		return nil, framework.ParamError(Type, name, "deciders.prefill cannot be used with stageOrder %s, which prefills every request on a pod of its own", PrefillFirst)
	}
	fb, err := parseFallback(p.Fallback)
	if err != nil {
		return nil, framework.ParamError(Type, name, "%v", err)
	}
	if err := distinct(Type, name, p.Profiles.Decode, p.Profiles.Prefill, p.Profiles.Encode); err != nil {
		return nil, err
	}
	m, err := NewMetrics(registererOf(fh))
	if err != nil {
		return nil, err
	}
	h := New(Type, name, Options{
		Decode: p.Profiles.Decode, Prefill: p.Profiles.Prefill, Encode: p.Profiles.Encode,
		Order: order, Fallback: fb, Metrics: m, OnlyWithPrefillPods: p.OnlyWithPrefillPods,
	})
	h.prefillRef, h.encodeRef = p.Deciders.Prefill, p.Deciders.Encode
	return h, nil
}

// PDParams are pd-profile-handler's parameters that kvroute reads; the
// compatibility table takes out the rest (hashBlockSize, prefixPluginName,
// prefixPluginType, prefixMatchInfoProducerName; primaryPort is refused).
type PDParams struct {
	DecodeProfile  string `json:"decodeProfile"`
	PrefillProfile string `json:"prefillProfile"`
	// Threshold (llm-d v0.2 to v0.5): split when the decode pod lacks this
	// many prompt tokens; 0 splits every request.
	Threshold *int `json:"threshold"`
	// DeciderPluginName (llm-d v0.6 on) names the decider.
	DeciderPluginName string `json:"deciderPluginName"`
	Fallback          string `json:"fallback"`
}

// defaultPDDecider is the plugin pd-profile-handler uses when it names
// none, as upstream's default.
const defaultPDDecider = "prefix-based-pd-decider"

// PDFactory makes a pd-profile-handler, given the decider its threshold
// means (a threshold of 0 splits every request, as llm-d v0.2 to v0.5
// did; a positive one splits when the decode pod lacks that many tokens).
func PDFactory(threshold func(name string, tokens int) (framework.Decider, error)) framework.Factory {
	return func(name string, raw json.RawMessage, fh framework.Handle) (plugin.Plugin, error) {
		var p PDParams
		if err := framework.DecodeParams(PDType, name, raw, &p); err != nil {
			return nil, err
		}
		fb, err := parseFallback(p.Fallback)
		if err != nil {
			return nil, framework.ParamError(PDType, name, "%v", err)
		}
		m, err := NewMetrics(registererOf(fh))
		if err != nil {
			return nil, err
		}
		if err := distinct(PDType, name, p.DecodeProfile, p.PrefillProfile, DefaultEncodeProfile); err != nil {
			return nil, err
		}
		h := New(PDType, name, Options{Decode: p.DecodeProfile, Prefill: p.PrefillProfile, Fallback: fb, Metrics: m})
		switch {
		case p.DeciderPluginName != "":
			h.prefillRef = p.DeciderPluginName
		case p.Threshold != nil:
			if *p.Threshold < 0 {
				return nil, framework.ParamError(PDType, name, "threshold = %d, want ≥ 0", *p.Threshold)
			}
			if h.o.PrefillDecider, err = threshold(name, *p.Threshold); err != nil {
				return nil, err
			}
		default:
			h.pdDefault = true
			if h.o.PrefillDecider, err = threshold(name, 0); err != nil {
				return nil, err
			}
		}
		return h, nil
	}
}

// distinct refuses stages that name one profile: a request cannot be split
// onto the pod it is decoded on.
func distinct(typ, name, decode, prefill, encode string) error {
	or := func(v, def string) string {
		if v == "" {
			return def
		}
		return v
	}
	decode, prefill, encode = or(decode, DefaultDecodeProfile), or(prefill, DefaultPrefillProfile), or(encode, DefaultEncodeProfile)
	if decode == prefill || decode == encode || prefill == encode {
		return framework.ParamError(typ, name, "the decode (%q), prefill (%q) and encode (%q) profiles must be three different profiles", decode, prefill, encode)
	}
	return nil
}
