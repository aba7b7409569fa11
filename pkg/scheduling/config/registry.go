package config

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"sync"

	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/admitter/latencyslo"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/always"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/predicted"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/decider/prefixbased"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/decisiontree"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/headertest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/leastload"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/lorafilter"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/prefixaffinity"
	satfilter "github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/saturation"
	slofilter "github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/slo"
	topofilter "github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/topologyaffinity"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/maxscore"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/random"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/softmax"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/weightedrandom"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/postpick/speculative"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/disagg"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/single"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/sloaware"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/activerequest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/kvcache"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/latency"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/loadaware"
	loraaffinityscorer "github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/loraaffinity"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/nohitlru"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/preciseprefix"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefillcost"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefix"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/queue"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/runningrequests"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/tokenload"
	toposcorer "github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/topologyaffinity"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/topology"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// Sentinel errors of loading; each error names the offending plugin,
// profile, gate or field.
var (
	ErrUnknownType        = errors.New("unknown plugin type")
	ErrUnsupportedType    = errors.New("unsupported upstream plugin type")
	ErrUnknownFeatureGate = errors.New("unknown feature gate")
	ErrDuplicateName      = errors.New("duplicate name")
	ErrDanglingRef        = errors.New("reference to an undefined plugin")
	ErrNoPicker           = errors.New("profile has no picker")
	ErrInvalid            = errors.New("invalid configuration")
	ErrRegistry           = errors.New("invalid plugin registration")
)

// ApproxPrefixProducerType is upstream's approximate prefix producer, which
// loads as kvroute's prefix producer (see compat_types.go).
const ApproxPrefixProducerType = "approx-prefix-cache-producer"

// DataLayerGate is upstream's dataLayer feature gate: accepted, and a no-op,
// because kvroute's data layer is always on.
const DataLayerGate = "dataLayer"

var kebab = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// Registry maps plugin type names to factories. Register everything before
// loading; loading is then safe from any goroutine.
type Registry struct {
	mu               sync.RWMutex
	factories        map[string]framework.Factory
	aliases          map[string]string
	defaultProducers map[string]string
	gates            map[string]bool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		factories:        map[string]framework.Factory{},
		aliases:          map[string]string{},
		defaultProducers: map[string]string{},
		gates:            map[string]bool{},
	}
}

// NewInTreeRegistry returns a registry holding every in-tree scheduling
// plugin and upstream's gates; upstream's types load through the table in
// compat_types.go. Producers from other packages (the prefix producer) are
// added by the caller with Register and RegisterDefaultProducer.
func NewInTreeRegistry() *Registry {
	r := NewRegistry()
	for typ, f := range map[string]framework.Factory{
		preciseprefix.Type:       preciseprefix.Factory,
		prefix.Type:              prefix.Factory,
		queue.Type:               queue.Factory,
		kvcache.Type:             kvcache.Factory,
		runningrequests.Type:     runningrequests.Factory,
		prefillcost.Type:         prefillcost.Factory,
		loadaware.Type:           loadaware.Factory,
		loraaffinityscorer.Type:  loraaffinityscorer.Factory,
		nohitlru.Type:            nohitlru.Factory,
		lorafilter.Type:          lorafilter.Factory,
		satfilter.Type:           satfilter.Factory,
		bylabel.Type:             bylabel.Factory,
		bylabel.SelectorType:     bylabel.SelectorFactory,
		bylabel.DecodeType:       bylabel.DecodeFactory,
		bylabel.PrefillType:      bylabel.PrefillFactory,
		bylabel.EncodeType:       bylabel.EncodeFactory,
		leastload.LowQueueType:   leastload.LowQueueFactory,
		leastload.LeastQueueType: leastload.LeastQueueFactory,
		leastload.LeastKVType:    leastload.LeastKVFactory,
		decisiontree.Type:        decisiontree.Factory,
		headertest.Type:          headertest.Factory,
		maxscore.Type:            maxscore.Factory,
		random.Type:              random.Factory,
		weightedrandom.Type:      weightedrandom.Factory,
		softmax.Type:             softmax.Factory,
		single.Type:              single.Factory,
		speculative.Type:         speculative.Factory,
		saturationdetector.Type:  saturationdetector.Factory,
		latency.Type:             latency.Factory,
		slofilter.Type:           slofilter.Factory,
		latencyslo.Type:          latencyslo.Factory,
		disagg.Type:              disagg.Factory,
		disagg.PDType:            disagg.PDFactory(pdThreshold),
		prefixbased.Type:         prefixbased.Factory,
		predicted.Type:           predicted.Factory,
		always.PDType:            always.PDFactory,
		always.MultimodalType:    always.MultimodalFactory,
		activerequest.Type:       activerequest.Factory,
		tokenload.Type:           tokenload.Factory,
		prefixaffinity.Type:      prefixaffinity.Factory,
		sloaware.Type:            sloaware.Factory,
		topology.ExtractorType:   topology.ExtractorFactory,
		topofilter.Type:          topofilter.Factory,
		toposcorer.Type:          toposcorer.Factory,
	} {
		r.mustRegister(typ, f)
	}
	if err := r.RegisterAlias(runningrequests.Alias, runningrequests.Type); err != nil {
		panic(err)
	}
	r.RegisterFeatureGate(DataLayerGate)
	return r
}

