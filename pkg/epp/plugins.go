package epp

import (
	"encoding/json"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/framework/plugin"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// newRegistry is the in-tree plugin registry plus the plugins that need
// this process's index: the precise prefix producer, registered as the
// default producer of the keys it publishes, whose parameters start from
// defaults and are overridden by those its configuration gives.
func newRegistry(defaults prefixmatch.Params, index prefixmatch.Index, approx prefixmatch.Approx) (*config.Registry, error) {
	r := config.NewInTreeRegistry()
	err := r.Register(prefixmatch.Type, func(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		p := defaults
		if err := framework.DecodeParams(prefixmatch.Type, name, raw, &p); err != nil {
			return nil, err
		}
		return prefixmatch.New(name, p, index, approx), nil
	})
	if err != nil {
		return nil, err
	}
	for _, key := range []string{datalayer.PrefixCacheMatchInfoKey, prefixmatch.RequestBlockKeysKey} {
		if err := r.RegisterDefaultProducer(key, prefixmatch.Type); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// prefixParams are the producer defaults o asks for, with its zero fields
// taken from prefixmatch.DefaultParams.
func prefixParams(o prefixmatch.Params) prefixmatch.Params {
	p := prefixmatch.DefaultParams()
	if o.DefaultBlockSizeTokens > 0 {
		p.DefaultBlockSizeTokens = o.DefaultBlockSizeTokens
	}
	if o.MaxPrefixBlocks > 0 {
		p.MaxPrefixBlocks = o.MaxPrefixBlocks
	}
	if o.ApproxBlockSizeTokens > 0 {
		p.ApproxBlockSizeTokens = o.ApproxBlockSizeTokens
	}
	if o.ApproxMaxBlocks > 0 {
		p.ApproxMaxBlocks = o.ApproxMaxBlocks
	}
	return p
}

// speculator records, after a pick, that the picked endpoint will soon hold
// the request's blocks: as a short-lived speculative holding in the exact
// index (until its events confirm it), and in the approximate index's
// routing history, which is all there is for endpoints without events.
type speculator struct {
	index     *index.Index
	approx    *approx.Index
	maxApprox int
}

func (s *speculator) Speculate(addr string, keys []uint64, held int) {
	s.index.Speculate(addr, keys[held:])
	// The routing history answers only for endpoints whose event stream is
	// missing or uncertain; teaching it the picks of an exact endpoint
	// would cost an LRU update per block on every request for nothing.
	if state, _ := s.index.State(addr); state != datalayer.StreamExact {
		s.approx.Record(addr, keys[:min(len(keys), s.maxApprox)])
	}
}

// RecordHistory remembers a pick made from text hashes alone (the token ids
// were unknown), which only the approximate index can use.
func (s *speculator) RecordHistory(addr string, hashes []uint64) {
	s.approx.Record(addr, hashes)
}
