package config

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

// Flow-control policy types, as upstream names them.
const (
	fcfsOrdering         = "fcfs-ordering-policy"
	edfOrdering          = "edf-ordering-policy"
	sloDeadlineOrdering  = "slo-deadline-ordering-policy"
	roundRobinFairness   = "round-robin-fairness-policy"
	globalStrictFairness = "global-strict-fairness-policy"
)

// FlowControl is upstream's flowControl section as loaded: limits, the
// default TTL and the priority bands with their policies resolved to
// type names (fcfs-ordering-policy or edf-ordering-policy;
// round-robin-fairness-policy or global-strict-fairness-policy). Zero
// limits are none (global) or upstream's defaults (per band).
type FlowControl struct {
	MaxBytes          int64
	MaxRequests       int64
	DefaultRequestTTL time.Duration
	DefaultBand       FlowBand
	Bands             []FlowBand
}

// FlowBand is one priority band of FlowControl.
type FlowBand struct {
	Priority    int
	MaxBytes    int64
	MaxRequests int64
	Ordering    string
	Fairness    string
	// TTFTTarget (kvroute's own field, ttftTarget) releases a waiting
	// request without a TTFT SLO once some endpoint is predicted to give
	// it a first token within this; zero leaves such requests to the
	// saturation test.
	TTFTTarget time.Duration
}

type flowControlSection struct {
	MaxBytes                  *resource.Quantity `json:"maxBytes,omitempty"`
	MaxRequests               *resource.Quantity `json:"maxRequests,omitempty"`
	DefaultRequestTTL         string             `json:"defaultRequestTTL,omitempty"`
	DefaultPriorityBand       *flowBandSection   `json:"defaultPriorityBand,omitempty"`
	PriorityBands             []flowBandSection  `json:"priorityBands,omitempty"`
	UsageLimitPolicyPluginRef string             `json:"usageLimitPolicyPluginRef,omitempty"`
	SaturationDetector        *PluginRef         `json:"saturationDetector,omitempty"`
}

type flowBandSection struct {
	Priority          int                `json:"priority"`
	MaxBytes          *resource.Quantity `json:"maxBytes,omitempty"`
	MaxRequests       *resource.Quantity `json:"maxRequests,omitempty"`
	FairnessPolicyRef string             `json:"fairnessPolicyRef,omitempty"`
	OrderingPolicyRef string             `json:"orderingPolicyRef,omitempty"`
	TTFTTarget        string             `json:"ttftTarget,omitempty"`
}

// loadFlowControl reads the flowControl section of a configuration whose
// flowControl gate is on.
func loadFlowControl(cfg *EndpointPickerConfig, l *Loaded) error {
	fc := &FlowControl{DefaultBand: FlowBand{Ordering: fcfsOrdering, Fairness: globalStrictFairness}}
	l.FlowControl = fc
	if isNullOrEmpty(cfg.FlowControl) {
		return nil
	}
	var s flowControlSection
	if err := strictJSON(cfg.FlowControl, &s); err != nil {
		return fmt.Errorf("%w: flowControl: %w", ErrInvalid, err)
	}
	var err error
	if fc.MaxBytes, err = quantity("flowControl.maxBytes", s.MaxBytes); err != nil {
		return err
	}
	if fc.MaxRequests, err = quantity("flowControl.maxRequests", s.MaxRequests); err != nil {
		return err
	}
	if s.DefaultRequestTTL != "" {
		d, err := time.ParseDuration(s.DefaultRequestTTL)
		if err != nil || d < 0 {
			return fmt.Errorf("%w: flowControl.defaultRequestTTL = %q, want a duration ≥ 0", ErrInvalid, s.DefaultRequestTTL)
		}
		fc.DefaultRequestTTL = d
	}
	types := map[string]string{}
	for _, p := range cfg.Plugins {
		name := p.Name
		if name == "" {
			name = p.Type
		}
		types[name] = p.Type
	}
	if s.DefaultPriorityBand != nil {
		if fc.DefaultBand, err = flowBand("flowControl.defaultPriorityBand", *s.DefaultPriorityBand, types); err != nil {
			return err
		}
	}
	seen := map[int]bool{}
	for i, b := range s.PriorityBands {
		if seen[b.Priority] {
			return fmt.Errorf("%w: flowControl.priorityBands[%d]: priority %d configured twice", ErrInvalid, i, b.Priority)
		}
		seen[b.Priority] = true
		band, err := flowBand(fmt.Sprintf("flowControl.priorityBands[%d]", i), b, types)
		if err != nil {
			return err
		}
		fc.Bands = append(fc.Bands, band)
	}
	if ref := s.UsageLimitPolicyPluginRef; ref != "" {
		if _, ok := types[ref]; !ok {
			return fmt.Errorf("flowControl.usageLimitPolicyPluginRef: %w %q", ErrDanglingRef, ref)
		}
		l.note(fmt.Sprintf("flowControl.usageLimitPolicyPluginRef %s: kvroute releases a waiting request when some endpoint is predicted to serve it in time, or is not saturated; no usage ceiling gates a band", ref))
	}
	if s.SaturationDetector != nil && s.SaturationDetector.PluginRef != "" {
		if _, ok := types[s.SaturationDetector.PluginRef]; !ok {
			return fmt.Errorf("flowControl.saturationDetector: %w %q", ErrDanglingRef, s.SaturationDetector.PluginRef)
		}
	}
	return nil
}

