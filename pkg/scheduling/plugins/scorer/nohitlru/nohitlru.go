// Package nohitlru is the no-hit-lru-scorer: a request no endpoint holds
// any of (a cold request) goes preferably to the endpoint that received a
// cold request least recently, so cold prompts spread over the pool rather
// than pile onto one endpoint; a request with a hit anywhere scores 0.5
// everywhere, leaving the choice to the other scorers.
package nohitlru

import (
	"container/list"
	"context"
	"encoding/json"
	"sync"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "no-hit-lru-scorer"

// DefaultLRUSize is how many endpoints the scorer remembers.
const DefaultLRUSize = 1024

// Scorer ranks endpoints for a cold request: those never given one first,
// then those given one longest ago; scores fall linearly from 1 to 0 over
// the ranks. Its post-pick hook remembers the pick of each cold request.
type Scorer struct {
	name plugin.TypedName
	mu   sync.Mutex
	// order lists endpoint names, the one given a cold request longest ago
	// first; at lets a pick move its endpoint to the back.
	order *list.List
	at    map[string]*list.Element
	size  int
}

var (
	_ framework.Scorer   = (*Scorer)(nil)
	_ framework.PostPick = (*Scorer)(nil)
	_ plugin.Consumer    = (*Scorer)(nil)
)

// Params are the scorer's parameters.
type Params struct {
	// LRUSize bounds the endpoints remembered (1024 by default).
	LRUSize int `json:"lruSize"`
}

// New makes the scorer.
func New(name string, p Params) *Scorer {
	if p.LRUSize <= 0 {
		p.LRUSize = DefaultLRUSize
	}
	return &Scorer{name: plugin.TypedName{Type: Type, Name: name}, order: list.New(), at: map[string]*list.Element{}, size: p.LRUSize}
}

// Factory makes the scorer.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p Params
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name, p), nil
}

// TypedName implements plugin.Plugin.
func (s *Scorer) TypedName() plugin.TypedName { return s.name }

// Category implements framework.Scorer.
func (s *Scorer) Category() framework.ScorerCategory { return framework.Distribution }

// Consumes implements plugin.Consumer.
func (s *Scorer) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

func (s *Scorer) coldKey() string { return "nohitlru.cold/" + s.name.Name }

// cold reports whether no candidate holds any of the request's blocks.
func cold(cands []*datalayer.Candidate) bool {
	for _, c := range cands {
		if info, ok := datalayer.PrefixCacheInfoOf(c); ok && info.MatchBlocks > 0 {
			return false
		}
	}
	return true
}

// Score implements framework.Scorer.
func (s *Scorer) Score(_ context.Context, cs *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate, out []float64) {
	isCold := cold(cands)
	cs.Write(s.coldKey(), isCold)
	if !isCold {
		for i := range cands {
			out[i] = 0.5
		}
		return
	}
	if len(cands) == 1 {
		out[0] = 1
		return
	}
	s.mu.Lock()
	pos := make(map[string]int, s.order.Len())
	i := 0
	for e := s.order.Front(); e != nil; e = e.Next() {
		pos[e.Value.(string)] = i
		i++
	}
	s.mu.Unlock()
	span := float64(len(cands) - 1)
	never := 0
	for i, c := range cands {
		if _, used := pos[c.Name]; !used {
			out[i] = 1 - float64(never)/span
			never++
		}
	}
	for i, c := range cands {
		if p, used := pos[c.Name]; used {
			out[i] = max(0, 1-float64(never+p)/span)
		}
	}
}

// PostPick implements framework.PostPick: the primary pick of a cold
// request becomes the endpoint given one most recently.
func (s *Scorer) PostPick(_ context.Context, cs *framework.CycleState, _ *request.Request, res *framework.ProfileResult) {
	v, _ := cs.Read(s.coldKey())
	if isCold, _ := v.(bool); !isCold || res == nil || len(res.Picked) == 0 {
		return
	}
	name := res.Picked[0].Name
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.at[name]; ok {
		s.order.MoveToBack(e)
		return
	}
	s.at[name] = s.order.PushBack(name)
	for s.order.Len() > s.size {
		old := s.order.Remove(s.order.Front()).(string)
		delete(s.at, old)
	}
}
