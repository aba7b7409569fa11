package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The upstream configuration's sections beyond plugins and profiles, across
// its versions: feature gates (plain names, or name=true/false since
// llm-d-router v0.10), the saturation detector (inline thresholds in GIE
// v1.3 and v1.4, a plugin reference since), the data layer (data in GIE
// v1.3 and v1.4, dataLayer since), flow control, and the request parsers
// (parser in GIE v1.5, requestHandler.parsers in llm-d-router).

// The upstream feature gates.
const (
	FlowControlGate        = "flowControl"
	PrepareDataPluginsGate = "prepareDataPlugins"
	EnableLegacyMetrics    = "enableLegacyMetrics"
	HAPopulateNonLeader    = "haPopulateNonLeaderDatastore"
)

// upstreamGates are the feature gates upstream registers, with what kvroute
// makes of each being on (DataLayerGate is registered as kvroute's own).
var upstreamGates = map[string]struct {
	class Class
	why   string
}{
	PrepareDataPluginsGate: {Superseded, "kvroute always runs its PrepareData producers"},
	EnableLegacyMetrics:    {Superseded, "kvroute scrapes each endpoint's metrics itself"},
	HAPopulateNonLeader:    {Superseded, "every kvroute replica keeps its datastore and index and serves picks, leader or not"},
	FlowControlGate:        {Honoured, ""},
}

// parseGate splits "name", "name=true" or "name=false".
func parseGate(s string) (name string, on bool, err error) {
	name, val, hasVal := strings.Cut(strings.TrimSpace(s), "=")
	if !hasVal {
		return name, true, nil
	}
	on, err = strconv.ParseBool(strings.TrimSpace(val))
	if err != nil {
		return name, false, fmt.Errorf("%w: feature gate %q: %q is not true or false", ErrInvalid, name, val)
	}
	return name, on, nil
}

// loadGates reads the feature gates into l, refusing unknown ones and
// those kvroute cannot honour.
func (r *Registry) loadGates(gates []string, l *Loaded) error {
	for _, g := range gates {
		name, on, err := parseGate(g)
		if err != nil {
			return err
		}
		u, upstream := upstreamGates[name]
		if !r.knownGate(name) && !upstream {
			return fmt.Errorf("%w %q", ErrUnknownFeatureGate, name)
		}
		l.FeatureGates[name] = on
		if !on || !upstream {
			continue
		}
		switch u.class {
		case Refused:
			return fmt.Errorf("%w: feature gate %q: %s", ErrInvalid, name, u.why)
		case Superseded:
			l.note(fmt.Sprintf("feature gate %s: %s", name, u.why))
		}
	}
	return nil
}

// SaturationDetectorConfig names the utilization-detector instance admission
// uses (pluginRef), or, as GIE v1.3 and v1.4 wrote it, gives its thresholds
// inline.
type SaturationDetectorConfig struct {
	PluginRef                 string          `json:"pluginRef,omitempty"`
	QueueDepthThreshold       json.RawMessage `json:"queueDepthThreshold,omitempty"`
	KVCacheUtilThreshold      json.RawMessage `json:"kvCacheUtilThreshold,omitempty"`
	MetricsStalenessThreshold json.RawMessage `json:"metricsStalenessThreshold,omitempty"`
}

// inline returns the inline thresholds as a utilization-detector's
// parameters, or nil when there are none.
func (s *SaturationDetectorConfig) inline() json.RawMessage {
	if s == nil {
		return nil
	}
	m := map[string]json.RawMessage{}
	for k, v := range map[string]json.RawMessage{
		"queueDepthThreshold":       s.QueueDepthThreshold,
		"kvCacheUtilThreshold":      s.KVCacheUtilThreshold,
		"metricsStalenessThreshold": s.MetricsStalenessThreshold,
	} {
		if len(bytes.TrimSpace(v)) > 0 {
			m[k] = v
		}
	}
	if len(m) == 0 {
		return nil
	}
	b, _ := json.Marshal(m)
	return b
}