// Register adds a plugin type. The name must be kebab-case and new.
func (r *Registry) Register(typ string, f framework.Factory) error {
	if !kebab.MatchString(typ) {
		return fmt.Errorf("%w: type %q is not kebab-case", ErrRegistry, typ)
	}
	if f == nil {
		return fmt.Errorf("%w: type %q has a nil factory", ErrRegistry, typ)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[typ]; ok {
		return fmt.Errorf("%w: type %q registered twice", ErrRegistry, typ)
	}
	if _, ok := r.aliases[typ]; ok {
		return fmt.Errorf("%w: type %q is already an alias", ErrRegistry, typ)
	}
	r.factories[typ] = f
	return nil
}

func (r *Registry) mustRegister(typ string, f framework.Factory) {
	if err := r.Register(typ, f); err != nil {
		panic(err)
	}
}

// RegisterAlias makes alias another name for the registered type typ.
func (r *Registry) RegisterAlias(alias, typ string) error {
	if !kebab.MatchString(alias) {
		return fmt.Errorf("%w: alias %q is not kebab-case", ErrRegistry, alias)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[typ]; !ok {
		return fmt.Errorf("%w: alias %q for unregistered type %q", ErrRegistry, alias, typ)
	}
	if _, ok := r.factories[alias]; ok {
		return fmt.Errorf("%w: alias %q is already a type", ErrRegistry, alias)
	}
	r.aliases[alias] = typ
	return nil
}

// RegisterDefaultProducer names the registered type that is instantiated,
// with default parameters, when a configured plugin consumes key and no
// configured plugin produces it. It is also what approx-prefix-cache-producer
// maps onto for datalayer.PrefixCacheMatchInfoKey.
func (r *Registry) RegisterDefaultProducer(key, typ string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[typ]; !ok {
		return fmt.Errorf("%w: default producer of %q has unregistered type %q", ErrRegistry, key, typ)
	}
	r.defaultProducers[key] = typ
	return nil
}

// RegisterFeatureGate makes name a known feature gate.
func (r *Registry) RegisterFeatureGate(name string) {
	r.mu.Lock()
	r.gates[name] = true
	r.mu.Unlock()
}

// Types lists the registered type names and aliases, sorted.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.factories)+len(r.aliases))
	for t := range r.factories {
		out = append(out, t)
	}
	for t := range r.aliases {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// factory resolves a type name (or alias) to its canonical name and factory.
func (r *Registry) factory(name, typ string) (string, framework.Factory, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if canon, ok := r.aliases[typ]; ok {
		typ = canon
	}
	if f, ok := r.factories[typ]; ok {
		return typ, f, nil
	}
	known := slices.Sorted(func(yield func(string) bool) {
		for t := range r.factories {
			if !yield(t) {
				return
			}
		}
	})
	return "", nil, fmt.Errorf("plugin %q: %w %q (known types: %v)", name, ErrUnknownType, typ, known)
}

func (r *Registry) defaultProducer(key string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.defaultProducers[key]
	return t, ok
}

func (r *Registry) knownGate(name string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.gates[name]
}

// registered reports whether typ is a registered type or alias.
func (r *Registry) registered(typ string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	_, f := r.factories[typ]
	_, a := r.aliases[typ]
	return f || a
}

// pdThreshold is the decider pd-profile-handler's threshold means (llm-d
// v0.2 to v0.5): 0 splits every request, a positive one splits when the
// decode pod lacks that many prompt tokens.
func pdThreshold(name string, tokens int) (framework.Decider, error) {
	if tokens == 0 {
		return always.NewPD(name), nil
	}
	return prefixbased.New(name, prefixbased.Params{NonCachedTokens: tokens})
}
