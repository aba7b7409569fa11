// Package config loads an EndpointPickerConfig, the upstream EPP's YAML
// shape, into scheduler profiles: it keeps a registry of plugin types and
// their factories, instantiates the configured plugins with strictly
// decoded parameters, applies upstream's defaults, and refuses at start-up
// anything it cannot honour, naming what is wrong.
package config

import "encoding/json"

// The apiVersion and kind written (either may be left out). APIVersionLLMD
// is the same schema under llm-d-router's group, accepted alike.
const (
	APIVersion     = "inference.networking.x-k8s.io/v1alpha1"
	APIVersionLLMD = "llm-d.ai/v1alpha1"
	Kind           = "EndpointPickerConfig"
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
// upstream's default profile (prefix 3, queue 2, KV usage 2) with kvroute's
// precise prefix scorer in place of upstream's approximate one, and the
// speculative recorder, so that a burst of same-prefix requests follows the
// first pick before its KV events arrive.
const DefaultConfigText = `apiVersion: inference.networking.x-k8s.io/v1alpha1
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
