// Package decisiontree is the decision-tree-filter of the upstream EPP's
// first scheduler: it runs one filter and then, depending on whether that
// left any endpoint, another filter (or tree) on what it left or on what it
// was given.
package decisiontree

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "decision-tree-filter"

// Tree runs Current; when it keeps some endpoints, NextOnSuccess (or
// NextOnSuccessOrFailure) filters them further; when it keeps none,
// NextOnFailure (or NextOnSuccessOrFailure) filters the endpoints Current
// was given. Without a next filter for the outcome, Current's result stands.
type Tree struct {
	name                 plugin.TypedName
	current              framework.Filter
	onSuccess, onFailure framework.Filter
	onSuccessOrFailure   framework.Filter
}

var _ framework.Filter = (*Tree)(nil)

// Params are the tree's parameters, recursively.
type Params struct {
	Current                *Entry `json:"current"`
	NextOnSuccess          *Entry `json:"nextOnSuccess,omitempty"`
	NextOnFailure          *Entry `json:"nextOnFailure,omitempty"`
	NextOnSuccessOrFailure *Entry `json:"nextOnSuccessOrFailure,omitempty"`
}

// Entry names a filter instance defined earlier in the configuration, or is
// a tree of its own.
type Entry struct {
	PluginRef    *string `json:"pluginRef,omitempty"`
	DecisionTree *Params `json:"decisionTree,omitempty"`
}

// Factory makes a tree; the filters it names must be defined before it.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	t, err := build(name, &p, h, 0)
	if err != nil {
		return nil, framework.ParamError(Type, name, "%v", err)
	}
	return t, nil
}

// maxDepth bounds nesting, so that a configuration cannot recurse without end.
const maxDepth = 32

func build(name string, p *Params, h framework.Handle, depth int) (*Tree, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("trees nested more than %d deep", maxDepth)
	}
	if p.Current == nil {
		return nil, errors.New("a tree needs a current filter")
	}
	t := &Tree{name: plugin.TypedName{Type: Type, Name: name}}
	var err error
	for _, e := range []struct {
		entry *Entry
		dst   *framework.Filter
	}{{p.Current, &t.current}, {p.NextOnSuccess, &t.onSuccess}, {p.NextOnFailure, &t.onFailure}, {p.NextOnSuccessOrFailure, &t.onSuccessOrFailure}} {
		if e.entry == nil {
			continue
		}
		if *e.dst, err = entryFilter(name, e.entry, h, depth); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func entryFilter(name string, e *Entry, h framework.Handle, depth int) (framework.Filter, error) {
	switch {
	case e.PluginRef != nil && e.DecisionTree != nil:
		return nil, errors.New("an entry names both a pluginRef and a decisionTree")
	case e.PluginRef != nil:
		if h == nil {
			return nil, fmt.Errorf("%q: no plugins to refer to", *e.PluginRef)
		}
		p, ok := h.Plugin(*e.PluginRef)
		if !ok {
			return nil, fmt.Errorf("%q is not a plugin defined before this tree", *e.PluginRef)
		}
		f, ok := p.(framework.Filter)
		if !ok {
			return nil, fmt.Errorf("%q (type %s) is not a filter", *e.PluginRef, p.TypedName().Type)
		}
		return f, nil
	case e.DecisionTree != nil:
		return build(name, e.DecisionTree, h, depth+1)
	}
	return nil, errors.New("an entry names neither a pluginRef nor a decisionTree")
}

// TypedName implements plugin.Plugin.
func (t *Tree) TypedName() plugin.TypedName { return t.name }

// Filter implements framework.Filter.
func (t *Tree) Filter(ctx context.Context, cs *framework.CycleState, req *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	// Current may reuse the slice it is given; the failure branch needs the
	// endpoints as they were.
	given := append([]*datalayer.Candidate(nil), cands...)
	kept := t.current.Filter(ctx, cs, req, cands)
	next := t.onSuccessOrFailure
	if len(kept) > 0 {
		if t.onSuccess != nil {
			next = t.onSuccess
		}
		if next == nil {
			return kept
		}
		return next.Filter(ctx, cs, req, kept)
	}
	if t.onFailure != nil {
		next = t.onFailure
	}
	if next == nil {
		return kept
	}
	return next.Filter(ctx, cs, req, given)
}
