package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/postpick/speculative"
)

// Upstream compatibility: a configuration written for the upstream EPP (the
// Gateway API Inference Extension's, llm-d's inference scheduler, llm-d's
// router) loads here and means what its author meant. Every upstream
// plugin type and parameter is in one of three classes:
//
//   - honoured: kvroute does the same;
//   - superseded: accepted, and kvroute does it its own way, better, which
//     the loader says in one line (Loaded.Notes, logged at start-up);
//   - refused: an error naming the plugin and what to use instead, only
//     where accepting would silently change what the file asks for.
//
// kvroute's own types keep refusing parameters nobody knows; where a type
// name is both kvroute's and upstream's, upstream's parameters are taken
// out first, each by its class.

// Class is how kvroute treats an upstream type or parameter.
type Class uint8

// The classes.
const (
	Honoured Class = iota
	Superseded
	Refused
)

func (c Class) String() string {
	switch c {
	case Honoured:
		return "honoured"
	case Superseded:
		return "superseded"
	}
	return "refused"
}

// upstreamType is one upstream plugin type.
type upstreamType struct {
	name string
	// seen says where and in which releases the type is registered.
	seen  string
	class Class
	// target is the kvroute type an honoured or superseded type becomes
	// (inertType for one that does nothing here); empty when it is
	// kvroute's own type of the same name.
	target string
	// why is the note of a superseded type, or what to use instead of a
	// refused one.
	why string
	// params classifies the type's parameters; a parameter not listed is
	// unknown, to upstream as much as to kvroute, and refused.
	params map[string]paramRule
	// translate, when set, rewrites the honoured parameters into those of
	// target (for parameters whose name or meaning changes).
	translate func(name string, honoured map[string]json.RawMessage) (json.RawMessage, error)
	// speculates: the type asks for speculative indexing when its
	// speculativeIndexing parameter is true.
	speculates bool
}

// paramRule classifies one parameter of an upstream type.
type paramRule struct {
	class Class
	// why is the note of a superseded parameter or the reason a refused one
	// is refused.
	why string
	// refuse, when set, refuses the parameter for some values only: it
	// returns the reason, or "" to accept it (superseded, or honoured).
	refuse func(raw json.RawMessage) string
}

// inertType is the kvroute type of an upstream type that is accepted and
// does nothing here: a data source kvroute replaces, a parser kvroute does
// not need, a producer nothing here consumes.
const inertType = "upstream-superseded"

// inertPlugin is an accepted upstream plugin that kvroute has no part for.
type inertPlugin struct{ name plugin.TypedName }

func (p *inertPlugin) TypedName() plugin.TypedName { return p.name }

// isInert reports whether p is an accepted upstream plugin with no part.
func isInert(p plugin.Plugin) bool {
	_, ok := p.(*inertPlugin)
	return ok
}

// resolveUpstream turns an upstream plugin spec into a kvroute type and
// parameters, noting what is superseded. ok is false when typ is not an
// upstream type this table knows, or is one it refuses that this binary
// registers after all (a kvroute type of the same name takes precedence).
func (r *Registry) resolveUpstream(name, typ string, raw json.RawMessage, l *Loaded) (kvType string, params json.RawMessage, ok bool, err error) {
	u, ok := upstreamTypes[typ]
	if !ok {
		return "", nil, false, nil
	}
	if u.class == Refused {
		if r.registered(typ) {
			return "", nil, false, nil
		}
		return "", nil, true, fmt.Errorf("plugin %q: %w %q: %s", name, ErrUnsupportedType, typ, u.why)
	}
	own := u.target == ""
	fields, err := splitParams(typ, name, raw)
	if err != nil {
		return "", nil, true, err
	}
	_, unread := u.params["*"]
	honoured := map[string]json.RawMessage{}
	var superseded []string
	upstreamParams := 0
	for _, key := range slices.Sorted(maps.Keys(fields)) {
		if unread {
			superseded = append(superseded, key)
			upstreamParams++
			continue
		}
		rule, known := u.params[key]
		if !known {
			if own {
				// kvroute's own parameter (or an unknown one, which its
				// strict factory refuses).
				honoured[key] = fields[key]
				continue
			}
			return "", nil, true, fmt.Errorf("%w: plugin %q (type %s): unknown parameter %q (known: %s)",
				framework.ErrInvalidParams, name, typ, key, strings.Join(slices.Sorted(maps.Keys(u.params)), ", "))
		}
		upstreamParams++
		if rule.refuse != nil {
			if why := rule.refuse(fields[key]); why != "" {
				return "", nil, true, fmt.Errorf("%w: plugin %q (type %s): parameter %s: %s", framework.ErrInvalidParams, name, typ, key, why)
			}
		}
		if u.speculates && key == speculativeIndexingParam {
			var on bool
			if err := json.Unmarshal(fields[key], &on); err != nil {
				return "", nil, true, fmt.Errorf("%w: plugin %q (type %s): parameter %s is not true or false", framework.ErrInvalidParams, name, typ, key)
			}
			if on {
				l.speculating = append(l.speculating, name)
			}
			continue
		}
		switch rule.class {
		case Refused:
			return "", nil, true, fmt.Errorf("%w: plugin %q (type %s): parameter %s: %s", framework.ErrInvalidParams, name, typ, key, rule.why)
		case Superseded:
			superseded = append(superseded, key)
		default:
			honoured[key] = fields[key]
		}
	}
	switch {
	case u.class == Superseded && own && upstreamParams == 0:
		// kvroute's own type, written as kvroute writes it: nothing to say.
	case u.class == Superseded && len(superseded) > 0:
		l.note(fmt.Sprintf("plugin %q (type %s): %s; %s not needed", name, typ, u.why, paramList(superseded)))
	case u.class == Superseded:
		l.note(fmt.Sprintf("plugin %q (type %s): %s", name, typ, u.why))
	case len(superseded) > 0:
		// One line per reason, naming every parameter it covers.
		byWhy := map[string][]string{}
		var order []string
		for _, key := range superseded {
			why := u.params[key].why
			if _, seen := byWhy[why]; !seen {
				order = append(order, why)
			}
			byWhy[why] = append(byWhy[why], key)
		}
		for _, why := range order {
			l.note(fmt.Sprintf("plugin %q (type %s): %s: %s", name, typ, paramList(byWhy[why]), why))
		}
	}
	kvType = u.target
	if own {
		kvType = typ
	}
	if kvType == inertType {
		return kvType, nil, true, nil
	}
	if !r.registered(kvType) {
		return "", nil, true, fmt.Errorf("plugin %q: %w %q: it maps onto kvroute's %s, which this binary does not register", name, ErrUnsupportedType, typ, kvType)
	}
	if u.translate != nil {
		params, err = u.translate(name, honoured)
		return kvType, params, true, err
	}
	if len(honoured) == 0 {
		return kvType, nil, true, nil
	}
	params, err = json.Marshal(honoured)
	if err != nil {
		return "", nil, true, fmt.Errorf("plugin %q: %w", name, err)
	}
	return kvType, params, true, nil
}

