package flowcontrol_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
)

func predicted(ttft, alone float64) *datalayer.Candidate {
	c := datalayer.NewCandidate(&datalayer.Endpoint{Name: "e", Address: "10.0.0.1:8000"}, datalayer.Metrics{}, 0)
	c.Put(datalayer.LatencyPredictionInfoKey, &datalayer.LatencyPredictionInfo{TTFTValid: true, TTFT: ttft, TTFTAlone: alone})
	return c
}

func TestGateDecides(t *testing.T) {
	t.Parallel()
	now := time.Now()
	fresh := datalayer.NewCandidate(&datalayer.Endpoint{Name: "f"}, datalayer.Metrics{UpdateTime: now, WaitingQueueSize: 0}, 0)
	busy := datalayer.NewCandidate(&datalayer.Endpoint{Name: "b"}, datalayer.Metrics{UpdateTime: now, WaitingQueueSize: 50}, 0)
	det := saturationdetector.NewDetector("d", saturationdetector.DefaultThresholds(), time.Minute)
	byPred := flowcontrol.Gate{ByPrediction: true, Saturation: det}
	ms := time.Millisecond
	for _, tc := range []struct {
		name                string
		gate                flowcontrol.Gate
		cands               []*datalayer.Candidate
		slo, target, waited time.Duration
		release, refuse     bool
		protect             time.Duration
		rate                float64
	}{
		{"an endpoint predicted within the SLO releases", byPred, []*datalayer.Candidate{predicted(900, 100), predicted(400, 100)}, 500 * ms, 0, 0, true, false, 0, 0},
		{"the wait so far counts against the SLO", byPred, []*datalayer.Candidate{predicted(400, 100)}, 500 * ms, 0, 200 * ms, false, false, 0, 0},
		{"an SLO out of reach even with nothing ahead is refused", byPred, []*datalayer.Candidate{predicted(900, 300)}, 500 * ms, 0, 250 * ms, false, true, 0, 0},
		{"without an SLO the band's target decides", byPred, []*datalayer.Candidate{predicted(300, 100)}, 0, 250 * ms, 0, false, false, 0, 0},
		{"without an SLO a prediction under the band's target releases", byPred, []*datalayer.Candidate{predicted(200, 100)}, 0, 250 * ms, 0, true, false, 0, 0},
		{"without SLO or target the saturation test decides: saturated", byPred, []*datalayer.Candidate{busy}, 0, 0, 0, false, false, 0, 0},
		{"without SLO or target the saturation test decides: room", byPred, []*datalayer.Candidate{busy, fresh}, 0, 0, 0, true, false, 0, 0},
		{"upstream's gate holds while every endpoint is saturated", flowcontrol.Gate{Saturation: det}, []*datalayer.Candidate{busy}, 500 * ms, 0, 0, false, false, 0, 0},
		{"no candidates hold", byPred, nil, 0, 0, 0, false, false, 0, 0},
		// Batch work under an interactive band's 300ms SLO.
		{"a queue a more urgent request could not pass after it holds", byPred, []*datalayer.Candidate{predicted(250, 110)}, 1500 * ms, 0, 0, false, false, 300 * ms, 0},
		{"a queue it could pass after it releases", byPred, []*datalayer.Candidate{predicted(180, 110)}, 1500 * ms, 0, 0, true, false, 300 * ms, 0},
		{"an endpoint with nothing ahead releases whatever the prefill", byPred, []*datalayer.Candidate{predicted(452, 450)}, 1500 * ms, 0, 0, true, false, 300 * ms, 0},
		{"a queue it could not pass after it releases while another endpoint keeps room", byPred, []*datalayer.Candidate{predicted(250, 110), predicted(290, 110)}, 1500 * ms, 0, 0, true, false, 300 * ms, 0},
		{"a queue it could not pass after it holds while no other endpoint keeps room", byPred, []*datalayer.Candidate{predicted(250, 110), predicted(310, 110)}, 1500 * ms, 0, 0, false, false, 300 * ms, 0},
		// Urgent requests arriving at 10 and 20 a second: 1.1 and 2.2 of
		// them during its 110ms prefill; the endpoint it goes to keeps no room.
		{"two endpoints keep room for the two urgent requests its prefill may meet", byPred, []*datalayer.Candidate{predicted(250, 110), predicted(260, 110), predicted(290, 110)}, 1500 * ms, 0, 0, true, false, 300 * ms, 10},
		{"two endpoints do not keep room for three", byPred, []*datalayer.Candidate{predicted(250, 110), predicted(260, 110), predicted(290, 110)}, 1500 * ms, 0, 0, false, false, 300 * ms, 20},
		{"a band target is held to the protection too", byPred, []*datalayer.Candidate{predicted(200, 110)}, 0, 250 * ms, 0, false, false, 300 * ms, 0},
		{"an SLO out of reach is refused whatever the protection", byPred, []*datalayer.Candidate{predicted(900, 300)}, 500 * ms, 0, 250 * ms, false, true, 300 * ms, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := tc.gate.Decide(tc.cands, tc.slo, tc.target, flowcontrol.Protection{SLO: tc.protect, PerSecond: tc.rate}, tc.waited, now)
			if v.Release != tc.release || (v.Refuse != nil) != tc.refuse {
				t.Fatalf("got %+v, want release %v refuse %v", v, tc.release, tc.refuse)
			}
			if tc.refuse && !errors.Is(v.Refuse, flowcontrol.ErrSLOUnreachable) {
				t.Fatalf("refused with %v", v.Refuse)
			}
		})
	}
}

