package flowcontrol

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

// Gate decides a waiting request's release from its candidates, with
// what PrepareData put on them.
type Gate struct {
	// Saturation, when set, releases a request once some candidate is not
	// saturated (upstream's dispatch gate); nil releases on it at once.
	Saturation *saturationdetector.Detector
	// ByPrediction releases a request once some candidate is predicted to
	// serve it within its TTFT SLO (or, without one, within its band's
	// TTFTTarget), and refuses it once its SLO is out of reach; requests
	// with no prediction, or neither SLO nor target, fall back to
	// Saturation.
	ByPrediction bool
}

// Decide is the verdict for a request with TTFT SLO slo (zero: none) in
// a band with TTFT target target, having waited waited. protect (zero:
// none) is the tightest TTFT SLO of the priorities above the request's
// (Controller.Protect): engines serve what they were sent in order, so a
// request released onto a queue leaves a more urgent one arriving next
// behind it. It is released only where such a request would still find
// an endpoint that serves it within protect: the one this request goes to
// (its predicted TTFT there plus a prefill like its own), or another
// endpoint of the pool, left as it is; or where nothing is ahead of it at
// all. Holding it while another endpoint keeps that room would protect
// nothing and cost it its own SLO.
func (g Gate) Decide(cands []*datalayer.Candidate, slo, target, protect, waited time.Duration, now time.Time) Verdict {
	if len(cands) == 0 {
		return Verdict{}
	}
	if g.ByPrediction {
		if best, alone, ok := Predicted(cands); ok {
			leaves := protect <= 0 || best+alone <= protect || best <= alone+idleSlack || roomBesidesBest(cands, protect)
			switch {
			case slo > 0 && waited+best <= slo && leaves:
				return Verdict{Release: true}
			case slo > 0 && waited+alone > slo:
				return Verdict{Refuse: fmt.Errorf("%w: waited %v, best predicted TTFT %v, SLO %v",
					ErrSLOUnreachable, waited.Round(time.Millisecond), alone.Round(time.Millisecond), slo)}
			case slo > 0:
				return Verdict{}
			case target > 0:
				return Verdict{Release: best <= target && leaves}
			}
		}
	}
	if g.Saturation == nil {
		return Verdict{Release: true}
	}
	return Verdict{Release: !g.Saturation.AllSaturated(cands, now)}
}

// idleSlack is how far above a request's TTFT alone its best predicted
// TTFT may be while the endpoint still counts as having nothing ahead.
const idleSlack = 5 * time.Millisecond

// roomBesidesBest says whether some candidate other than the one of least
// predicted TTFT (where a released request goes) is predicted to serve a
// request like this one within protect.
func roomBesidesBest(cands []*datalayer.Candidate, protect time.Duration) bool {
	bestAt, n := -1, 0
	var best time.Duration
	for i, c := range cands {
		lat, has := datalayer.LatencyPredictionOf(c)
		if !has || !lat.TTFTValid {
			continue
		}
		n++
		if b := time.Duration(lat.TTFT * float64(time.Millisecond)); bestAt < 0 || b < best {
			bestAt, best = i, b
		}
	}
	if n < 2 {
		return false
	}
	for i, c := range cands {
		if i == bestAt {
			continue
		}
		if lat, has := datalayer.LatencyPredictionOf(c); has && lat.TTFTValid && time.Duration(lat.TTFT*float64(time.Millisecond)) <= protect {
			return true
		}
	}
	return false
}

// Predicted is the least predicted TTFT among cands (the predictor's
// quantile, with what waits ahead on each) and the least TTFT with
// nothing ahead (the best a request could ever get); ok is false when no
// candidate has a prediction.
func Predicted(cands []*datalayer.Candidate) (best, alone time.Duration, ok bool) {
	for _, c := range cands {
		lat, has := datalayer.LatencyPredictionOf(c)
		if !has || !lat.TTFTValid {
			continue
		}
		b := time.Duration(lat.TTFT * float64(time.Millisecond))
		a := time.Duration(lat.TTFTAlone * float64(time.Millisecond))
		if !ok || b < best {
			best = b
		}
		if !ok || a < alone {
			alone = a
		}
		ok = true
	}
	return best, alone, ok
}
