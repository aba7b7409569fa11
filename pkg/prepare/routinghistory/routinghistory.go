// Package routinghistory is the PrepareData producer that answers, for
// every candidate of a request, how much of the request's prefix this EPP
// recently sent there: upstream's approximate prefix index, kept beside the
// exact one so that an upstream prefix-cache-scorer places prefixes as
// upstream's does without its answer passing for cache state.
package routinghistory

import (
	"context"
	"sync"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/request"
)

// Type is the producer's registered plugin type.
const Type = "routing-history-producer"

// History is what the producer needs of the routing history: out[i] is the
// leading run of hashes recorded for addrs[i].
type History interface {
	Match(hashes []uint64, addrs []string, out []int)
}

// Producer publishes a datalayer.RoutedPrefix under
// datalayer.RoutedPrefixKey for every candidate, from the block keys (or,
// when the token ids are unknown, the text hashes) the prefix producer
// published; the picks are recorded by the plugin that places by them.
type Producer struct {
	name    string
	history History
}

var (
	_ prepare.DataProducer   = (*Producer)(nil)
	_ prepare.InlineProducer = (*Producer)(nil)
)

// New returns a producer reading history.
func New(name string, history History) *Producer {
	if name == "" {
		name = Type
	}
	return &Producer{name: name, history: history}
}

// TypedName implements plugin.Plugin.
func (p *Producer) TypedName() plugin.TypedName { return plugin.TypedName{Type: Type, Name: p.name} }

// Produces implements plugin.Producer.
func (p *Producer) Produces() map[string]any {
	return map[string]any{datalayer.RoutedPrefixKey: datalayer.RoutedPrefix{}}
}

// Consumes implements plugin.Consumer: the request's block keys and text
// hashes, which the prefix producer publishes.
func (p *Producer) Consumes() map[string]any {
	return map[string]any{prefixmatch.RequestBlockKeysKey: []uint64(nil), prefixmatch.ApproxHashesKey: []uint64(nil)}
}

// ProducesInline implements prepare.InlineProducer: the history is in
// memory.
func (p *Producer) ProducesInline() bool { return true }

type scratch struct {
	keys    [][]uint64
	done    []bool
	addrs   []string
	members []int
	out     []int
}

var scratchPool = sync.Pool{New: func() any { return &scratch{} }}

// Produce implements prepare.DataProducer. Candidates of different block
// sizes have keys of their own; each distinct slice is matched once.
func (p *Producer) Produce(ctx context.Context, _ *request.Request, cands []*datalayer.Candidate) error {
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.keys, sc.done = sc.keys[:0], sc.done[:0]
	for _, c := range cands {
		sc.keys = append(sc.keys, hashesOf(c))
		sc.done = append(sc.done, false)
	}
	var last datalayer.RoutedPrefix
	var lastBoxed any
	for first := range cands {
		if sc.done[first] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		keys := sc.keys[first]
		sc.addrs, sc.members = sc.addrs[:0], sc.members[:0]
		for i := first; i < len(cands); i++ {
			if !sc.done[i] && sameSlice(sc.keys[i], keys) {
				sc.done[i] = true
				sc.addrs = append(sc.addrs, cands[i].Address)
				sc.members = append(sc.members, i)
			}
		}
		if cap(sc.out) < len(sc.addrs) {
			sc.out = make([]int, len(sc.addrs))
		}
		out := sc.out[:len(sc.addrs)]
		clear(out)
		if len(keys) > 0 {
			p.history.Match(keys, sc.addrs, out)
		}
		for j, i := range sc.members {
			v := datalayer.RoutedPrefix{Blocks: out[j], TotalBlocks: len(keys)}
			// Most candidates answer alike (nothing routed there): one
			// box serves a run of equal answers.
			if lastBoxed == nil || v != last {
				last, lastBoxed = v, v
			}
			cands[i].Put(datalayer.RoutedPrefixKey, lastBoxed)
		}
	}
	clear(sc.keys)
	return nil
}

// hashesOf is what c's pick would be recorded under: the request's block
// keys at c's block size, or the text's hashes when the tokens are unknown.
func hashesOf(c *datalayer.Candidate) []uint64 {
	for _, key := range []string{prefixmatch.RequestBlockKeysKey, prefixmatch.ApproxHashesKey} {
		if v, ok := c.Get(key); ok {
			if h, ok := v.([]uint64); ok && len(h) > 0 {
				return h
			}
		}
	}
	return nil
}

func sameSlice(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	return len(a) == 0 || &a[0] == &b[0]
}