func flowBand(field string, b flowBandSection, types map[string]string) (FlowBand, error) {
	out := FlowBand{Priority: b.Priority, Ordering: fcfsOrdering, Fairness: globalStrictFairness}
	var err error
	if out.MaxBytes, err = quantity(field+".maxBytes", b.MaxBytes); err != nil {
		return out, err
	}
	if out.MaxRequests, err = quantity(field+".maxRequests", b.MaxRequests); err != nil {
		return out, err
	}
	if b.TTFTTarget != "" {
		d, err := time.ParseDuration(b.TTFTTarget)
		if err != nil || d < 0 {
			return out, fmt.Errorf("%w: %s.ttftTarget = %q, want a duration ≥ 0", ErrInvalid, field, b.TTFTTarget)
		}
		out.TTFTTarget = d
	}
	if b.OrderingPolicyRef != "" {
		switch t := policyType(b.OrderingPolicyRef, types); t {
		case fcfsOrdering, edfOrdering:
			out.Ordering = t
		case sloDeadlineOrdering:
			// kvroute's EDF deadline is the arrival plus the TTFT SLO.
			out.Ordering = edfOrdering
		default:
			return out, fmt.Errorf("%w: %s.orderingPolicyRef %q (type %s): kvroute orders a flow by %s or %s",
				ErrInvalid, field, b.OrderingPolicyRef, t, fcfsOrdering, edfOrdering)
		}
	}
	if b.FairnessPolicyRef != "" {
		switch t := policyType(b.FairnessPolicyRef, types); t {
		case roundRobinFairness, globalStrictFairness:
			out.Fairness = t
		default:
			return out, fmt.Errorf("%w: %s.fairnessPolicyRef %q (type %s): kvroute serves flows by %s or %s",
				ErrInvalid, field, b.FairnessPolicyRef, t, roundRobinFairness, globalStrictFairness)
		}
	}
	return out, nil
}

// policyType is the type of the plugin ref names, or ref itself when no
// plugin has that name: upstream's defaults are referred to by type.
func policyType(ref string, types map[string]string) string {
	if t, ok := types[ref]; ok {
		return t
	}
	return ref
}

func quantity(field string, q *resource.Quantity) (int64, error) {
	if q == nil {
		return 0, nil
	}
	v, ok := q.AsInt64()
	if !ok || v < 0 {
		return 0, fmt.Errorf("%w: %s = %s, want a whole number ≥ 0", ErrInvalid, field, q.String())
	}
	return v, nil
}
