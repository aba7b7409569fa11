package datalayer

// LatencyPredictionInfoKey is the key under which a candidate's
// LatencyPredictionInfo is published, as upstream's predicted-latency
// producer names it. kvroute's producer publishes a
// *LatencyPredictionInfo (into a per-request slab, so that publishing
// boxes nothing); read it with LatencyPredictionOf, which takes a value
// as well.
const LatencyPredictionInfoKey = "LatencyPredictionInfoKey"

// LatencyPredictionInfo is the latency predicted for one request on one
// endpoint, in upstream's shape (times in milliseconds). TTFT and TPOT are
// the configured quantile (p90 by default), what SLOs are judged against;
// the means are what a pick that minimises expected latency weighs.
type LatencyPredictionInfo struct {
	// TTFTValid and TPOTValid say whether a prediction was made (a backend
	// that failed leaves them false, and the rest zero).
	TTFTValid bool `json:"ttftValid"`
	TPOTValid bool `json:"tpotValid"`
	// TTFTHeadroom and TPOTHeadroom are the request's SLO minus the
	// predicted quantile: negative means the endpoint is predicted to miss
	// it. Zero when the request has no such SLO (HasTTFTSLO, HasTPOTSLO).
	TTFTHeadroom float64 `json:"ttftHeadroom"`
	TPOTHeadroom float64 `json:"tpotHeadroom"`
	HasTTFTSLO   bool    `json:"hasTtftSlo"`
	HasTPOTSLO   bool    `json:"hasTpotSlo"`
	// TTFT and TPOT are the predicted quantiles.
	TTFT float64 `json:"ttft"`
	TPOT float64 `json:"tpot"`
	// TTFTMean and TPOTMean are the predicted means.
	TTFTMean float64 `json:"ttftMean"`
	TPOTMean float64 `json:"tpotMean"`
	// TTFTAlone is the predicted mean TTFT with nothing ahead of the
	// request: its own prefill's engine time there.
	TTFTAlone float64 `json:"ttftAlone"`
	// Quantile is the quantile TTFT and TPOT are (0.9 for p90).
	Quantile float64 `json:"quantile"`
	// DispatchedRequestCount is the requests this EPP had in flight on the
	// endpoint when it predicted.
	DispatchedRequestCount int `json:"dispatchedRequestCount"`
}

// MeetsSLO reports whether the endpoint is predicted to meet every SLO the
// request has (true when it has none).
func (l *LatencyPredictionInfo) MeetsSLO() bool {
	return (!l.HasTTFTSLO || l.TTFTHeadroom >= 0) && (!l.HasTPOTSLO || l.TPOTHeadroom >= 0)
}

// LatencyPredictionOf returns the prediction published on a (a candidate,
// or a response's picked one) under LatencyPredictionInfoKey, held as a
// *LatencyPredictionInfo or a LatencyPredictionInfo; ok is false when
// there is none.
func LatencyPredictionOf(a interface{ Get(string) (any, bool) }) (LatencyPredictionInfo, bool) {
	v, ok := a.Get(LatencyPredictionInfoKey)
	if !ok {
		return LatencyPredictionInfo{}, false
	}
	switch p := v.(type) {
	case *LatencyPredictionInfo:
		if p != nil {
			return *p, true
		}
	case LatencyPredictionInfo:
		return p, true
	}
	return LatencyPredictionInfo{}, false
}