// dataLayerConfig is upstream's data layer section.
type dataLayerConfig struct {
	InjectDefaults *bool `json:"injectDefaults,omitempty"`
	Sources        []struct {
		PluginRef  string `json:"pluginRef"`
		Extractors []struct {
			PluginRef string `json:"pluginRef"`
		} `json:"extractors,omitempty"`
	} `json:"sources,omitempty"`
	Discovery                   *PluginRef      `json:"discovery,omitempty"`
	PeerDiscovery               *PluginRef      `json:"peerDiscovery,omitempty"`
	CrossReplicaSyncerPluginRef string          `json:"crossReplicaSyncerPluginRef,omitempty"`
	CrossReplicaSyncInterval    json.RawMessage `json:"crossReplicaSyncInterval,omitempty"`
}

// requestHandlerConfig is llm-d-router's request handler section.
type requestHandlerConfig struct {
	Parsers []PluginRef `json:"parsers,omitempty"`
}

// loadSections checks the upstream sections against the plugins loaded,
// noting what kvroute does itself and refusing what it cannot do.
func (r *Registry) loadSections(cfg *EndpointPickerConfig, h *loadHandle, l *Loaded) error {
	for _, sec := range []struct {
		field string
		raw   json.RawMessage
	}{{"data", cfg.Data}, {"dataLayer", cfg.DataLayer}} {
		if isNullOrEmpty(sec.raw) {
			continue
		}
		var dl dataLayerConfig
		if err := strictJSON(sec.raw, &dl); err != nil {
			return fmt.Errorf("%w: %s: %w", ErrInvalid, sec.field, err)
		}
		switch {
		case dl.Discovery != nil:
			return fmt.Errorf("%w: %s.discovery: %s", ErrInvalid, sec.field, "use --endpoints-file, kvroute's static endpoints file, or Kubernetes discovery")
		case dl.PeerDiscovery != nil, dl.CrossReplicaSyncerPluginRef != "", len(dl.CrossReplicaSyncInterval) > 0:
			return fmt.Errorf("%w: %s: %s", ErrInvalid, sec.field, "kvroute replicas each follow every pod's KV events; no state is synced between them")
		}
		for _, s := range dl.Sources {
			refs := []string{s.PluginRef}
			for _, x := range s.Extractors {
				refs = append(refs, x.PluginRef)
			}
			for _, ref := range refs {
				if _, ok := h.byName[ref]; !ok {
					return fmt.Errorf("%s.sources: %w %q", sec.field, ErrDanglingRef, ref)
				}
			}
		}
		l.note(fmt.Sprintf("section %s: %s", sec.field, whyScrape))
	}
	if l.FeatureGates[FlowControlGate] {
		if err := loadFlowControl(cfg, l); err != nil {
			return err
		}
	} else if !isNullOrEmpty(cfg.FlowControl) {
		l.note("section flowControl: upstream runs flow control only with the flowControl feature gate, which this file leaves off")
	}
	var parsers []PluginRef
	if !isNullOrEmpty(cfg.Parser) {
		var p PluginRef
		if err := strictJSON(cfg.Parser, &p); err != nil {
			return fmt.Errorf("%w: parser: %w", ErrInvalid, err)
		}
		parsers = append(parsers, p)
	}
	if !isNullOrEmpty(cfg.RequestHandler) {
		var rh requestHandlerConfig
		if err := strictJSON(cfg.RequestHandler, &rh); err != nil {
			return fmt.Errorf("%w: requestHandler: %w", ErrInvalid, err)
		}
		parsers = append(parsers, rh.Parsers...)
	}
	for _, p := range parsers {
		if _, ok := h.byName[p.PluginRef]; !ok {
			return fmt.Errorf("parser: %w %q", ErrDanglingRef, p.PluginRef)
		}
	}
	return nil
}

func strictJSON(raw json.RawMessage, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(dst)
}