// speculativeIndexingParam is upstream's switch for speculative indexing,
// which kvroute turns into a speculative-prefix-recorder (addSpeculation).
const speculativeIndexingParam = "speculativeIndexing"

// addSpeculation gives every profile a speculative-prefix-recorder when a
// plugin asked for speculative indexing and the profile has none: upstream's
// producer and scorer then record the pick's blocks as about to be held,
// which is what the recorder does here.
func (r *Registry) addSpeculation(l *Loaded, cfg *EndpointPickerConfig, add func(name, typ string, params []byte) (plugin.Plugin, error)) error {
	if len(l.speculating) == 0 {
		return nil
	}
	var rec framework.PostPick
	var missing []*framework.Profile
	for _, prof := range l.Profiles {
		has := false
		for _, pp := range prof.PostPicks {
			if pp.TypedName().Type == speculative.Type {
				has, rec = true, pp
			}
		}
		if !has {
			missing = append(missing, prof)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if rec == nil {
		p, err := add(speculative.Type, speculative.Type, nil)
		if err != nil {
			return fmt.Errorf("plugin %q asks for speculative indexing: %w", l.speculating[0], err)
		}
		cfg.Plugins = append(cfg.Plugins, PluginSpec{Name: speculative.Type, Type: speculative.Type})
		rec = p.(framework.PostPick)
	}
	for _, prof := range missing {
		prof.PostPicks = append(prof.PostPicks, rec)
		for i := range cfg.SchedulingProfiles {
			if cfg.SchedulingProfiles[i].Name == prof.Name {
				cfg.SchedulingProfiles[i].Plugins = append(cfg.SchedulingProfiles[i].Plugins, SchedulingPlugin{PluginRef: rec.TypedName().Name})
			}
		}
	}
	l.note(fmt.Sprintf("speculativeIndexing (plugin %s): a speculative-prefix-recorder records each pick's blocks as held for the index's speculative TTL", strings.Join(l.speculating, ", ")))
	return nil
}

// paramList names parameters: "parameter a" or "parameters a, b".
func paramList(keys []string) string {
	if len(keys) == 1 {
		return "parameter " + keys[0]
	}
	return "parameters " + strings.Join(keys, ", ")
}

// splitParams decodes a plugin's parameters into their top-level fields.
func splitParams(typ, name string, raw json.RawMessage) (map[string]json.RawMessage, error) {
	fields := map[string]json.RawMessage{}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		return fields, nil
	}
	if err := json.Unmarshal(trimmed, &fields); err != nil {
		return nil, fmt.Errorf("%w: plugin %q (type %s): parameters are not an object: %w", framework.ErrInvalidParams, name, typ, err)
	}
	return fields, nil
}

// UpstreamTypes lists every upstream plugin type the loader knows, sorted,
// with its class; for the docs and their test.
func UpstreamTypes() []UpstreamType {
	out := make([]UpstreamType, 0, len(upstreamTypes))
	for _, u := range upstreamTypes {
		t := UpstreamType{Name: u.name, Seen: u.seen, Class: u.class, Target: u.target, Why: u.why}
		if t.Target == "" && u.class != Refused {
			t.Target = u.name
		}
		for _, k := range slices.Sorted(maps.Keys(u.params)) {
			p := u.params[k]
			t.Params = append(t.Params, UpstreamParam{Name: k, Class: p.class, Why: p.why, Conditional: p.refuse != nil})
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// UpstreamType describes one upstream plugin type and how kvroute treats it.
type UpstreamType struct {
	Name, Seen string
	Class      Class
	// Target is the kvroute type it loads as (inert for none); empty when
	// refused.
	Target string
	Why    string
	Params []UpstreamParam
}

// UpstreamParam describes one parameter of an upstream type.
type UpstreamParam struct {
	Name  string
	Class Class
	Why   string
	// Conditional: refused for some values only (Why says which).
	Conditional bool
}

// note records a start-up line, once.
func (l *Loaded) note(s string) {
	if !slices.Contains(l.Notes, s) {
		l.Notes = append(l.Notes, s)
	}
}
