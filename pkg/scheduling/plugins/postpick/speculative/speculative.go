// Package speculative is the speculative-prefix-recorder: after a pick it
// records that the picked endpoint is about to hold the request's blocks,
// so that requests with the same prefix that arrive before the endpoint's KV
// events follow it there instead of spreading over the pool.
package speculative

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/internal/prefixinfo"
)

// Type is the plugin's registered type name.
const Type = "speculative-prefix-recorder"

// Recorder calls the Speculator with the primary pick's address and the
// request's block keys, which a PrepareData producer published under
// framework.RequestBlockKeysKey. Fallbacks are not recorded: the request
// goes to them only if the primary fails.
type Recorder struct {
	name plugin.TypedName
	spec framework.Speculator
}

var (
	_ framework.PostPick = (*Recorder)(nil)
	_ plugin.Consumer    = (*Recorder)(nil)
)

// New makes the recorder.
func New(name string, spec framework.Speculator) *Recorder {
	return &Recorder{name: plugin.TypedName{Type: Type, Name: name}, spec: spec}
}

// Factory makes the recorder; it takes no parameters and needs the handle's
// Speculator.
func Factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	if h == nil || h.Speculator() == nil {
		return nil, fmt.Errorf("plugin %q (type %s): this process records no speculative holdings (no speculator)", name, Type)
	}
	return New(name, h.Speculator()), nil
}

// TypedName implements plugin.Plugin.
func (r *Recorder) TypedName() plugin.TypedName { return r.name }

// Consumes implements plugin.Consumer.
func (r *Recorder) Consumes() map[string]any {
	return map[string]any{framework.RequestBlockKeysKey: []uint64(nil), datalayer.PrefixCacheMatchInfoKey: prefixinfo.Exemplar}
}

// PostPick implements framework.PostPick.
func (r *Recorder) PostPick(_ context.Context, _ *framework.CycleState, req *request.Request, res *framework.ProfileResult) {
	if res == nil || len(res.Picked) == 0 || req.NoReproduciblePrefix {
		return
	}
	primary := res.Picked[0]
	if v, ok := primary.Get(framework.RequestBlockKeysKey); ok {
		if keys, ok := v.([]uint64); ok && len(keys) > 0 {
			// Blocks the endpoint already holds for real need no
			// speculation: after a match that claims only held blocks
			// (an exact or a partial stream's), the speculator is told how
			// many lead the keys, so that it records the rest. This spares
			// the index a write per held block on every pick, and a prompt
			// sent again (whose tail the last pick recorded) rewrites only
			// that tail. Speculative blocks are taken to trail the held
			// ones, as they do when speculation follows the real events:
			// should one lie among them, it is only left unrefreshed, and
			// lapses when its time is up (never a claim of more).
			held := 0
			if info, ok := datalayer.PrefixCacheInfoOf(primary); ok && (info.Exact || info.State.HoldsMatched()) {
				held = min(max(info.MatchBlocks-info.SpeculativeBlocks, 0), len(keys))
			}
			r.spec.Speculate(primary.Address, keys, held)
			return
		}
	}
	// Without token ids there are no block keys, only the text's hashes:
	// they can teach a routing history, if the speculator keeps one.
	if h, ok := r.spec.(framework.HistoryRecorder); ok {
		if v, ok := primary.Get(framework.ApproxHashesKey); ok {
			if hashes, ok := v.([]uint64); ok && len(hashes) > 0 {
				h.RecordHistory(primary.Address, hashes)
			}
		}
	}
}
