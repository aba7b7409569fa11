package flowcontrol

import (
	"fmt"
	"math"
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
// a band with TTFT target target, having waited waited. protect
// (Controller.Protect) is the more urgent work it must leave room for:
// engines serve what they were sent in order, so a request released onto
// a queue leaves a more urgent one arriving next behind it. It is
// released only where enough endpoints would still serve such a request
// within protect.SLO for those arriving while its own prefill runs
// (protect.PerSecond times that prefill, at least one): the endpoint it
// goes to (its predicted TTFT there plus a prefill like its own) and the
// others as they stand; or where nothing is ahead of it at all.
func (g Gate) Decide(cands []*datalayer.Candidate, slo, target time.Duration, protect Protection, waited time.Duration, now time.Time) Verdict {
	if len(cands) == 0 {
		return Verdict{}
	}
	if g.ByPrediction {
		if best, alone, ok := Predicted(cands); ok {
			leaves := protect.SLO <= 0 || (!protect.Beyond && best <= alone+idleSlack) || leavesRoom(cands, protect, best, alone)
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

// leavesRoom says whether, with a request of prefill time alone released
// onto the candidate of least predicted TTFT (best, from Predicted),
// enough candidates would still serve a request like it within p.SLO: one
// for each protected request expected to arrive during that prefill, and
// at least one. A request beyond its flow's share (p.Beyond) keeps room
// for those arriving while one could still wait for a place (p.SLO less
// a prefill like its own) instead, counting the requests each candidate
// could still take in turn within p.SLO: it is served from the capacity
// the others leave over the time they may wait, not only from what is
// free while its own prefill runs.
func leavesRoom(cands []*datalayer.Candidate, p Protection, best, alone time.Duration) bool {
	horizon := alone
	if p.Beyond {
		horizon = max(p.SLO-alone, alone)
	}
	need := max(1, int(math.Ceil(p.PerSecond*horizon.Seconds())))
	room, bestSeen := 0, false
	for _, c := range cands {
		lat, has := datalayer.LatencyPredictionOf(c)
		if !has || !lat.TTFTValid {
			continue
		}
		ttft := time.Duration(lat.TTFT * float64(time.Millisecond))
		if ttft == best && !bestSeen {
			// The request itself goes to the best, ahead of what follows.
			bestSeen, ttft = true, ttft+alone
		}
		switch {
		case ttft > p.SLO:
		case !p.Beyond || alone <= 0:
			room++
		default:
			room += 1 + int((p.SLO-ttft)/alone)
		}
	}
	return room >= need
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
