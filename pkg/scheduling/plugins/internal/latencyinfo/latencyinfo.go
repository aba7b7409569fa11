// Package latencyinfo reads the LatencyPredictionInfo a PrepareData
// producer published on a candidate.
package latencyinfo

import "github.com/kvroute/kvroute/pkg/datalayer"

// Exemplar is the type consumers declare for
// datalayer.LatencyPredictionInfoKey: the predicted-latency producer
// publishes a pointer.
var Exemplar = (*datalayer.LatencyPredictionInfo)(nil)

// Consumes is a consumer's declaration of that key.
func Consumes() map[string]any {
	return map[string]any{datalayer.LatencyPredictionInfoKey: Exemplar}
}

// Get returns the candidate's prediction; ok is false when there is none
// or it is not valid.
func Get(c *datalayer.Candidate) (datalayer.LatencyPredictionInfo, bool) {
	info, ok := datalayer.LatencyPredictionOf(c)
	return info, ok && (info.TTFTValid || info.TPOTValid)
}

// Ref returns the candidate's prediction in place where the producer
// published a pointer (as the predicted-latency producer does), a copy
// where it published a value, and nil where there is none: for a reader
// of a field or two of every candidate on the request path.
func Ref(c *datalayer.Candidate) *datalayer.LatencyPredictionInfo {
	v, ok := c.Get(datalayer.LatencyPredictionInfoKey)
	if !ok {
		return nil
	}
	switch p := v.(type) {
	case *datalayer.LatencyPredictionInfo:
		return p
	case datalayer.LatencyPredictionInfo:
		return &p
	}
	return nil
}
