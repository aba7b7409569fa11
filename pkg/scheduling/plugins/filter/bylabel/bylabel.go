// Package bylabel holds the filters that keep endpoints by their pod's
// labels: by-label (one label, a set of values), label-selector-filter (a
// Kubernetes label selector), and the role filters of disaggregated
// deployments (decode-filter, prefill-filter, encode-filter), which keep the
// pods whose llm-d.ai/role label says they serve that stage.
package bylabel

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// The registered type names.
const (
	Type         = "by-label"
	SelectorType = "label-selector-filter"
	// SelectorAlias is the selector filter's older name.
	SelectorAlias = "by-label-selector"
	DecodeType    = "decode-filter"
	PrefillType   = "prefill-filter"
	EncodeType    = "encode-filter"
)

// RoleLabel is the pod label naming the stages a pod serves.
const RoleLabel = datalayer.RoleLabel

// The role label's values: a single stage, or the stages a pod combines.
const (
	RoleDecode              = "decode"
	RolePrefill             = "prefill"
	RoleEncode              = "encode"
	RolePrefillDecode       = "prefill-decode"
	RoleEncodePrefill       = "encode-prefill"
	RoleEncodePrefillDecode = "encode-prefill-decode"
	RoleBoth                = "both"
)

// Filter keeps the endpoints whose label has one of the valid values, and,
// when allowed, those without the label.
type Filter struct {
	name          plugin.TypedName
	label         string
	valid         map[string]bool
	allowsNoLabel bool
	// roles, for a role filter, are the roles it keeps any of: the
	// datastore's parsed role spares a label lookup per candidate.
	roles datalayer.Role
}

var _ framework.Filter = (*Filter)(nil)

// New makes a filter of type typ.
func New(typ, name, label string, allowsNoLabel bool, valid ...string) *Filter {
	f := &Filter{name: plugin.TypedName{Type: typ, Name: name}, label: label, valid: map[string]bool{}, allowsNoLabel: allowsNoLabel}
	for _, v := range valid {
		f.valid[v] = true
	}
	return f
}

// Params are by-label's parameters.
type Params struct {
	Label         string   `json:"label"`
	ValidValues   []string `json:"validValues"`
	AllowsNoLabel bool     `json:"allowsNoLabel"`
}

// Factory makes a by-label filter.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	if p.Label == "" {
		return nil, framework.ParamError(Type, name, "label must be given")
	}
	if len(p.ValidValues) == 0 && !p.AllowsNoLabel {
		return nil, framework.ParamError(Type, name, "validValues is empty and allowsNoLabel false: the filter would keep nothing")
	}
	return New(Type, name, p.Label, p.AllowsNoLabel, p.ValidValues...), nil
}

// DecodeFactory makes the decode-filter: pods serving decode, alone or with
// other stages, and pods without a role label (a deployment that does not
// disaggregate serves every stage everywhere).
func DecodeFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	if err := noParams(DecodeType, name, raw); err != nil {
		return nil, err
	}
	return roleFilter(New(DecodeType, name, RoleLabel, true, RoleDecode, RolePrefillDecode, RoleBoth, RoleEncodePrefillDecode), datalayer.RoleDecode|datalayer.RoleUnlabelled), nil
}

// PrefillFactory makes the prefill-filter: pods serving prefill.
func PrefillFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	if err := noParams(PrefillType, name, raw); err != nil {
		return nil, err
	}
	return roleFilter(New(PrefillType, name, RoleLabel, false, RolePrefill, RoleEncodePrefill, RolePrefillDecode, RoleBoth, RoleEncodePrefillDecode), datalayer.RolePrefill), nil
}

// EncodeFactory makes the encode-filter: pods serving the multimodal
// encoder stage.
func EncodeFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	if err := noParams(EncodeType, name, raw); err != nil {
		return nil, err
	}
	return roleFilter(New(EncodeType, name, RoleLabel, false, RoleEncode, RoleEncodePrefill, RoleEncodePrefillDecode), datalayer.RoleEncode), nil
}

func noParams(typ, name string, raw json.RawMessage) error {
	var p struct{}
	return framework.DecodeParams(typ, name, raw, &p)
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

func roleFilter(f *Filter, roles datalayer.Role) *Filter {
	f.roles = roles
	return f
}

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	if f.roles != 0 {
		// Written whole before it is read; the candidates' memory outlives
		// the profile, which keeps nothing of what it filtered.
		out := datalayer.RequestMemoryOverwritten[*datalayer.Candidate](cands, f, len(cands))[:0]
		for _, c := range cands {
			if c.Role()&f.roles != 0 {
				out = append(out, c)
			}
		}
		return out
	}
	out := cands[:0:0]
	for _, c := range cands {
		v, ok := c.Labels[f.label]
		if (!ok && f.allowsNoLabel) || (ok && f.valid[v]) {
			out = append(out, c)
		}
	}
	return out
}

// Selector keeps the endpoints whose labels a Kubernetes label selector
// matches.
type Selector struct {
	name plugin.TypedName
	sel  labels.Selector
}

var _ framework.Filter = (*Selector)(nil)

// SelectorFactory makes a label-selector-filter; its parameters are a
// Kubernetes LabelSelector (matchLabels, matchExpressions).
func SelectorFactory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p metav1.LabelSelector
	if err := framework.DecodeParams(SelectorType, name, raw, &p); err != nil {
		return nil, err
	}
	sel, err := metav1.LabelSelectorAsSelector(&p)
	if err != nil {
		return nil, framework.ParamError(SelectorType, name, "%v", err)
	}
	return &Selector{name: plugin.TypedName{Type: SelectorType, Name: name}, sel: sel}, nil
}

// TypedName implements plugin.Plugin.
func (s *Selector) TypedName() plugin.TypedName { return s.name }

// Filter implements framework.Filter.
func (s *Selector) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	out := cands[:0:0]
	for _, c := range cands {
		if s.sel.Matches(labels.Set(c.Labels)) {
			out = append(out, c)
		}
	}
	return out
}

// String describes the selector, for errors and /debug output.
func (s *Selector) String() string { return fmt.Sprintf("%s(%s)", s.name, s.sel) }

// ServesPrefill reports whether a pod's role is one prefill-filter keeps.
func ServesPrefill(r datalayer.Role) bool { return r&datalayer.RolePrefill != 0 }

// PrefillOnly reports whether a pod's role makes it a prefill pod that does
// not decode: a pool with such pods disaggregates.
func PrefillOnly(r datalayer.Role) bool {
	return r&datalayer.RolePrefill != 0 && r&datalayer.RoleDecode == 0
}
