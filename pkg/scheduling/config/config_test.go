package config_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/prepare/predictedlatency"
	producer "github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/prepare/routinghistory"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// registryWithProducer registers kvroute's real prefix producer the way the
// EPP binary does, except that it has no index to read: loading never
// calls Produce.
func registryWithProducer(t testing.TB) *config.Registry {
	r, _ := registryCapturingParams(t)
	return r
}

// registryCapturingParams is registryWithProducer that also reports the
// parameters the producer was last made with.
func registryCapturingParams(t testing.TB) (*config.Registry, func() producer.Params) {
	t.Helper()
	var (
		mu   sync.Mutex
		last producer.Params
	)
	r := config.NewInTreeRegistry()
	err := r.Register(producer.Type, func(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		p := producer.DefaultParams()
		if err := framework.DecodeParams(producer.Type, name, raw, &p); err != nil {
			return nil, err
		}
		mu.Lock()
		last = p
		mu.Unlock()
		return producer.New(name, p, nil, nil), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterDefaultProducer(datalayer.PrefixCacheMatchInfoKey, producer.Type); err != nil {
		t.Fatal(err)
	}
	// The routing history, as the EPP registers it, over an index of its own.
	err = r.Register(routinghistory.Type, func(name string, _ json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		return routinghistory.New(name, approx.New(0, nil)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterDefaultProducer(datalayer.RoutedPrefixKey, routinghistory.Type); err != nil {
		t.Fatal(err)
	}
	// The latency producer, as the EPP registers it, with a predictor of
	// its own.
	err = r.Register(predictedlatency.Type, func(name string, _ json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
		p, err := predict.New(predict.Options{})
		if err != nil {
			return nil, err
		}
		return predictedlatency.New(name, predictedlatency.InProcess{P: p}, framework.StalenessOf(h), nil)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterDefaultProducer(datalayer.LatencyPredictionInfoKey, predictedlatency.Type); err != nil {
		t.Fatal(err)
	}
	return r, func() producer.Params {
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// shape summarises a loaded profile: "filter:name", "scorer:name*weight",
// "picker:name", "postpick:name", in order of kind.
func shape(p *framework.Profile) []string {
	var out []string
	for _, f := range p.Filters {
		out = append(out, "filter:"+f.TypedName().String())
	}
	for _, s := range p.Scorers {
		out = append(out, "scorer:"+s.TypedName().String()+"*"+jsonNum(s.Weight))
	}
	if p.Picker != nil {
		out = append(out, "picker:"+p.Picker.TypedName().String())
	}
	for _, pp := range p.PostPicks {
		out = append(out, "postpick:"+pp.TypedName().String())
	}
	return out
}

func jsonNum(f float64) string { b, _ := json.Marshal(f); return string(b) }

func names(ps []plugin.Plugin) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.TypedName().String()
	}
	return out
}

func TestLoadGoodConfigs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		text        string
		wantPlugins []string
		wantProfile map[string][]string
		wantHandler string
	}{
		{
			name: "no config gives the predicted-latency profile, with a prefill profile for pools that have prefill pods, its producers added as defaults",
			text: "",
			wantPlugins: []string{
				"decode-filter/decode-filter", "prefill-filter/prefill-filter",
				"slo-headroom-tier-filter/slo-headroom-tier-filter", "latency-scorer/latency-scorer",
				"latency-slo-admitter/latency-slo-admitter",
				"speculative-prefix-recorder/speculative-prefix-recorder",
				"predicted-latency-pd-decider/predicted-latency-pd-decider", "disagg-profile-handler/disagg-profile-handler",
				"max-score-picker/max-score-picker",
				"predicted-latency-producer/predicted-latency-producer",
				"precise-prefix-cache-producer/precise-prefix-cache-producer",
			},
			wantProfile: map[string][]string{"default": {
				"filter:decode-filter/decode-filter", "filter:slo-headroom-tier-filter/slo-headroom-tier-filter", "scorer:latency-scorer/latency-scorer*1",
				"picker:max-score-picker/max-score-picker", "postpick:speculative-prefix-recorder/speculative-prefix-recorder",
			}, "prefill": {
				"filter:prefill-filter/prefill-filter", "scorer:latency-scorer/latency-scorer*1",
				"picker:max-score-picker/max-score-picker", "postpick:speculative-prefix-recorder/speculative-prefix-recorder",
			}},
			wantHandler: "disagg-profile-handler/disagg-profile-handler",
		},
		{
			name: "upstream's weights stay available by name",
			text: config.UpstreamWeightsConfigText,
			wantPlugins: []string{
				"precise-prefix-cache-scorer/precise-prefix-cache-scorer", "queue-scorer/queue-scorer",
				"kv-cache-utilization-scorer/kv-cache-utilization-scorer",
				"speculative-prefix-recorder/speculative-prefix-recorder", "max-score-picker/max-score-picker",
				"single-profile-handler/single-profile-handler", "precise-prefix-cache-producer/precise-prefix-cache-producer",
			},
			wantProfile: map[string][]string{"default": {
				"scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*3",
				"scorer:queue-scorer/queue-scorer*2",
				"scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2",
				"picker:max-score-picker/max-score-picker",
				"postpick:speculative-prefix-recorder/speculative-prefix-recorder",
			}},
			wantHandler: "single-profile-handler/single-profile-handler",
		},
		{
			name: "the upstream example loads, its approximate producer mapped onto kvroute's",
			text: `
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [dataLayer]
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- name: prefix-producer
  type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 16, maxPrefixBlocksToMatch: 256, lruCapacityPerServer: 31250, autoTune: true}
- type: max-score-picker
  parameters: {maxNumOfEndpoints: 1}
schedulingProfiles:
- name: default
  plugins:
  - {pluginRef: queue-scorer, weight: 2}
  - {pluginRef: kv-cache-utilization-scorer, weight: 2}
  - {pluginRef: prefix-cache-scorer, weight: 3}
  - {pluginRef: max-score-picker}
`,
			wantPlugins: []string{
				"queue-scorer/queue-scorer", "kv-cache-utilization-scorer/kv-cache-utilization-scorer",
				"prefix-cache-scorer/prefix-cache-scorer", "prefix-producer/precise-prefix-cache-producer",
				"max-score-picker/max-score-picker", "single-profile-handler/single-profile-handler",
				"routing-history-producer/routing-history-producer",
			},
			wantProfile: map[string][]string{"default": {
				"scorer:queue-scorer/queue-scorer*2",
				"scorer:kv-cache-utilization-scorer/kv-cache-utilization-scorer*2",
				"scorer:prefix-cache-scorer/prefix-cache-scorer*3",
				"picker:max-score-picker/max-score-picker",
				"postpick:prefix-cache-scorer/prefix-cache-scorer",
			}},
			wantHandler: "single-profile-handler/single-profile-handler",
		},
		{
			name: "without profiles every filter, scorer and picker joins default at weight 1",
			text: `
plugins:
- type: lora-affinity-filter
- {name: sat, type: saturation-filter, parameters: {queueThreshold: 8}}
- type: running-requests-scorer
- type: prefill-cost-scorer
- {type: softmax-picker, parameters: {temperature: 0.2}}
`,
			wantPlugins: []string{
				"lora-affinity-filter/lora-affinity-filter", "sat/saturation-filter",
				"running-requests-scorer/running-requests-size-scorer", "prefill-cost-scorer/prefill-cost-scorer",
				"softmax-picker/softmax-picker", "single-profile-handler/single-profile-handler",
				"precise-prefix-cache-producer/precise-prefix-cache-producer",
			},
			wantProfile: map[string][]string{"default": {
				"filter:lora-affinity-filter/lora-affinity-filter", "filter:sat/saturation-filter",
				"scorer:running-requests-scorer/running-requests-size-scorer*1",
				"scorer:prefill-cost-scorer/prefill-cost-scorer*1",
				"picker:softmax-picker/softmax-picker",
			}},
			wantHandler: "single-profile-handler/single-profile-handler",
		},
		{
			name: "a scorer without a weight weighs 1 and a missing picker is max-score",
			text: `
plugins:
- {name: q, type: queue-scorer}
- {name: kv, type: kv-cache-utilization-scorer}
schedulingProfiles:
- name: only
  plugins: [{pluginRef: q}, {pluginRef: kv, weight: 0.5}]
`,
			wantPlugins: []string{"q/queue-scorer", "kv/kv-cache-utilization-scorer", "max-score-picker/max-score-picker", "single-profile-handler/single-profile-handler"},
			wantProfile: map[string][]string{"only": {"scorer:q/queue-scorer*1", "scorer:kv/kv-cache-utilization-scorer*0.5", "picker:max-score-picker/max-score-picker"}},
			wantHandler: "single-profile-handler/single-profile-handler",
		},
		{
			name: "a saturation detector is taken by reference",
			text: `
plugins:
- {name: strict, type: utilization-detector, parameters: {queueDepthThreshold: 2, kvCacheUtilThreshold: 0.5, metricsStalenessThreshold: 500ms}}
- {type: queue-scorer}
saturationDetector: {pluginRef: strict}
`,
			wantPlugins: []string{"strict/utilization-detector", "queue-scorer/queue-scorer", "max-score-picker/max-score-picker", "single-profile-handler/single-profile-handler"},
			wantProfile: map[string][]string{"default": {"scorer:queue-scorer/queue-scorer*1", "picker:max-score-picker/max-score-picker"}},
			wantHandler: "single-profile-handler/single-profile-handler",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, err := registryWithProducer(t).Load([]byte(tt.text), &config.Handle{Spec: schedtest.NopSpeculator{}})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if got := names(l.Plugins); !equal(got, tt.wantPlugins) {
				t.Errorf("plugins = %q\nwant      %q", got, tt.wantPlugins)
			}
			if len(l.Profiles) != len(tt.wantProfile) {
				t.Fatalf("%d profiles, want %d", len(l.Profiles), len(tt.wantProfile))
			}
			for _, p := range l.Profiles {
				if got := shape(p); !equal(got, tt.wantProfile[p.Name]) {
					t.Errorf("profile %s = %q\nwant %q", p.Name, got, tt.wantProfile[p.Name])
				}
			}
			if got := l.Handler.TypedName().String(); got != tt.wantHandler {
				t.Errorf("handler = %s, want %s", got, tt.wantHandler)
			}
			if l.Detector == nil {
				t.Error("no saturation detector")
			}
			// The data layer's graph check accepts what the loader built:
			// every consumed key is produced, with the consumer's type.
			if _, err := prepare.BuildGraph(l.Plugins); err != nil {
				t.Errorf("BuildGraph: %v", err)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTheReferencedDetectorIsUsed(t *testing.T) {
	t.Parallel()
	l, err := config.NewInTreeRegistry().Load([]byte(`
plugins:
- {name: strict, type: utilization-detector, parameters: {queueDepthThreshold: 2}}
- {type: queue-scorer}
saturationDetector: {pluginRef: strict}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Detector.Thresholds(); got != (saturationdetector.Thresholds{QueueDepth: 2, KVCacheUtil: 0.8}) {
		t.Errorf("thresholds = %+v", got)
	}
}

func TestLoadRefusesBadConfigs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		text    string
		noProd  bool // load with the in-tree registry alone
		wantIs  error
		wantMsg string
	}{
		{"an unknown type is named with the known ones", "plugins: [{name: x, type: magic-scorer}]", true, config.ErrUnknownType,
			`load config: plugin "x": unknown plugin type "magic-scorer" (known types: [active-request-scorer always-disagg-multimodal-decider always-disagg-pd-decider by-label decision-tree-filter decode-filter disagg-profile-handler encode-filter header-based-testing-filter kv-cache-utilization-scorer label-selector-filter latency-scorer latency-slo-admitter least-kv-cache-filter least-queue-filter load-aware-scorer lora-affinity-filter lora-affinity-scorer low-queue-filter max-score-picker no-hit-lru-scorer pd-profile-handler precise-prefix-cache-scorer predicted-latency-pd-decider prefill-cost-scorer prefill-filter prefix-based-pd-decider prefix-cache-affinity-filter prefix-cache-scorer queue-scorer random-picker running-requests-size-scorer saturation-filter single-profile-handler slo-aware-profile-handler slo-headroom-tier-filter softmax-picker speculative-prefix-recorder token-load-scorer topology-affinity-filter topology-affinity-scorer topology-extractor utilization-detector weighted-random-picker])`},
		{"an upstream type without an equivalent says why", "plugins: [{type: header-profile-handler}]", false, config.ErrUnsupportedType,
			`load config: plugin "header-profile-handler": unsupported upstream plugin type "header-profile-handler": kvroute picks a profile with single-profile-handler (one profile), or slo-aware-profile-handler (by x-prediction-based-scheduling); not by an arbitrary header`},
		{"an upstream parameter that would change behaviour is refused with the reason", "plugins: [{name: m, type: metrics-data-source, parameters: {scheme: https}}]", false, framework.ErrInvalidParams,
			`load config: invalid plugin parameters: plugin "m" (type metrics-data-source): parameter scheme: kvroute scrapes http://<endpoint>/metrics; another scheme cannot be set`},
		{"an unknown parameter of the approximate producer is still refused", "plugins: [{type: approx-prefix-cache-producer, parameters: {hashSeed: 1}}]", false, framework.ErrInvalidParams,
			`load config: invalid plugin parameters: plugin "approx-prefix-cache-producer" (type approx-prefix-cache-producer): unknown parameter "hashSeed" (known: autoTune, blockSize, blockSizeTokens, lruCapacityPerServer, maxPrefixBlocksToMatch, maxPrefixTokensToMatch)`},
		{"an unknown parameter of kvroute's own type of an upstream name is still refused", "plugins: [{name: p, type: precise-prefix-cache-scorer, parameters: {tierWeight: {gpu: 1}}}]", false, framework.ErrInvalidParams,
			`load config: invalid plugin parameters: plugin "p" (type precise-prefix-cache-scorer): json: unknown field "tierWeight"`},
		{"an unknown feature gate is named", "featureGates: [magic]", false, config.ErrUnknownFeatureGate,
			`load config: unknown feature gate "magic"`},
		{"a flow-control band naming an ordering kvroute lacks is refused with what it has", "featureGates: [flowControl]\nplugins: [{name: o, type: queue-scorer}]\nflowControl: {priorityBands: [{priority: 1, orderingPolicyRef: o}]}", false, config.ErrInvalid,
			`load config: invalid configuration: flowControl.priorityBands[0].orderingPolicyRef "o" (type queue-scorer): kvroute orders a flow by fcfs-ordering-policy or edf-ordering-policy`},
		{"a flow-control limit that is not a whole number is refused", "featureGates: [flowControl]\nflowControl: {maxRequests: 1.5}", false, config.ErrInvalid,
			`load config: invalid configuration: flowControl.maxRequests = 1500m, want a whole number ≥ 0`},
		{"a feature gate set to something else than a boolean is refused", "featureGates: [dataLayer=maybe]", false, config.ErrInvalid,
			`load config: invalid configuration: feature gate "dataLayer": "maybe" is not true or false`},
		{"a duplicate plugin name is named", "plugins: [{type: queue-scorer}, {type: queue-scorer}]", false, config.ErrDuplicateName,
			`load config: duplicate name: plugin "queue-scorer" is defined twice`},
		{"a duplicate profile name is named", `
plugins: [{type: queue-scorer}]
schedulingProfiles:
- {name: p, plugins: [{pluginRef: queue-scorer}]}
- {name: p, plugins: [{pluginRef: queue-scorer}]}`, false, config.ErrDuplicateName,
			`load config: duplicate name: scheduling profile "p" is defined twice`},
		{"a dangling pluginRef is named", `
plugins: [{type: queue-scorer}]
schedulingProfiles: [{name: p, plugins: [{pluginRef: queue}]}]`, false, config.ErrDanglingRef,
			`load config: scheduling profile "p": reference to an undefined plugin "queue"`},
		{"a profile without a picker is named when several pickers exist", `
plugins: [{type: queue-scorer}, {type: random-picker}, {type: max-score-picker}]
schedulingProfiles: [{name: p, plugins: [{pluginRef: queue-scorer}]}, {name: q, plugins: [{pluginRef: random-picker}, {pluginRef: queue-scorer}]}]`, false, config.ErrNoPicker,
			`load config: scheduling profile "p": profile has no picker (the config defines several pickers, so none is assumed)`},
		{"a profile with two pickers is refused", `
plugins: [{type: random-picker}, {type: max-score-picker}]
schedulingProfiles: [{name: p, plugins: [{pluginRef: random-picker}, {pluginRef: max-score-picker}]}]`, false, config.ErrInvalid,
			`load config: invalid configuration: scheduling profile "p" has two pickers, random-picker/random-picker and max-score-picker/max-score-picker`},
		{"a weight on a non-scorer is refused", `
plugins: [{type: random-picker}]
schedulingProfiles: [{name: p, plugins: [{pluginRef: random-picker, weight: 2}]}]`, false, config.ErrInvalid,
			`load config: invalid configuration: scheduling profile "p": plugin "random-picker" (type random-picker) has a weight but is not a scorer`},
		{"a negative weight is refused", `
plugins: [{type: queue-scorer}]
schedulingProfiles: [{name: p, plugins: [{pluginRef: queue-scorer, weight: -1}]}]`, false, config.ErrInvalid,
			`load config: invalid configuration: scheduling profile "p": scorer "queue-scorer" has weight -1, want a finite value ≥ 0`},
		{"a producer in a profile cannot have a weight", `
plugins: [{name: pp, type: approx-prefix-cache-producer}, {type: queue-scorer}]
schedulingProfiles: [{name: p, plugins: [{pluginRef: pp, weight: 2}, {pluginRef: queue-scorer}]}]`, false, config.ErrInvalid,
			`load config: invalid configuration: scheduling profile "p": plugin "pp" (type precise-prefix-cache-producer) has a weight but is not a scorer`},
		{"two profiles need a handler", `
plugins: [{type: queue-scorer}]
schedulingProfiles:
- {name: a, plugins: [{pluginRef: queue-scorer}]}
- {name: b, plugins: [{pluginRef: queue-scorer}]}`, false, config.ErrInvalid,
			`load config: invalid configuration: 2 scheduling profiles need a profile handler`},
		{"an unknown top-level field is refused", "plugin: []", false, config.ErrInvalid,
			`load config: invalid configuration: error unmarshaling JSON: while decoding JSON: json: unknown field "plugin"`},
		{"a plugin without a type is refused", "plugins: [{name: x}]", false, config.ErrInvalid,
			`load config: invalid configuration: plugin "x" has no type`},
		{"another apiVersion is refused", "apiVersion: inference.networking.x-k8s.io/v2", false, config.ErrInvalid,
			`load config: invalid configuration: apiVersion "inference.networking.x-k8s.io/v2", want "inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1" or "llm-d.ai/v1"`},
		{"another kind is refused", "kind: InferencePool", false, config.ErrInvalid,
			`load config: invalid configuration: kind "InferencePool", want "EndpointPickerConfig"`},
		{"a dataLayer discovery plugin is refused with the reason", "dataLayer: {discovery: {pluginRef: files}}", false, config.ErrInvalid,
			`load config: invalid configuration: dataLayer.discovery: use --endpoints-file, kvroute's static endpoints file, or Kubernetes discovery`},
		{"a data source that names no plugin is refused", "data: {sources: [{pluginRef: metrics}]}", false, config.ErrDanglingRef,
			`load config: data.sources: reference to an undefined plugin "metrics"`},
		{"an unknown field of the dataLayer section is refused", "dataLayer: {source: []}", false, config.ErrInvalid,
			`load config: invalid configuration: dataLayer: json: unknown field "source"`},
		{"a parser that names no plugin is refused", "parser: {pluginRef: openai}", false, config.ErrDanglingRef,
			`load config: parser: reference to an undefined plugin "openai"`},
		{"a saturation detector named and given inline is refused", "plugins: [{type: utilization-detector}]\nsaturationDetector: {pluginRef: utilization-detector, queueDepthThreshold: 3}", false, config.ErrInvalid,
			`load config: invalid configuration: saturationDetector names a plugin and gives thresholds; give one or the other`},
		{"a saturation detector must be a detector", "plugins: [{type: queue-scorer}]\nsaturationDetector: {pluginRef: queue-scorer}", false, config.ErrInvalid,
			`load config: invalid configuration: saturationDetector: plugin "queue-scorer" has type queue-scorer, want utilization-detector`},
		{"a dangling saturation detector is named", "saturationDetector: {pluginRef: det}", false, config.ErrDanglingRef,
			`load config: saturationDetector: reference to an undefined plugin "det"`},
		{"a recorder without a speculator is refused", "plugins: [{type: speculative-prefix-recorder}]", false, nil,
			`load config: plugin "speculative-prefix-recorder" (type speculative-prefix-recorder): this process records no speculative holdings (no speculator)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := registryWithProducer(t)
			if tt.noProd {
				r = config.NewInTreeRegistry()
			}
			_, err := r.Load([]byte(tt.text), nil)
			if err == nil {
				t.Fatal("Load succeeded")
			}
			if err.Error() != tt.wantMsg {
				t.Errorf("err = %s\nwant  %s", err, tt.wantMsg)
			}
			if tt.wantIs != nil && !errors.Is(err, tt.wantIs) {
				t.Errorf("err is not %v", tt.wantIs)
			}
		})
	}
}

func TestLoadFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "epp.yaml")
	if err := os.WriteFile(path, []byte(config.DefaultConfigText), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &config.Handle{Spec: schedtest.NopSpeculator{}}
	if _, err := config.NewInTreeRegistry().LoadFile(path, h); err != nil {
		t.Fatal(err)
	}
	_, err := config.NewInTreeRegistry().LoadFile(filepath.Join(dir, "missing.yaml"), h)
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err = %v, want ErrNotExist", err)
	}
}

func TestRegistryRefusesBadRegistrations(t *testing.T) {
	t.Parallel()
	f := func(string, json.RawMessage, framework.Handle) (plugin.Plugin, error) { return nil, nil }
	r := config.NewInTreeRegistry()
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"a type that is not kebab-case", r.Register("MyScorer", f), `invalid plugin registration: type "MyScorer" is not kebab-case`},
		{"a type registered twice", r.Register("queue-scorer", f), `invalid plugin registration: type "queue-scorer" registered twice`},
		{"a nil factory", r.Register("nil-scorer", nil), `invalid plugin registration: type "nil-scorer" has a nil factory`},
		{"an alias of nothing", r.RegisterAlias("q", "no-such-scorer"), `invalid plugin registration: alias "q" for unregistered type "no-such-scorer"`},
		{"a default producer of nothing", r.RegisterDefaultProducer("K", "no-such-producer"), `invalid plugin registration: default producer of "K" has unregistered type "no-such-producer"`},
	}
	for _, tt := range tests {
		if tt.err == nil || tt.err.Error() != tt.want || !errors.Is(tt.err, config.ErrRegistry) {
			t.Errorf("%s: err = %v, want %s", tt.name, tt.err, tt.want)
		}
	}
}

func TestHandleStalenessReachesThePlugins(t *testing.T) {
	t.Parallel()
	text := []byte("plugins: [{type: utilization-detector}, {type: queue-scorer}]")
	tests := []struct {
		name string
		h    framework.Handle
		// fresh is how old metrics can be and still count.
		staleAt, freshAt time.Duration
	}{
		{"no handle means 2s", nil, 3 * time.Second, time.Second},
		{"a nil *Handle means 2s", (*config.Handle)(nil), 3 * time.Second, time.Second},
		{"a zero staleness means 2s", &config.Handle{}, 3 * time.Second, time.Second},
		{"a configured staleness applies", &config.Handle{Staleness: 100 * time.Millisecond}, 200 * time.Millisecond, 50 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, err := config.NewInTreeRegistry().Load(text, tt.h)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1000, 0)
			cand := func(age time.Duration) []*datalayer.Candidate {
				return []*datalayer.Candidate{datalayer.NewCandidate(&datalayer.Endpoint{Name: "a"}, datalayer.Metrics{UpdateTime: now.Add(-age)}, datalayer.StreamExact)}
			}
			if !l.Detector.AllSaturated(cand(tt.staleAt), now) {
				t.Errorf("metrics %v old count as fresh", tt.staleAt)
			}
			if l.Detector.AllSaturated(cand(tt.freshAt), now) {
				t.Errorf("metrics %v old count as stale", tt.freshAt)
			}
		})
	}
}

func TestUpstreamApproxProducerTuningCarriesOver(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		params  string
		want    producer.Params
		wantErr string
	}{
		{"no parameters keep the producer's defaults", "", producer.DefaultParams(), ""},
		{"block size and match cap tune the approximate fallback",
			"{blockSizeTokens: 32, maxPrefixBlocksToMatch: 64, lruCapacityPerServer: 31250, autoTune: true}",
			producer.Params{DefaultBlockSizeTokens: 16, ApproxBlockSizeTokens: 32, ApproxMaxBlocks: 64}, ""},
		{"a token cap wins over a block cap, as upstream",
			"{blockSizeTokens: 16, maxPrefixBlocksToMatch: 64, maxPrefixTokensToMatch: 8192}",
			producer.Params{DefaultBlockSizeTokens: 16, ApproxBlockSizeTokens: 16, ApproxMaxBlocks: 512}, ""},
		{"approximate-index sizing is superseded", "{lruCapacityPerServer: 1000, autoTune: false, blockSize: 64}", producer.DefaultParams(), ""},
		{"a block size that is not a whole number is refused", "{blockSizeTokens: 1.5}", producer.Params{},
			`load config: plugin "approx" (type approx-prefix-cache-producer): blockSizeTokens is not a whole number: json: cannot unmarshal number 1.5 into Go value of type int`},
		{"a block size of zero keeps the default, as upstream", "{blockSizeTokens: 0}", producer.DefaultParams(), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			text := "plugins: [{name: approx, type: approx-prefix-cache-producer}]"
			if tt.params != "" {
				text = "plugins: [{name: approx, type: approx-prefix-cache-producer, parameters: " + tt.params + "}]"
			}
			r, last := registryCapturingParams(t)
			_, err := r.Load([]byte(text), nil)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v\nwant  %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := last(); got != tt.want {
				t.Errorf("producer params = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSpeculativeRecorderLoadsWithTheProcessSpeculator(t *testing.T) {
	t.Parallel()
	l, err := registryWithProducer(t).Load([]byte(`
plugins:
- type: precise-prefix-cache-scorer
- type: speculative-prefix-recorder
`), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"scorer:precise-prefix-cache-scorer/precise-prefix-cache-scorer*1",
		"picker:max-score-picker/max-score-picker",
		"postpick:speculative-prefix-recorder/speculative-prefix-recorder",
	}
	if got := shape(l.Profiles[0]); !equal(got, want) {
		t.Errorf("profile = %q, want %q", got, want)
	}
	if _, err := prepare.BuildGraph(l.Plugins); err != nil {
		t.Errorf("BuildGraph: %v", err)
	}
}

func TestBlockKeysKeyMatchesTheProducer(t *testing.T) {
	t.Parallel()
	if framework.RequestBlockKeysKey != producer.RequestBlockKeysKey {
		t.Fatalf("framework key %q, producer key %q", framework.RequestBlockKeysKey, producer.RequestBlockKeysKey)
	}
}

func TestSpeculativeIndexingAddsTheRecorder(t *testing.T) {
	t.Parallel()
	text := `
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-producer
  parameters: {speculativeIndexing: true, speculativeTTL: 2s, indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}}
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: a
  plugins: [{pluginRef: prefix-cache-scorer}, {pluginRef: max-score-picker}]
- name: b
  plugins: [{pluginRef: max-score-picker}]
- name: c
  plugins: [{pluginRef: max-score-picker}]
`
	// Two profiles need a handler; upstream would name one, and kvroute's
	// single-profile-handler runs the first.
	text = strings.Replace(text, "- type: max-score-picker\n", "- type: max-score-picker\n- type: single-profile-handler\n", 1)
	l, err := registryWithProducer(t).Load([]byte(text), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Profiles {
		got := shape(p)
		if last := got[len(got)-1]; last != "postpick:speculative-prefix-recorder/speculative-prefix-recorder" {
			t.Errorf("profile %s = %q, want the recorder last", p.Name, got)
		}
	}
	want := "speculativeIndexing (plugin precise-prefix-cache-producer): a speculative-prefix-recorder records each pick's blocks as held for the index's speculative TTL"
	if !slices.Contains(l.Notes, want) {
		t.Errorf("notes = %q, want %q", l.Notes, want)
	}
	if _, err := prepare.BuildGraph(l.Plugins); err != nil {
		t.Errorf("BuildGraph: %v", err)
	}

	_, err = registryWithProducer(t).Load([]byte(text), nil)
	if want := `load config: plugin "precise-prefix-cache-producer" asks for speculative indexing: plugin "speculative-prefix-recorder" (type speculative-prefix-recorder): this process records no speculative holdings (no speculator)`; err == nil || err.Error() != want {
		t.Errorf("without a speculator: err = %v, want %s", err, want)
	}
	_, err = registryWithProducer(t).Load([]byte(strings.Replace(text, "speculativeTTL: 2s", "speculativeTTL: 10s", 1)), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if want := `load config: invalid plugin parameters: plugin "precise-prefix-cache-producer" (type precise-prefix-cache-producer): parameter speculativeTTL: kvroute's index holds speculative entries for 2s, upstream's default; another TTL cannot be set`; err == nil || err.Error() != want {
		t.Errorf("another TTL: err = %v, want %s", err, want)
	}
}

func TestUpstreamNotesSayWhatIsSuperseded(t *testing.T) {
	t.Parallel()
	l, err := registryWithProducer(t).Load([]byte(`
featureGates: [prepareDataPlugins, dataLayer=false]
plugins:
- type: tokenizer
  parameters: {modelName: m}
- type: fcfs-ordering-policy
  parameters: {anything: 1}
- {name: q, type: queue-scorer}
- {name: p, type: prefix-cache-scorer, parameters: {hashBlockSize: 64, lruCapacityPerServer: 100}}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: tokenizer}, {pluginRef: q}, {pluginRef: p}]
`), &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"feature gate prepareDataPlugins: kvroute always runs its PrepareData producers",
		`plugin "tokenizer" (type tokenizer): kvroute tokenizes in process (--tokenizer) or with the model server's /tokenize; parameter modelName not needed`,
		`plugin "fcfs-ordering-policy" (type fcfs-ordering-policy): a flow-control policy, named by the flowControl section's priority bands (fcfs-ordering-policy, edf-ordering-policy, round-robin-fairness-policy, global-strict-fairness-policy; slo-deadline-ordering-policy as EDF) when the flowControl feature gate is on; eviction and usage-limit policies are kvroute's own: displacement of the lowest priority, release by prediction; parameter anything not needed`,
		`plugin "p" (type prefix-cache-scorer): parameter hashBlockSize: sizing of upstream's approximate prefix index, which the exact index needs none of (it keys each endpoint's blocks at the size its KV events name)`,
		fmt.Sprintf(`plugin "p" (type prefix-cache-scorer): parameter lruCapacityPerServer: kvroute's routing history keeps up to %d blocks per endpoint, upstream's default lruCapacityPerServer, whatever the file sets`, approx.DefaultCapacity),
	}
	if !slices.Equal(l.Notes, want) {
		t.Errorf("notes:\n%s\nwant:\n%s", strings.Join(l.Notes, "\n"), strings.Join(want, "\n"))
	}
	if l.FeatureGates["dataLayer"] || !l.FeatureGates["prepareDataPlugins"] {
		t.Errorf("gates = %v", l.FeatureGates)
	}
	if got := shape(l.Profiles[0]); !slices.Equal(got, []string{"scorer:q/queue-scorer*1", "scorer:p/prefix-cache-scorer*1", "picker:max-score-picker/max-score-picker", "postpick:p/prefix-cache-scorer"}) {
		t.Errorf("profile = %q", got)
	}
	// kvroute's own configuration says nothing.
	l, err = registryWithProducer(t).Load(nil, &config.Handle{Spec: schedtest.NopSpeculator{}})
	if err != nil || len(l.Notes) != 0 {
		t.Errorf("the default configuration: err %v, notes %q", err, l.Notes)
	}
}

func TestNamedConfigurationsLoad(t *testing.T) {
	t.Parallel()
	for name := range config.Named {
		text, err := config.NamedText(name)
		if err != nil {
			t.Fatal(err)
		}
		l, err := registryWithProducer(t).Load([]byte(text), &config.Handle{Spec: schedtest.NopSpeculator{}})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := prepare.BuildGraph(l.Plugins); err != nil {
			t.Errorf("%s: BuildGraph: %v", name, err)
		}
	}
	if _, err := config.NamedText("fastest"); err == nil || !strings.Contains(err.Error(), "upstream-weights") {
		t.Errorf("an unknown name: %v, want an error listing the known ones", err)
	}
}

func TestFlowControlSectionLoadsWithItsMeaning(t *testing.T) {
	t.Parallel()
	l, err := registryWithProducer(t).Load([]byte(`
featureGates: [flowControl]
plugins:
- {type: queue-scorer}
- {name: rr, type: round-robin-fairness-policy}
- {name: deadline, type: slo-deadline-ordering-policy}
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  maxBytes: 1Gi
  maxRequests: 2k
  defaultRequestTTL: 30s
  defaultPriorityBand: {maxRequests: 100, fairnessPolicyRef: rr}
  priorityBands:
  - {priority: 10, maxBytes: 500M, orderingPolicyRef: edf-ordering-policy, ttftTarget: 250ms}
  - {priority: -1, maxRequests: 50, orderingPolicyRef: deadline, fairnessPolicyRef: global-strict-fairness-policy}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := &config.FlowControl{
		MaxBytes: 1 << 30, MaxRequests: 2000, DefaultRequestTTL: 30 * time.Second,
		DefaultBand: config.FlowBand{MaxRequests: 100, Ordering: "fcfs-ordering-policy", Fairness: "round-robin-fairness-policy"},
		Bands: []config.FlowBand{
			{Priority: 10, MaxBytes: 500_000_000, Ordering: "edf-ordering-policy", Fairness: "global-strict-fairness-policy", TTFTTarget: 250 * time.Millisecond},
			{Priority: -1, MaxRequests: 50, Ordering: "edf-ordering-policy", Fairness: "global-strict-fairness-policy"},
		},
	}
	if !reflect.DeepEqual(l.FlowControl, want) {
		t.Fatalf("flow control = %+v\nwant %+v", l.FlowControl, want)
	}
	off, err := registryWithProducer(t).Load([]byte("flowControl: {maxRequests: 5}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if off.FlowControl != nil {
		t.Fatal("a flowControl section without its feature gate turned flow control on")
	}
	for _, bad := range []string{"soon", "-1s", "250"} {
		_, err := registryWithProducer(t).Load([]byte("featureGates: [flowControl]\nflowControl:\n  priorityBands:\n  - {priority: 1, ttftTarget: \""+bad+"\"}\n"), nil)
		if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "flowControl.priorityBands[0].ttftTarget") {
			t.Errorf("ttftTarget %q: %v, want ErrInvalid naming the field", bad, err)
		}
	}
}

// Upstream's prefix-cache-scorer places by its routing history where the
// approximate producer feeds it, and by the KV events alone beside the
// precise producer or in llm-d's cache_tracking mode: each file loads
// with the routing history as upstream's runs it.
func TestAnUpstreamPrefixScorerKeepsARoutingHistoryOnlyWhereUpstreamsDoes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		text    string
		history bool
		note    string
	}{
		{"alone, as the chart writes it", "plugins: [{type: prefix-cache-scorer}]", true, ""},
		{"beside the approximate producer", "plugins: [{type: approx-prefix-cache-producer}, {type: prefix-cache-scorer}]", true, ""},
		{"beside the precise producer", "plugins: [{type: precise-prefix-cache-producer}, {type: prefix-cache-scorer}]", false,
			`plugin "prefix-cache-scorer" (type prefix-cache-scorer): beside precise-prefix-cache-producer it scores the KV events' answers alone, without the routing history, as upstream's does`},
		{"beside the precise producer, the history asked for", "plugins: [{type: precise-prefix-cache-producer}, {type: prefix-cache-scorer, parameters: {routingHistory: true}}]", true, ""},
		{"in llm-d's estimate mode", "plugins: [{type: prefix-cache-scorer, parameters: {mode: estimate}}]", true, ""},
		{"in llm-d's cache_tracking mode", "plugins: [{type: prefix-cache-scorer, parameters: {mode: cache_tracking}}]", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l, err := registryWithProducer(t).Load([]byte(tt.text), &config.Handle{Spec: schedtest.NopSpeculator{}})
			if err != nil {
				t.Fatal(err)
			}
			records := slices.Contains(shape(l.Profiles[0]), "postpick:prefix-cache-scorer/prefix-cache-scorer")
			reads := false
			for _, p := range l.Plugins {
				if c, ok := p.(plugin.Consumer); ok && p.TypedName().Name == "prefix-cache-scorer" {
					_, reads = c.Consumes()[datalayer.RoutedPrefixKey]
				}
			}
			if records != tt.history || reads != tt.history {
				t.Errorf("records picks %v, reads the routing history %v; want both %v", records, reads, tt.history)
			}
			if tt.note != "" && !slices.Contains(l.Notes, tt.note) {
				t.Errorf("notes %q lack %q", l.Notes, tt.note)
			}
			if _, err := prepare.BuildGraph(l.Plugins); err != nil {
				t.Errorf("BuildGraph: %v", err)
			}
		})
	}
}
