// Package config loads an EndpointPickerConfig, the upstream EPP's YAML
// shape, into scheduler profiles: it keeps a registry of plugin types and
// their factories, instantiates the configured plugins with strictly
// decoded parameters, applies upstream's defaults, and refuses at start-up
// anything it cannot honour, naming what is wrong.
package config

import (
	"encoding/json"
	"fmt"
	"sort"
)

// The apiVersion and kind written (either may be left out). APIVersionLLMD
// is the same schema under llm-d-router's group, and APIVersionLLMDV1 the
// version llm-d's current guides write; all are accepted alike.
const (
	APIVersion       = "inference.networking.x-k8s.io/v1alpha1"
	APIVersionLLMD   = "llm-d.ai/v1alpha1"
	APIVersionLLMDV1 = "llm-d.ai/v1"
	Kind             = "EndpointPickerConfig"
)

// DefaultProfileName is the profile made when the config defines none.
const DefaultProfileName = "default"

// EndpointPickerConfig is the configuration file, in the upstream shape.
type EndpointPickerConfig struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind,omitempty"`
	// FeatureGates are gate names, or name=true and name=false.
	FeatureGates []string `json:"featureGates,omitempty"`
	// Plugins are the plugin instances, each made once and shared by every
	// profile that refers to it.
	Plugins            []PluginSpec        `json:"plugins,omitempty"`
	SchedulingProfiles []SchedulingProfile `json:"schedulingProfiles,omitempty"`
	// SaturationDetector names the utilization-detector instance admission
	// uses; the default one when absent.
	SaturationDetector *SaturationDetectorConfig `json:"saturationDetector,omitempty"`

	// Upstream sections for what kvroute configures with its flags (see
	// compat_sections.go): accepted where kvroute does the same itself,
	// refused where it cannot.
	Data           json.RawMessage `json:"data,omitempty"`
	DataLayer      json.RawMessage `json:"dataLayer,omitempty"`
	FlowControl    json.RawMessage `json:"flowControl,omitempty"`
	Parser         json.RawMessage `json:"parser,omitempty"`
	RequestHandler json.RawMessage `json:"requestHandler,omitempty"`
}

// PluginSpec is one plugin instance. Name defaults to Type.
type PluginSpec struct {
	Name       string          `json:"name,omitempty"`
	Type       string          `json:"type"`
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// SchedulingProfile is a named list of plugin references.
type SchedulingProfile struct {
	Name    string             `json:"name"`
	Plugins []SchedulingPlugin `json:"plugins"`
}

// SchedulingPlugin refers to a plugin instance from a profile. Weight applies
// to scorers only; a scorer without one weighs 1.
type SchedulingPlugin struct {
	PluginRef string   `json:"pluginRef"`
	Weight    *float64 `json:"weight,omitempty"`
}

// PluginRef names a plugin instance.
type PluginRef struct {
	PluginRef string `json:"pluginRef"`
}

// DefaultConfigText is the configuration the EPP runs when given none:
// predicted latency. The predicted-latency producer (added as the default
// producer of the latency data the plugins consume, and reading the exact
// prefix producer's per-tier matches) predicts each candidate's TTFT; the
// latency-scorer prefers the least predicted p90 (use: quantile: the tail
// each pick risks, which the mean under-prices where a burst meets a full
// batch), its own prefill weighted by how full the endpoint's KV cache
// is; a request with an SLO goes to an endpoint
// predicted to meet it when one is, and a sheddable one none is predicted
// to meet is refused. The speculative recorder lets a burst of one prefix
// follow the first pick before its KV events arrive. It was the best
// policy measured, in real and virtual time and in the seed studies
// (docs/routing-benchmark.md, docs/results/).
//
// In a pool with prefill pods (llm-d.ai/role prefill), the same profile
// picks the decode pod among the pods that decode, and the
// predicted-latency-pd-decider sends a request's prefill to the prefill
// pod of least predicted latency when that, with the KV transfer, is
// predicted to cost less than the decode pod's own prefill, whose cost
// includes the stall it imposes on the sequences decoding there. A pool
// without prefill pods runs the default profile alone.
const DefaultConfigText = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: decode-filter
- type: prefill-filter
- type: slo-headroom-tier-filter
- type: latency-scorer
  parameters:
    use: quantile
- type: latency-slo-admitter
- type: speculative-prefix-recorder
- type: predicted-latency-pd-decider
- type: disagg-profile-handler
  parameters:
    profiles:
      decode: default
      prefill: prefill
    deciders:
      prefill: predicted-latency-pd-decider
    onlyWithPrefillPods: true
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: decode-filter
  - pluginRef: slo-headroom-tier-filter
  - pluginRef: latency-scorer
  - pluginRef: speculative-prefix-recorder
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: latency-scorer
  - pluginRef: speculative-prefix-recorder
`

// UpstreamWeightsConfigText is upstream's default profile (prefix 3, queue
// 2, KV usage 2) with kvroute's precise prefix scorer in place of
// upstream's approximate one, and the speculative recorder: the default
// before the latency predictor, kept for users who tuned around those
// weights.
const UpstreamWeightsConfigText = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: speculative-prefix-recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: speculative-prefix-recorder
`

// PrefillCostConfigText scores by the estimated prefill work a pick adds
// and finds queued there (the exact index's uncached tokens plus the
// queue), with no predictor.
const PrefillCostConfigText = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-cost-scorer
- type: speculative-prefix-recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefill-cost-scorer
    weight: 1
  - pluginRef: speculative-prefix-recorder
`

// PrecisePrefixConfigText scores by the exact index alone (plus the
// speculative recorder): the cache, and nothing of load.
const PrecisePrefixConfigText = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: precise-prefix-cache-scorer
- type: speculative-prefix-recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: precise-prefix-cache-scorer
    weight: 1
  - pluginRef: speculative-prefix-recorder
`

// Named are the configurations a user can pick by name (cmd/epp's
// --config-name) rather than write; docs/plugins.md describes each.
var Named = map[string]string{
	"predicted-latency": DefaultConfigText,
	"upstream-weights":  UpstreamWeightsConfigText,
	"prefill-cost":      PrefillCostConfigText,
	"precise-prefix":    PrecisePrefixConfigText,
}

// NamedText is the configuration called name.
func NamedText(name string) (string, error) {
	if text, ok := Named[name]; ok {
		return text, nil
	}
	names := make([]string, 0, len(Named))
	for n := range Named {
		names = append(names, n)
	}
	sort.Strings(names)
	return "", fmt.Errorf("%w: no configuration named %q (known: %v)", ErrInvalid, name, names)
}
