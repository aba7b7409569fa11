package config

import (
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	producer "github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// approxParams are upstream's approximate prefix producer's parameters.
type approxParams struct {
	BlockSize              *int  `json:"blockSize,omitempty"`
	BlockSizeTokens        *int  `json:"blockSizeTokens,omitempty"`
	MaxPrefixBlocksToMatch *int  `json:"maxPrefixBlocksToMatch,omitempty"`
	MaxPrefixTokensToMatch *int  `json:"maxPrefixTokensToMatch,omitempty"`
	LRUCapacityPerServer   *int  `json:"lruCapacityPerServer,omitempty"`
	AutoTune               *bool `json:"autoTune,omitempty"`
}

// translateApproxPrefix maps upstream's approximate producer onto kvroute's
// prefix producer. Upstream's approximation is kvroute's fallback for
// endpoints without an in-order event stream, so its tuning carries over to
// that fallback: blockSizeTokens and the match cap (in blocks, or in tokens,
// which wins as upstream) keep their meaning. What kvroute does not let a
// user tune is refused rather than ignored.
func translateApproxPrefix(name string, raw json.RawMessage) (json.RawMessage, error) {
	const typ = ApproxPrefixProducerType
	var up approxParams
	if err := framework.DecodeParams(typ, name, raw, &up); err != nil {
		return nil, err
	}
	// Only what the upstream parameters say is passed on: kvroute's own
	// parameters and the process's defaults stay as they are.
	out := map[string]int{}
	approxBlockSize := producer.DefaultParams().ApproxBlockSizeTokens
	if up.BlockSize != nil {
		return nil, framework.ParamError(typ, name, "blockSize (in characters) is deprecated upstream and not supported; use blockSizeTokens")
	}
	if v := up.BlockSizeTokens; v != nil {
		if *v < 1 {
			return nil, framework.ParamError(typ, name, "blockSizeTokens = %d, want ≥ 1", *v)
		}
		out["approxBlockSizeTokens"], approxBlockSize = *v, *v
	}
	if v := up.MaxPrefixBlocksToMatch; v != nil {
		if *v < 1 {
			return nil, framework.ParamError(typ, name, "maxPrefixBlocksToMatch = %d, want ≥ 1", *v)
		}
		out["approxMaxBlocks"] = *v
	}
	if v := up.MaxPrefixTokensToMatch; v != nil && *v > 0 {
		out["approxMaxBlocks"] = max(*v/approxBlockSize, 1)
	}
	if v := up.LRUCapacityPerServer; v != nil && *v != approx.DefaultCapacity {
		return nil, framework.ParamError(typ, name, "lruCapacityPerServer = %d: kvroute's approximate fallback keeps %d blocks per endpoint, which is not configurable", *v, approx.DefaultCapacity)
	}
	if v := up.AutoTune; v != nil && !*v {
		return nil, framework.ParamError(typ, name, "autoTune = false is not supported: kvroute always takes block sizes from the endpoints' events and metrics")
	}
	b, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: translate %s parameters: %w", name, typ, err)
	}
	return b, nil
}
