package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"sync"

	producer "github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/loraaffinity"
	satfilter "github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/saturation"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/maxscore"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/random"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/softmax"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/picker/weightedrandom"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/postpick/speculative"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/single"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/kvcache"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/preciseprefix"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefillcost"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/prefix"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/queue"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/scorer/runningrequests"
	"github.com/kvroute/kvroute/pkg/scheduling/saturation"
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

// ApproxPrefixProducerType is upstream's approximate prefix producer. kvroute
// maps it onto its prefix producer, which publishes the same data with the
// same meaning (match and total in blocks), exactly from KV events where an
// endpoint's stream is in order and by upstream's approximation elsewhere.
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
	unsupported      map[string]string
	defaultProducers map[string]string
	gates            map[string]bool
	mappings         map[string]upstreamMapping
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{
		factories:        map[string]framework.Factory{},
		aliases:          map[string]string{},
		unsupported:      map[string]string{},
		defaultProducers: map[string]string{},
		gates:            map[string]bool{},
		mappings:         map[string]upstreamMapping{},
	}
}

// NewInTreeRegistry returns a registry holding every in-tree scheduling
// plugin, upstream's aliases and gates, and the upstream types kvroute
// refuses. Producers from other packages (the prefix producer) are added by
// the caller with Register and RegisterDefaultProducer.
func NewInTreeRegistry() *Registry {
	r := NewRegistry()
	for typ, f := range map[string]framework.Factory{
		preciseprefix.Type:   preciseprefix.Factory,
		prefix.Type:          prefix.Factory,
		queue.Type:           queue.Factory,
		kvcache.Type:         kvcache.Factory,
		runningrequests.Type: runningrequests.Factory,
		prefillcost.Type:     prefillcost.Factory,
		loraaffinity.Type:    loraaffinity.Factory,
		satfilter.Type:       satfilter.Factory,
		maxscore.Type:        maxscore.Factory,
		random.Type:          random.Factory,
		weightedrandom.Type:  weightedrandom.Factory,
		softmax.Type:         softmax.Factory,
		single.Type:          single.Factory,
		speculative.Type:     speculative.Factory,
		saturation.Type:      saturation.Factory,
	} {
		r.mustRegister(typ, f)
	}
	if err := r.RegisterAlias(runningrequests.Alias, runningrequests.Type); err != nil {
		panic(err)
	}
	if err := r.MapUpstream(ApproxPrefixProducerType, producer.Type, translateApproxPrefix); err != nil {
		panic(err)
	}
	r.RegisterFeatureGate(DataLayerGate)
	for typ, why := range upstreamOnly {
		r.unsupported[typ] = why
	}
	return r
}

// upstreamOnly are upstream types with no kvroute equivalent of the same
// meaning, and why.
var upstreamOnly = map[string]string{
	"lora-affinity-scorer":                 "use lora-affinity-filter, which keeps LoRA requests on endpoints with the adapter or room for it",
	"token-load-scorer":                    "use prefill-cost-scorer, which weighs queued prefill work against cached tokens",
	"latency-scorer":                       "kvroute has no latency predictor scorer",
	"predicted-latency-producer":           "kvroute has no latency predictor producer",
	"inflight-load-producer":               "kvroute takes load from scraped metrics; use queue-scorer or prefill-cost-scorer",
	"prefix-cache-affinity-filter":         "kvroute has no prefix affinity filter; weight precise-prefix-cache-scorer instead",
	"slo-headroom-tier-filter":             "kvroute has no SLO headroom filter",
	"latency-slo-admitter":                 "kvroute has no SLO admitter",
	"header-based-testing-filter":          "kvroute has no testing filter",
	"destination-endpoint-served-verifier": "kvroute has no served-endpoint verifier",
	"request-attribute-reporter":           "kvroute has no request attribute reporter",
	"metrics-data-source":                  "kvroute scrapes model-server metrics itself; configure scraping with the EPP's flags",
	"core-metrics-extractor":               "kvroute scrapes model-server metrics itself; configure scraping with the EPP's flags",
	"openai-parser":                        "kvroute parses OpenAI requests natively",
	"vllmgrpc-parser":                      "kvroute has no vLLM gRPC parser",
	"passthrough-parser":                   "kvroute parses OpenAI requests natively",
	"concurrency-detector":                 "use utilization-detector",
	"global-strict-fairness-policy":        "kvroute has no flow control",
	"round-robin-fairness-policy":          "kvroute has no flow control",
	"fcfs-ordering-policy":                 "kvroute has no flow control",
	"edf-ordering-policy":                  "kvroute has no flow control",
	"slo-deadline-ordering-policy":         "kvroute has no flow control",
	"static-usage-limit-policy":            "kvroute has no flow control",
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
	delete(r.unsupported, typ)
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
	if why, ok := r.unsupported[typ]; ok {
		return "", nil, fmt.Errorf("plugin %q: %w %q: %s", name, ErrUnsupportedType, typ, why)
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

// ParamTranslator rewrites an upstream type's parameters into those of the
// kvroute type it maps onto, refusing any whose meaning does not carry over.
type ParamTranslator func(name string, upstream json.RawMessage) (json.RawMessage, error)

type upstreamMapping struct {
	target    string
	translate ParamTranslator
}

// MapUpstream makes the upstream type upstreamType an instance of the kvroute
// type target, its parameters rewritten by translate. target need not be
// registered yet: a binary that never registers it refuses upstreamType with
// a message saying so.
func (r *Registry) MapUpstream(upstreamType, target string, translate ParamTranslator) error {
	if !kebab.MatchString(upstreamType) || translate == nil {
		return fmt.Errorf("%w: bad mapping of upstream type %q", ErrRegistry, upstreamType)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.factories[upstreamType]; ok {
		return fmt.Errorf("%w: upstream type %q is already a kvroute type", ErrRegistry, upstreamType)
	}
	r.mappings[upstreamType] = upstreamMapping{target: target, translate: translate}
	delete(r.unsupported, upstreamType)
	return nil
}

func (r *Registry) mapping(typ string) (upstreamMapping, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	m, ok := r.mappings[typ]
	return m, ok
}
