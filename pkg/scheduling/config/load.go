package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/pkg/plugin"
	producer "github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/maxscore"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/single"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefix"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// Loaded is a configuration turned into running parts.
type Loaded struct {
	// Config is the parsed file with defaults applied (names filled in,
	// the default profile, picker and handler added).
	Config EndpointPickerConfig
	// Plugins are every instance, in configuration order, followed by those
	// added by default; datalayer.BuildGraph checks their data dependencies.
	Plugins []plugin.Plugin
	// Profiles in configuration order.
	Profiles []*framework.Profile
	Handler  framework.ProfileHandler
	Detector *saturationdetector.Detector
	// Admitters are every admitter plugin, in configuration order.
	Admitters []framework.Admitter
	// FlowControl is the flowControl section, when the flowControl
	// feature gate is on; nil when it is off.
	FlowControl *FlowControl
	// FeatureGates are the gates the config names, on or off.
	FeatureGates map[string]bool
	// Notes say, one line each, what of an upstream configuration kvroute
	// does its own way (superseded types, parameters, sections); the EPP
	// logs them at start-up.
	Notes []string

	// speculating are the plugins that asked for speculative indexing.
	speculating []string
}

// SchedulerOptions returns options for scheduling.New with the loaded
// profiles, handler and detector.
func (l *Loaded) SchedulerOptions() scheduling.Options {
	return scheduling.Options{Profiles: l.Profiles, Handler: l.Handler, Detector: l.Detector, Admitters: l.Admitters}
}

// Parse decodes configuration text strictly: unknown or duplicate fields are
// errors. It applies no defaults.
func Parse(text []byte) (*EndpointPickerConfig, error) {
	var cfg EndpointPickerConfig
	if err := yaml.UnmarshalStrict(text, &cfg); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &cfg, nil
}

