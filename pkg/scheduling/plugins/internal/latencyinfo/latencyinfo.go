// Package latencyinfo reads the LatencyPredictionInfo a PrepareData
// producer published on a candidate.
package latencyinfo

import "github.com/kvroute/kvroute/pkg/datalayer"

// Exemplar is the type consumers declare for
// datalayer.LatencyPredictionInfoKey.
var Exemplar = datalayer.LatencyPredictionInfo{}

// Consumes is a consumer's declaration of that key.
func Consumes() map[string]any {
	return map[string]any{datalayer.LatencyPredictionInfoKey: Exemplar}
}

// Get returns the candidate's prediction; ok is false when there is none
// or it is not valid.
func Get(c *datalayer.Candidate) (datalayer.LatencyPredictionInfo, bool) {
	v, ok := c.Get(datalayer.LatencyPredictionInfoKey)
	if !ok {
		return datalayer.LatencyPredictionInfo{}, false
	}
	var info datalayer.LatencyPredictionInfo
	switch p := v.(type) {
	case datalayer.LatencyPredictionInfo:
		info = p
	case *datalayer.LatencyPredictionInfo:
		if p == nil {
			return info, false
		}
		info = *p
	default:
		return info, false
	}
	return info, info.TTFTValid || info.TPOTValid
}