// A request beyond its flow's share keeps room for the protected requests
// arriving while one could still wait for a place (the SLO less a
// prefill), counting what each endpoint could still take in turn within
// the SLO, and an endpoint with nothing ahead is not enough: it is served
// from what the others leave. Urgent requests with a 300ms SLO, prefills
// of 110ms, so 190ms of arrivals: an endpoint predicted at 110ms takes two
// more in time, the one it goes to one.
func TestGateKeepsRoomOverTheSLOBeyondAShare(t *testing.T) {
	t.Parallel()
	gate := flowcontrol.Gate{ByPrediction: true}
	ms := time.Millisecond
	idle := func(n int) []*datalayer.Candidate {
		var cs []*datalayer.Candidate
		for range n {
			cs = append(cs, predicted(110, 110))
		}
		return cs
	}
	for _, tc := range []struct {
		name           string
		cands          []*datalayer.Candidate
		rate           float64
		within, beyond bool
	}{
		// 30 a second: 6 in 190ms; seven places left (1 + 2 + 2 + 2).
		{"four endpoints at 110ms keep room for 30 a second", idle(4), 30, true, true},
		// 40 a second: 8 in 190ms.
		{"but not for 40 a second beyond a share", idle(4), 40, true, false},
		// 10 a second: 2 in 190ms, one place left; within a share the
		// endpoint with nothing ahead releases.
		{"one endpoint with nothing ahead", idle(1), 10, true, false},
		{"one endpoint with one prefill ahead keeps no room", []*datalayer.Candidate{predicted(220, 110), predicted(400, 110)}, 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for beyond, want := range map[bool]bool{false: tc.within, true: tc.beyond} {
				p := flowcontrol.Protection{SLO: 300 * ms, PerSecond: tc.rate, Beyond: beyond}
				if v := gate.Decide(tc.cands, 1500*ms, 0, p, 0, time.Now()); v.Release != want || v.Refuse != nil {
					t.Errorf("beyond its share %v: got %+v, want release %v", beyond, v, want)
				}
			}
		})
	}
}

// A waiting request is released by the kick of a response that ended and
// lowered the predicted TTFT, and only then.
func TestReleaseWhenAnEndpointIsPredictedInTime(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{})
	var mu sync.Mutex
	cand := predicted(800, 100) // loaded: 800ms predicted with what is ahead
	gate := flowcontrol.Gate{ByPrediction: true}
	var checks int
	req := &flowcontrol.Request{SLO: 500 * time.Millisecond, Check: func(time.Duration) flowcontrol.Verdict {
		mu.Lock()
		defer mu.Unlock()
		checks++
		// The check is given no wait so that the test does not depend on
		// how long the machine takes.
		return gate.Decide([]*datalayer.Candidate{cand}, 500*time.Millisecond, 0, flowcontrol.Protection{}, 0, time.Now())
	}}
	r.enqueue(t, context.Background(), "slo", req)
	r.c.Kick()
	mu.Lock()
	if err := r.err("slo"); err.Error() != "still waiting" {
		t.Fatalf("released while predicted late: %v", err)
	}
	cand = predicted(300, 100) // a response ended: the load ahead went
	mu.Unlock()
	r.c.Kick()
	r.wg.Wait()
	if err := r.err("slo"); err != nil {
		t.Fatal(err)
	}
}

func TestAnSLOOutOfReachIsRefusedBeforeItsTTL(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{DefaultTTL: time.Hour})
	req := r.request("x", "", 0)
	req.SLO, req.GiveUp = 50*time.Millisecond, 10*time.Millisecond
	err := r.c.Wait(context.Background(), req)
	if !errors.Is(err, flowcontrol.ErrSLOUnreachable) || flowcontrol.OutcomeOf(err) != flowcontrol.OutcomeRejectedSLO {
		t.Fatalf("got %v", err)
	}
}