// LoadFile loads the configuration in the file at path.
func (r *Registry) LoadFile(path string, h framework.Handle) (*Loaded, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	l, err := r.Load(text, h)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// Load parses configuration text (the default configuration when text is
// empty), instantiates its plugins with h, applies upstream's defaults and
// validates the result. h may be nil (default staleness, no speculator, no
// metrics registration).
func (r *Registry) Load(text []byte, h framework.Handle) (*Loaded, error) {
	if len(bytes.TrimSpace(text)) == 0 {
		text = []byte(DefaultConfigText)
	}
	cfg, err := Parse(text)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	l, err := r.build(*cfg, h)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	return l, nil
}

func (r *Registry) build(cfg EndpointPickerConfig, base framework.Handle) (*Loaded, error) {
	if cfg.APIVersion != "" && cfg.APIVersion != APIVersion && cfg.APIVersion != APIVersionLLMD && cfg.APIVersion != APIVersionLLMDV1 {
		return nil, fmt.Errorf("%w: apiVersion %q, want %q, %q or %q", ErrInvalid, cfg.APIVersion, APIVersion, APIVersionLLMD, APIVersionLLMDV1)
	}
	if cfg.Kind != "" && cfg.Kind != Kind {
		return nil, fmt.Errorf("%w: kind %q, want %q", ErrInvalid, cfg.Kind, Kind)
	}

	l := &Loaded{FeatureGates: map[string]bool{}}
	if err := r.loadGates(cfg.FeatureGates, l); err != nil {
		return nil, err
	}

	h := &loadHandle{base: base, byName: map[string]plugin.Plugin{}}
	add := func(name, typ string, params []byte) (plugin.Plugin, error) {
		if name == "" {
			name = typ
		}
		if typ == "" {
			return nil, fmt.Errorf("%w: plugin %q has no type", ErrInvalid, name)
		}
		if _, dup := h.byName[name]; dup {
			return nil, fmt.Errorf("%w: plugin %q is defined twice", ErrDuplicateName, name)
		}
		if kvType, kvParams, upstream, err := r.resolveUpstream(name, typ, params, l); err != nil {
			return nil, err
		} else if upstream {
			typ, params = kvType, kvParams
		}
		if typ == inertType {
			p := &inertPlugin{name: plugin.TypedName{Type: inertType, Name: name}}
			h.byName[name] = p
			l.Plugins = append(l.Plugins, p)
			return p, nil
		}
		_, f, err := r.factory(name, typ)
		if err != nil {
			return nil, err
		}
		p, err := f(name, params, h)
		if err != nil {
			return nil, err
		}
		h.byName[name] = p
		l.Plugins = append(l.Plugins, p)
		return p, nil
	}
	if err := exactPrefixScorers(cfg.Plugins, l); err != nil {
		return nil, err
	}
	for i := range cfg.Plugins {
		ps := &cfg.Plugins[i]
		if ps.Name == "" {
			ps.Name = ps.Type
		}
		if _, err := add(ps.Name, ps.Type, ps.Parameters); err != nil {
			return nil, err
		}
	}

	for _, p := range l.Plugins {
		if r, ok := p.(framework.Resolver); ok {
			if err := r.ResolveRefs(h); err != nil {
				return nil, err
			}
		}
	}

	// No profiles: every filter, scorer, picker and post-pick goes into one
	// default profile, scorers at weight 1.
	if len(cfg.SchedulingProfiles) == 0 {
		prof := SchedulingProfile{Name: DefaultProfileName}
		for _, ps := range cfg.Plugins {
			if isProfilePlugin(h.byName[ps.Name]) {
				prof.Plugins = append(prof.Plugins, SchedulingPlugin{PluginRef: ps.Name})
			}
		}
		cfg.SchedulingProfiles = []SchedulingProfile{prof}
	}

	// No picker anywhere: a max-score-picker serves every profile.
	anyPicker := false
	for _, p := range l.Plugins {
		if _, ok := p.(framework.Picker); ok {
			anyPicker = true
		}
	}
	if !anyPicker {
		if _, err := add(maxscore.Type, maxscore.Type, nil); err != nil {
			return nil, fmt.Errorf("adding the default picker: %w", err)
		}
		cfg.Plugins = append(cfg.Plugins, PluginSpec{Name: maxscore.Type, Type: maxscore.Type})
		for i := range cfg.SchedulingProfiles {
			cfg.SchedulingProfiles[i].Plugins = append(cfg.SchedulingProfiles[i].Plugins, SchedulingPlugin{PluginRef: maxscore.Type})
		}
	}

	// A profile without a picker takes the configuration's picker when it
	// has exactly one, as upstream's loader does; among several, which was
	// meant cannot be guessed.
	var pickers []string
	for _, p := range l.Plugins {
		if _, ok := p.(framework.Picker); ok {
			pickers = append(pickers, p.TypedName().Name)
		}
	}
	if len(pickers) == 1 {
		for i, sp := range cfg.SchedulingProfiles {
			has := false
			for _, ref := range sp.Plugins {
				if _, ok := h.byName[ref.PluginRef].(framework.Picker); ok {
					has = true
				}
			}
			if !has {
				cfg.SchedulingProfiles[i].Plugins = append(cfg.SchedulingProfiles[i].Plugins, SchedulingPlugin{PluginRef: pickers[0]})
			}
		}
	}

	seen := map[string]bool{}
	for _, sp := range cfg.SchedulingProfiles {
		if sp.Name == "" {
			return nil, fmt.Errorf("%w: a scheduling profile has no name", ErrInvalid)
		}
		if seen[sp.Name] {
			return nil, fmt.Errorf("%w: scheduling profile %q is defined twice", ErrDuplicateName, sp.Name)
		}
		seen[sp.Name] = true
		prof, err := makeProfile(sp, h.byName, l)
		if err != nil {
			return nil, err
		}
		l.Profiles = append(l.Profiles, prof)
	}

	var handlers []framework.ProfileHandler
	for _, p := range l.Plugins {
		if ph, ok := p.(framework.ProfileHandler); ok {
			handlers = append(handlers, ph)
		}
	}
	switch {
	case len(handlers) > 1:
		return nil, fmt.Errorf("%w: %d profile handlers (%s, %s), want one", ErrInvalid, len(handlers), handlers[0].TypedName(), handlers[1].TypedName())
	case len(handlers) == 1:
		l.Handler = handlers[0]
	case len(l.Profiles) == 1:
		p, err := add(single.Type, single.Type, nil)
		if err != nil {
			return nil, fmt.Errorf("adding the default profile handler: %w", err)
		}
		cfg.Plugins = append(cfg.Plugins, PluginSpec{Name: single.Type, Type: single.Type})
		l.Handler = p.(framework.ProfileHandler)
	default:
		return nil, fmt.Errorf("%w: %d scheduling profiles need a profile handler", ErrInvalid, len(l.Profiles))
	}

	if err := r.addSpeculation(l, &cfg, add); err != nil {
		return nil, err
	}
	if err := r.addDefaultProducers(l, &cfg, add); err != nil {
		return nil, err
	}
	if err := r.loadSections(&cfg, h, l); err != nil {
		return nil, err
	}

	for _, p := range l.Plugins {
		if a, ok := p.(framework.Admitter); ok {
			l.Admitters = append(l.Admitters, a)
		}
	}
	var detRef *PluginRef
	if sd := cfg.SaturationDetector; sd != nil {
		switch inline := sd.inline(); {
		case sd.PluginRef != "" && inline != nil:
			return nil, fmt.Errorf("%w: saturationDetector names a plugin and gives thresholds; give one or the other", ErrInvalid)
		case inline != nil:
			// GIE v1.3 and v1.4 gave the detector's thresholds inline.
			if _, err := add(saturationdetector.Type, saturationdetector.Type, inline); err != nil {
				return nil, fmt.Errorf("saturationDetector: %w", err)
			}
			detRef = &PluginRef{PluginRef: saturationdetector.Type}
		default:
			detRef = &PluginRef{PluginRef: sd.PluginRef}
		}
	}
	det, err := detector(detRef, l.Plugins, h)
	if err != nil {
		return nil, err
	}
	l.Detector = det
	l.Config = cfg
	return l, nil
}

func isProfilePlugin(p plugin.Plugin) bool {
	switch p.(type) {
	case framework.Filter, framework.Scorer, framework.Picker, framework.PostPick:
		return true
	}
	return false
}

func makeProfile(sp SchedulingProfile, byName map[string]plugin.Plugin, l *Loaded) (*framework.Profile, error) {
	prof := &framework.Profile{Name: sp.Name}
	refs := map[string]bool{}
	for _, ref := range sp.Plugins {
		p, ok := byName[ref.PluginRef]
		if !ok {
			return nil, fmt.Errorf("scheduling profile %q: %w %q", sp.Name, ErrDanglingRef, ref.PluginRef)
		}
		if refs[ref.PluginRef] {
			return nil, fmt.Errorf("%w: scheduling profile %q refers to plugin %q twice", ErrDuplicateName, sp.Name, ref.PluginRef)
		}
		refs[ref.PluginRef] = true
		if !isProfilePlugin(p) {
			// Upstream lets a profile list any plugin and takes from it
			// only what filters, scores or picks; so does kvroute, saying
			// so (an inert upstream plugin has nothing to say).
			if ref.Weight != nil {
				return nil, fmt.Errorf("%w: scheduling profile %q: plugin %q (type %s) has a weight but is not a scorer", ErrInvalid, sp.Name, ref.PluginRef, p.TypedName().Type)
			}
			if !isInert(p) {
				l.note(fmt.Sprintf("scheduling profile %q: plugin %q (type %s) is not a filter, scorer, picker or post-pick; it runs outside the profile", sp.Name, ref.PluginRef, p.TypedName().Type))
			}
			continue
		}
		s, isScorer := p.(framework.Scorer)
		if ref.Weight != nil && !isScorer {
			return nil, fmt.Errorf("%w: scheduling profile %q: plugin %q (type %s) has a weight but is not a scorer", ErrInvalid, sp.Name, ref.PluginRef, p.TypedName().Type)
		}
		if f, ok := p.(framework.Filter); ok {
			prof.Filters = append(prof.Filters, f)
		}
		if isScorer {
			w := 1.0
			if ref.Weight != nil {
				w = *ref.Weight
			}
			if !(w >= 0) || math.IsInf(w, 0) {
				return nil, fmt.Errorf("%w: scheduling profile %q: scorer %q has weight %v, want a finite value ≥ 0", ErrInvalid, sp.Name, ref.PluginRef, w)
			}
			prof.Scorers = append(prof.Scorers, framework.WeightedScorer{Scorer: s, Weight: w})
		}
		if pk, ok := p.(framework.Picker); ok {
			if prof.Picker != nil {
				return nil, fmt.Errorf("%w: scheduling profile %q has two pickers, %s and %s", ErrInvalid, sp.Name, prof.Picker.TypedName(), pk.TypedName())
			}
			prof.Picker = pk
		}
		if pp, ok := p.(framework.PostPick); ok {
			prof.PostPicks = append(prof.PostPicks, pp)
		}
	}
	if prof.Picker == nil {
		return nil, fmt.Errorf("scheduling profile %q: %w (the config defines several pickers, so none is assumed)", sp.Name, ErrNoPicker)
	}
	return prof, nil
}

// addDefaultProducers instantiates the registered default producer of every
// key a plugin consumes and none produces, until nothing is missing that a
// default can supply. Keys without a default are left for the data graph to
// report.
func (r *Registry) addDefaultProducers(l *Loaded, cfg *EndpointPickerConfig, add func(name, typ string, params []byte) (plugin.Plugin, error)) error {
	for {
		produced := map[string]bool{}
		for _, p := range l.Plugins {
			if pr, ok := p.(plugin.Producer); ok {
				for k := range pr.Produces() {
					produced[k] = true
				}
			}
		}
		var missingKey, missingType string
		for _, p := range l.Plugins {
			c, ok := p.(plugin.Consumer)
			if !ok {
				continue
			}
			for k := range c.Consumes() {
				if produced[k] {
					continue
				}
				if t, ok := r.defaultProducer(k); ok && (missingKey == "" || k < missingKey) {
					missingKey, missingType = k, t
				}
			}
		}
		if missingKey == "" {
			return nil
		}
		if _, err := add(missingType, missingType, nil); err != nil {
			return fmt.Errorf("adding the default producer of %q: %w", missingKey, err)
		}
		cfg.Plugins = append(cfg.Plugins, PluginSpec{Name: missingType, Type: missingType})
	}
}

func detector(ref *PluginRef, plugins []plugin.Plugin, h *loadHandle) (*saturationdetector.Detector, error) {
	if ref != nil {
		p, ok := h.byName[ref.PluginRef]
		if !ok {
			return nil, fmt.Errorf("saturationDetector: %w %q", ErrDanglingRef, ref.PluginRef)
		}
		d, ok := p.(*saturationdetector.Detector)
		if !ok {
			return nil, fmt.Errorf("%w: saturationDetector: plugin %q has type %s, want %s", ErrInvalid, ref.PluginRef, p.TypedName().Type, saturationdetector.Type)
		}
		return d, nil
	}
	var found []*saturationdetector.Detector
	for _, p := range plugins {
		if d, ok := p.(*saturationdetector.Detector); ok {
			found = append(found, d)
		}
	}
	switch len(found) {
	case 0:
		return saturationdetector.NewDetector(saturationdetector.Type, saturationdetector.DefaultThresholds(), h.MetricsStaleness()), nil
	case 1:
		return found[0], nil
	}
	return nil, fmt.Errorf("%w: %d utilization detectors and no saturationDetector to choose one", ErrInvalid, len(found))
}

// loadHandle is the handle factories see while loading: the caller's,
// plus the instances made so far.
type loadHandle struct {
	base   framework.Handle
	byName map[string]plugin.Plugin
}

func (h *loadHandle) MetricsStaleness() time.Duration { return framework.StalenessOf(h.base) }

func (h *loadHandle) Speculator() framework.Speculator {
	if h.base == nil {
		return nil
	}
	return h.base.Speculator()
}

func (h *loadHandle) Registerer() prometheus.Registerer {
	if h.base == nil {
		return nil
	}
	return h.base.Registerer()
}

func (h *loadHandle) Plugin(name string) (plugin.Plugin, bool) {
	p, ok := h.byName[name]
	return p, ok
}

// Handle is a plain framework.Handle for the process to pass to Load.
type Handle struct {
	// Staleness is how old metrics may be before load is unknown; zero
	// means framework.DefaultMetricsStaleness.
	Staleness time.Duration
	// Spec records speculative holdings; nil for none.
	Spec framework.Speculator
	// Reg takes plugin metrics; nil means don't register.
	Reg prometheus.Registerer
}

var _ framework.Handle = (*Handle)(nil)

// MetricsStaleness implements framework.Handle. A nil *Handle gives
// defaults, like a nil Handle.
func (h *Handle) MetricsStaleness() time.Duration {
	if h == nil {
		return 0
	}
	return h.Staleness
}

// Speculator implements framework.Handle.
func (h *Handle) Speculator() framework.Speculator {
	if h == nil {
		return nil
	}
	return h.Spec
}

// Registerer implements framework.Handle.
func (h *Handle) Registerer() prometheus.Registerer {
	if h == nil {
		return nil
	}
	return h.Reg
}

// Plugin implements framework.Handle; the process-level handle knows no
// instances (Load's handle does).
func (h *Handle) Plugin(string) (plugin.Plugin, bool) { return nil, false }

// exactPrefixScorers turns the routing history off for the
// prefix-cache-scorers of a configuration that names the
// precise-prefix-cache-producer and leaves routingHistory unset: upstream's
// scorer then reads that producer's KV-event answers alone, with no
// routing history behind them.
func exactPrefixScorers(specs []PluginSpec, l *Loaded) error {
	if !slices.ContainsFunc(specs, func(ps PluginSpec) bool { return ps.Type == producer.Type }) {
		return nil
	}
	for i := range specs {
		ps := &specs[i]
		if ps.Type != prefix.Type {
			continue
		}
		params := map[string]json.RawMessage{}
		if len(ps.Parameters) > 0 && string(ps.Parameters) != "null" {
			if err := json.Unmarshal(ps.Parameters, &params); err != nil {
				return fmt.Errorf("%w: plugin %q (type %s): parameters: %v", framework.ErrInvalidParams, ps.Name, ps.Type, err)
			}
		}
		if _, set := params["routingHistory"]; set {
			continue
		}
		params["routingHistory"] = json.RawMessage("false")
		raw, err := json.Marshal(params)
		if err != nil {
			return err
		}
		ps.Parameters = raw
		name := ps.Name
		if name == "" {
			name = ps.Type
		}
		l.note(fmt.Sprintf("plugin %q (type %s): beside %s it scores the KV events' answers alone, without the routing history, as upstream's does", name, ps.Type, producer.Type))
	}
	return nil
}
