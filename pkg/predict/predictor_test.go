package predict

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// world is a synthetic endpoint whose latency is a known function of the
// inputs, with multiplicative noise.
type world struct {
	rng   *rand.Rand
	slow  float64 // 1 normally; 2 for an endpoint that slowed down
	noise float64
	// tpotScale multiplies TPOT (0: 1): what the features do not see.
	tpotScale float64
}

func (w *world) input() Input {
	in := Input{InputTokens: 200 + w.rng.IntN(6000), Running: w.rng.IntN(8), KVUsage: w.rng.Float64()}
	in.GPUTokens = w.rng.IntN(in.InputTokens)
	if w.rng.IntN(3) == 0 {
		in.CPUTokens = w.rng.IntN(in.InputTokens - in.GPUTokens)
	}
	if w.rng.IntN(2) == 0 {
		in.Waiting = 1 + w.rng.IntN(6)
		in.Prefilling = in.Waiting
		in.PrefillTokens = in.Waiting * (100 + w.rng.IntN(2000))
	}
	in.Decoding = in.Running
	return in
}

// truth is the latency the world gives: prefill of the uncached tokens,
// loads, the queue's prefill work, the batch.
func (w *world) truth(in Input) (ttft, tpot float64) {
	ttft = w.slow * (12 + 0.06*float64(in.Uncached()) + 0.01*float64(in.CPUTokens) +
		0.05*float64(in.PrefillTokens) + 15*float64(in.Waiting) + 1.5*float64(in.Running))
	tpot = w.slow * (8 + 0.4*float64(in.Running) + 0.2*float64(in.Waiting))
	if w.tpotScale != 0 {
		tpot *= w.tpotScale
	}
	n := func() float64 { return 1 + w.noise*(w.rng.Float64()*2-1) }
	return ttft * n(), tpot * n()
}

func newTestPredictor(t testing.TB, o Options) *Predictor {
	t.Helper()
	o.Synchronous = true
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// accuracy is the mean absolute percentage error of the mean prediction
// and the share of observations at or under the quantile, over n fresh
// draws, learning from each after it is scored.
func accuracy(p *Predictor, w *world, addr string, n int) (mape, coverage float64) {
	var ape, covered float64
	for range n {
		in := w.input()
		ttft, tpot := w.truth(in)
		pr := p.Predict(addr, &in)
		ape += math.Abs(pr.TTFT-ttft) / ttft
		if ttft <= pr.TTFTQuantile {
			covered++
		}
		p.Observe(Sample{Endpoint: addr, Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
	}
	return ape / float64(n), covered / float64(n)
}

func TestLearningAKnownRelationRecoversIt(t *testing.T) {
	t.Parallel()
	for _, method := range Methods {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			p := newTestPredictor(t, Options{Method: method})
			p.AddEndpoint("a", "")
			w := &world{rng: rand.New(rand.NewPCG(1, 2)), slow: 1, noise: 0.1}
			accuracy(p, w, "a", 3000) // warm-up
			mape, cov := accuracy(p, w, "a", 2000)
			// Noise of ±10% uniform: 5% mean absolute error is the floor.
			if mape > 0.08 {
				t.Errorf("TTFT MAPE after learning = %.1f%%, want ≤ 8%%", 100*mape)
			}
			if cov < 0.85 || cov > 0.95 {
				t.Errorf("p90 coverage = %.1f%%, want 85-95%%", 100*cov)
			}
		})
	}
}

func TestTheEWLSModelRecoversTheCoefficientsThemselves(t *testing.T) {
	t.Parallel()
	p := newTestPredictor(t, Options{Memory: 2000})
	p.AddEndpoint("a", "")
	w := &world{rng: rand.New(rand.NewPCG(3, 4)), slow: 1}
	accuracy(p, w, "a", 3000) // no noise: the relation is exactly linear
	in := Input{InputTokens: 4000, GPUTokens: 1000}
	want, _ := w.truth(in)
	if got := p.Predict("a", &in).TTFT; math.Abs(got-want) > 0.01*want {
		t.Errorf("3000 uncached tokens on an idle endpoint: predicted %.2fms, truth %.2fms", got, want)
	}
}

func TestAFleetChangeIsLearnedAgainWithinBoundedObservations(t *testing.T) {
	t.Parallel()
	for _, method := range Methods {
		t.Run(method, func(t *testing.T) {
			t.Parallel()
			p := newTestPredictor(t, Options{Method: method})
			p.AddEndpoint("a", "")
			w := &world{rng: rand.New(rand.NewPCG(5, 6)), slow: 1, noise: 0.05}
			accuracy(p, w, "a", 3000)
			w.slow = 2 // the engine slows down mid-run
			const window, bound = 50, 300
			recovered := -1
			for n := window; n <= 2000; n += window {
				if mape, _ := accuracy(p, w, "a", window); mape < 0.1 {
					recovered = n
					break
				}
			}
			if recovered < 0 || recovered > bound {
				t.Errorf("after the engine slowed, MAPE was back under 10%% after %d observations; want ≤ %d", recovered, bound)
			}
		})
	}
}

func TestPredictionsAreNeverNaNOrNegative(t *testing.T) {
	t.Parallel()
	p := newTestPredictor(t, Options{})
	p.AddEndpoint("a", "")
	// Observations a broken response path could produce, learned or refused.
	for _, y := range []float64{math.NaN(), math.Inf(1), -5, 0, 1e12} {
		p.Observe(Sample{Endpoint: "a", Input: Input{InputTokens: 10}, TTFTMs: y, TPOTMs: y, HasTTFT: true, HasTPOT: true})
	}
	for _, in := range []Input{
		{},
		{InputTokens: -100, GPUTokens: 5000, Waiting: -3},
		{InputTokens: 1 << 30, Waiting: 1 << 20, Running: 1 << 20, KVUsage: math.NaN()},
		{InputTokens: 100, KVUsage: math.Inf(1), MetricsStale: true},
	} {
		for _, addr := range []string{"a", "unknown"} {
			pr := p.Predict(addr, &in)
			for _, v := range []float64{pr.TTFT, pr.TTFTQuantile, pr.TPOT, pr.TPOTQuantile} {
				if !(v >= 0) || math.IsInf(v, 0) {
					t.Errorf("Predict(%s, %+v) = %+v", addr, in, pr)
				}
			}
		}
	}
}

func TestARestartStartsFromThePrior(t *testing.T) {
	t.Parallel()
	prior := DefaultPrior()
	prior.TTFTPerUncachedTokenMs = 0.1
	in := Input{InputTokens: 3000, Running: 2}
	fresh := newTestPredictor(t, Options{Prior: &prior})
	before := fresh.Predict("a", &in)
	if want := prior.TTFTBaseMs + 0.1*3000; math.Abs(before.TTFT-want) > 1e-9 {
		t.Errorf("a fresh predictor predicts %.3fms, want the prior's %.3fms", before.TTFT, want)
	}
	fresh.AddEndpoint("a", "")
	w := &world{rng: rand.New(rand.NewPCG(7, 8)), slow: 1}
	accuracy(fresh, w, "a", 500)
	if fresh.Predict("a", &in) == before {
		t.Fatal("learning changed nothing")
	}
	restarted := newTestPredictor(t, Options{Prior: &prior})
	restarted.AddEndpoint("a", "")
	if got := restarted.Predict("a", &in); got != before {
		t.Errorf("after a restart: %+v, want the prior's %+v", got, before)
	}
}

func TestANewEndpointStartsFromItsClass(t *testing.T) {
	t.Parallel()
	p := newTestPredictor(t, Options{ClassMinObservations: 200})
	p.AddEndpoint("a", "h100")
	w := &world{rng: rand.New(rand.NewPCG(9, 10)), slow: 2}
	accuracy(p, w, "a", 1000)
	p.AddEndpoint("b", "h100")
	p.AddEndpoint("c", "l4")
	in := Input{InputTokens: 3000}
	want, _ := w.truth(in)
	if got := p.Predict("b", &in).TTFT; math.Abs(got-want) > 0.05*want {
		t.Errorf("a new h100 endpoint predicts %.1fms, want its class's %.1fms", got, want)
	}
	if got, prior := p.Predict("c", &in).TTFT, p.Predict("nobody", &in).TTFT; got != prior {
		t.Errorf("a new endpoint of an unseen class predicts %.1fms, want the prior's %.1fms", got, prior)
	}
	p.RemoveEndpoint("a")
	before := p.Observations("a")
	p.Observe(Sample{Endpoint: "a", Input: in, TTFTMs: 1, HasTTFT: true})
	if before != 0 || p.Observations("a") != 0 {
		t.Error("a removed endpoint still learns")
	}
}

func TestAnEndpointWithFewObservationsIsPredictedByItsClass(t *testing.T) {
	t.Parallel()
	p := newTestPredictor(t, Options{OwnMinObservations: 20})
	p.AddEndpoint("seen", "h100")
	p.AddEndpoint("unseen", "h100")
	p.AddEndpoint("other", "l4")
	w := &world{rng: rand.New(rand.NewPCG(11, 12)), slow: 3}
	in := Input{InputTokens: 3000, GPUTokens: 1000}
	prior := p.Predict("other", &in)
	for i := range 19 {
		obs := w.input()
		ttft, tpot := w.truth(obs)
		p.Observe(Sample{Endpoint: "seen", Input: obs, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
		seen, unseen := p.Predict("seen", &in), p.Predict("unseen", &in)
		if seen != unseen {
			t.Fatalf("after %d observations: the observed endpoint predicts %+v, its unobserved classmate %+v; want both the class's", i+1, seen, unseen)
		}
	}
	if got := p.Predict("unseen", &in); got == prior {
		t.Error("the class learned nothing from its endpoint's observations")
	}
	if got := p.Predict("other", &in); got != prior {
		t.Errorf("an endpoint of another class predicts %+v, want the prior's %+v", got, prior)
	}
	obs := w.input()
	ttft, tpot := w.truth(obs)
	p.Observe(Sample{Endpoint: "seen", Input: obs, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
	// The classmate's observation is of the very input predicted, so the
	// class's prediction of it moves; the endpoint's own does not.
	p.Observe(Sample{Endpoint: "unseen", Input: in, TTFTMs: 1, TPOTMs: 1, HasTTFT: true, HasTPOT: true})
	if p.Predict("seen", &in) == p.Predict("unseen", &in) {
		t.Error("after 20 observations the endpoint's own model is not the one predicting")
	}
}

func TestObservationsAreLearnedOffThePathByRun(t *testing.T) {
	t.Parallel()
	p, err := New(Options{Queue: 8})
	if err != nil {
		t.Fatal(err)
	}
	p.AddEndpoint("a", "")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	w := &world{rng: rand.New(rand.NewPCG(11, 12)), slow: 1}
	sent := 0
	for range 100 {
		in := w.input()
		ttft, _ := w.truth(in)
		p.Observe(Sample{Endpoint: "a", Input: in, TTFTMs: ttft, HasTTFT: true})
		sent++
		testkit.WaitFor(t, "the observation to be learned", func() error {
			if seen := p.Observations("a"); seen != sent {
				return fmt.Errorf("p.Observations(\"a\") is %v, want %v", seen, sent)
			}
			return nil
		})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestBadOptionsAreRefused(t *testing.T) {
	t.Parallel()
	bad := DefaultPrior()
	bad.TTFTBaseMs = -1
	for name, o := range map[string]Options{
		"a quantile of 1":      {Quantile: 1},
		"an unknown method":    {Method: "magic"},
		"a negative prior":     {Prior: &bad},
		"a quantile below one": {Quantile: -0.5},
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s was accepted", name)
		}
	}
}

func TestPredictAllocatesNothing(t *testing.T) {
	p := newTestPredictor(t, Options{})
	p.AddEndpoint("10.0.0.1:8000", "")
	in := Input{InputTokens: 4000, GPUTokens: 3000, Waiting: 2, Running: 5, KVUsage: 0.4, Prefilling: 1, PrefillTokens: 900}
	if n := testing.AllocsPerRun(1000, func() { _ = p.Predict("10.0.0.1:8000", &in) }); n != 0 {
		t.Errorf("Predict allocates %.1f times per call, want 0", n)
	}
}

func TestPredictionsSkipOnlyFeaturesThatAreZero(t *testing.T) {
	t.Parallel()
	// Each subtest draws from its own generator: they run in parallel.
	anyInput := func(rng *rand.Rand) Input {
		in := Input{
			InputTokens: rng.IntN(40000), GPUTokens: rng.IntN(9000), CPUTokens: rng.IntN(3000), StorageTokens: rng.IntN(2000),
			SpeculativeTokens: rng.IntN(1000), Waiting: rng.IntN(9), Running: rng.IntN(40), KVUsage: rng.Float64() * 1.2,
			MetricsStale: rng.IntN(4) == 0, Prefilling: rng.IntN(6), PrefillTokens: rng.IntN(30000), Decoding: rng.IntN(40),
			DecodeTokens: rng.IntN(200000), MaxTokens: rng.IntN(2000),
			OldestPrefillMs: rng.Float64() * 3000, PrefillAheadMs: rng.Float64() * 4000,
			StepRestMs: rng.Float64() * 300, RecentPrefillRate: rng.Float64() * 1e5,
		}
		if rng.IntN(4) != 0 {
			in.Ahead = enginesched.Ahead{Steps: rng.IntN(500), DecodeSteps: rng.IntN(500), SeqSteps: rng.IntN(5000),
				DecodeContext: rng.Int64N(1e8), PrefillTokens: rng.IntN(40000), PrefillContext: rng.Int64N(1e10),
				Decoding: rng.IntN(64), DecodingContext: rng.Int64N(1e7), Budget: rng.IntN(16384), FirstChunk: rng.IntN(16384)}
		}
		in.DecodeEnds = rng.IntN(DecodeEndsKept + 1)
		for i := range in.DecodeEnds {
			in.DecodeEndsMs[i] = float64(i+1) * rng.Float64() * 1000
		}
		in.EndedN = rng.IntN(EndedKept + 1)
		for i := range in.EndedN {
			in.EndedAgoMs[i] = rng.Float64() * 2500
		}
		return in
	}
	for _, method := range Methods {
		t.Run(method+": every feature past the ones filled is zero, and predictions are the full products'", func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(5, 5))
			p := newTestPredictor(t, Options{Synchronous: true, Method: method})
			p.AddEndpoint("a", "")
			w := &world{rng: rand.New(rand.NewPCG(6, 6)), slow: 1, noise: 0.2}
			for range 300 {
				in := w.input()
				ttft, tpot := w.truth(in)
				p.Observe(Sample{Endpoint: "a", Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
			}
			s := (*p.models.Load())["a"].snap.Load()
			if !s.ttft.finite || !s.tpot.finite {
				t.Fatal("a learned model's coefficients are not all finite")
			}
			for range 2000 {
				in := anyInput(rng)
				seats := rng.IntN(20)
				var x Vector
				in.TTFTFeatures(&x, seats)
				zeroFrom(t, "TTFT", &x, ttftFeatures)
				in.cachedAfterWait(&x)
				r := in.Regime(seats)
				var want Prediction
				want.TTFT, want.TTFTQuantile = s.ttft.predict(&x, r, p.o.Quantile, NumFeatures)
				alone(&x)
				zeroFrom(t, "alone", &x, aloneFeatures)
				want.TTFTAlone, _ = s.ttft.predict(&x, RegimeIdle, p.o.Quantile, NumFeatures)
				want.TTFTAlone = min(want.TTFTAlone, want.TTFT)
				in.TPOTFeatures(&x, seats)
				zeroFrom(t, "TPOT", &x, tpotFeatures)
				want.TPOT, want.TPOTQuantile = s.tpot.predict(&x, r, p.o.Quantile, NumFeatures)
				// Predict with these seats as the endpoint's learned ones.
				snap := *s
				snap.seats = seats
				(*p.models.Load())["a"].snap.Store(&snap)
				if got := p.Predict("a", &in); got != want {
					t.Fatalf("Predict(%+v) = %+v, want the full products' %+v", in, got, want)
				}
			}
		})
	}
}

func zeroFrom(t *testing.T, what string, x *Vector, n int) {
	t.Helper()
	for i := n; i < NumFeatures; i++ {
		if x[i] != 0 {
			t.Fatalf("%s feature %d = %v, past the %d it is said to fill", what, i, x[i], n)
		}
	}
}

// A monotone coefficient must belong to a feature: a mask that names a slot
// no feature sets constrains nothing, and leaves the feature it meant free.
func TestEveryMonotoneFeatureIsOneTheFeaturesSet(t *testing.T) {
	in := Input{
		InputTokens: 4000, GPUTokens: 1000, CPUTokens: 500, StorageTokens: 250, SpeculativeTokens: 100,
		Waiting: 3, Running: 6, KVUsage: 0.5,
		Prefilling: 2, PrefillTokens: 3000, Decoding: 5, DecodeTokens: 20000, MaxTokens: 64,
		DecodeEndsMs: [DecodeEndsKept]float64{40}, DecodeEnds: 1, OldestPrefillMs: 30, PrefillAheadMs: 50,
		Ahead: enginesched.Ahead{Steps: 3, DecodeSteps: 2, SeqSteps: 6, DecodeContext: 1e5, PrefillTokens: 900, PrefillContext: 1e6,
			Decoding: 3, DecodingContext: 30000, Budget: 2048, FirstChunk: 100},
		StepRestMs: 5, RecentPrefillRate: 2000,
	}
	for _, tt := range []struct {
		name     string
		features func(*Vector, int)
		monotone [NumFeatures]bool
	}{
		{"TTFT", in.TTFTFeatures, ttftMonotone},
		{"TPOT", in.TPOTFeatures, tpotMonotone},
	} {
		var v Vector
		tt.features(&v, 4) // a batch of 4 seats: full, so every queue feature is set
		for i, m := range tt.monotone {
			if m && v[i] == 0 {
				t.Errorf("%s: feature %d is constrained to be monotone, but no feature is set there (%v)", tt.name, i, v)
			}
		}
	}
}

// Pairs evaluated together score as one: every test observation of every
// pair counted once, each pair by a predictor trained on its own trace
// only, so that pooling is the same as evaluating each and weighing them
// by their observations.
func TestEvaluatingPairsPoolsEachPairsScores(t *testing.T) {
	trace := func(seed uint64, n int, slow float64) []Sample {
		w := &world{rng: rand.New(rand.NewPCG(seed, 1)), slow: slow, noise: 0.1}
		out := make([]Sample, n)
		for i := range out {
			in := w.input()
			ttft, tpot := w.truth(in)
			out[i] = Sample{Endpoint: "e", Class: "c", Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: i%2 == 0}
		}
		return out
	}
	// The second pair's endpoint is twice as slow: a predictor carried
	// over from the first would be far off.
	pairs := []TracePair{
		{Train: trace(1, 300, 1), Test: trace(2, 100, 1)},
		{Train: trace(3, 300, 2), Test: trace(4, 300, 2)},
	}
	pooled, each, err := EvaluatePairs(Options{}, pairs, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(each) != 2 {
		t.Fatalf("%d evaluations, want one per pair", len(each))
	}
	for i, pair := range pairs {
		alone, err := Evaluate(Options{}, pair.Train, pair.Test, true)
		if err != nil {
			t.Fatal(err)
		}
		if alone != each[i] {
			t.Fatalf("pair %d: %v within the pool, %v alone", i, each[i], alone)
		}
	}
	for _, tc := range []struct {
		what         string
		pooled, a, b Accuracy
	}{{"TTFT", pooled.TTFT, each[0].TTFT, each[1].TTFT}, {"TPOT", pooled.TPOT, each[0].TPOT, each[1].TPOT}} {
		n := tc.a.N + tc.b.N
		mape := (tc.a.MAPE*float64(tc.a.N) + tc.b.MAPE*float64(tc.b.N)) / float64(n)
		cov := (tc.a.Coverage*float64(tc.a.N) + tc.b.Coverage*float64(tc.b.N)) / float64(n)
		if tc.pooled.N != n || math.Abs(tc.pooled.MAPE-mape) > 1e-12 || math.Abs(tc.pooled.Coverage-cov) > 1e-12 {
			t.Fatalf("%s pooled %v, want n=%d MAPE %.4f coverage %.4f", tc.what, tc.pooled, n, mape, cov)
		}
		if tc.a.MAPE > 0.1 || tc.b.MAPE > 0.1 {
			t.Fatalf("%s: each pair's own predictor should fit its world: %v, %v", tc.what, tc.a, tc.b)
		}
	}
}

// A timed trace is replayed as the EPP lived it: each prediction made at
// its request's start, having learned from exactly the responses that had
// ended before then, none that ended later or at that instant (a request
// decoding beside it, or its own); an untimed one in its order, each
// sample learned right after it is predicted. Without learning, every
// sample is predicted, in order.
func TestATimedTraceIsReplayedWithoutLearningAnOutcomeBeforeItsEnd(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	rng := rand.New(rand.NewPCG(7, 7))
	trace := make([]Sample, 200)
	for i := range trace {
		start := rng.IntN(10000)
		// Recorded as a trace is, in order of End; some overlap many
		// others, some end at another's very start.
		trace[i] = Sample{Endpoint: fmt.Sprint(i), Start: at(start), End: at(start + rng.IntN(4)*rng.IntN(500))}
	}
	slices.SortStableFunc(trace, func(a, b Sample) int { return a.End.Compare(b.End) })
	for _, timed := range []bool{true, false} {
		tr := slices.Clone(trace)
		if !timed {
			for i := range tr {
				tr[i].Start, tr[i].End = time.Time{}, time.Time{}
			}
		}
		learned := map[string]bool{}
		var predicted []string
		var lastStart time.Time
		replay(tr, true, func(s *Sample) {
			predicted = append(predicted, s.Endpoint)
			if !timed {
				if len(learned) != len(predicted)-1 {
					t.Fatalf("untimed: %d learned before the %d-th prediction, want every sample before it", len(learned), len(predicted))
				}
				return
			}
			if s.Start.Before(lastStart) {
				t.Fatalf("predicted at %v after one at %v: not in order of start", s.Start, lastStart)
			}
			lastStart = s.Start
			for _, o := range trace {
				if ended := o.End.Before(s.Start); learned[o.Endpoint] != ended {
					t.Fatalf("predicting the request started at %v: learned %v of one that ended at %v", s.Start, learned[o.Endpoint], o.End)
				}
			}
		}, func(s *Sample) {
			if learned[s.Endpoint] {
				t.Fatalf("%s learned twice", s.Endpoint)
			}
			learned[s.Endpoint] = true
		})
		if len(predicted) != len(trace) {
			t.Fatalf("timed %v: %d predictions, want %d", timed, len(predicted), len(trace))
		}
	}
	var frozen []string
	replay(trace, false, func(s *Sample) { frozen = append(frozen, s.Endpoint) }, func(*Sample) { t.Fatal("learned while frozen") })
	for i := range trace {
		if frozen[i] != trace[i].Endpoint {
			t.Fatalf("frozen: prediction %d of %s, want the trace's order", i, frozen[i])
		}
	}
}

// TPOT is predicted by whichever of the endpoint's own model and its
// class's has lately erred less on the endpoint's observations: the
// class's for an endpoint like its classmates but seldom observed itself,
// while the whole fleet's TPOT moves with what its features do not see
// (the class, observed on every endpoint, follows it sooner); its own for
// one unlike them (an engine twice as slow as its classmates).
func TestTPOTIsPredictedByTheClassOnlyWhereItPredictsTheEndpointBetter(t *testing.T) {
	t.Parallel()
	for seed := range uint64(3) {
		p := newTestPredictor(t, Options{})
		class := map[string]string{"a": "alike", "b": "alike", "rare": "alike", "d": "unlike", "e": "unlike", "slow": "unlike"}
		worlds := map[string]*world{}
		for i, addr := range slices.Sorted(maps.Keys(class)) {
			p.AddEndpoint(addr, class[addr])
			worlds[addr] = &world{rng: rand.New(rand.NewPCG(seed, uint64(i))), slow: 1, noise: 0.3}
		}
		worlds["slow"].slow = 2
		observe := func(addr string) {
			w := worlds[addr]
			in := w.input()
			ttft, tpot := w.truth(in)
			p.Observe(Sample{Endpoint: addr, Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
		}
		for i := range 2000 {
			// The fleet's TPOT swings by a third over 1000 rounds.
			for _, w := range worlds {
				w.tpotScale = 1 + math.Sin(2*math.Pi*float64(i)/1000)/3
			}
			for _, addr := range []string{"a", "b", "d", "e", "slow"} {
				observe(addr)
			}
			if i%20 == 0 {
				observe("rare")
			}
		}
		fromClass := func(addr string) bool { return (*p.models.Load())[addr].snap.Load().tpotFromClass }
		if !fromClass("rare") {
			t.Errorf("seed %d: an endpoint like its class, observed a twentieth as often, predicts its TPOT by its own model", seed)
		}
		if fromClass("slow") {
			t.Errorf("seed %d: an engine twice as slow as its class predicts its TPOT by the class's model", seed)
		}
		// The slow engine's TPOT predictions are its own, within the noise.
		w := worlds["slow"]
		w.tpotScale = 1
		var ape float64
		for range 500 {
			in := w.input()
			_, tpot := w.truth(in)
			ape += math.Abs(p.Predict("slow", &in).TPOT-tpot) / tpot
		}
		if mape := ape / 500; mape > 0.25 {
			t.Errorf("seed %d: the slow engine's TPOT MAPE %.1f%%, want ≤ 25%% (±30%% noise; its class's model errs by about half)", seed, 100*mape)
		}
	}
}

// TPOT counts the endpoint's recent ends by age, in bins each twice as
// wide as the one before; an end older than the last bin, or of no known
// age, counts in none.
func TestTPOTCountsTheRecentEndsByAge(t *testing.T) {
	t.Parallel()
	in := Input{EndedAgoMs: [EndedKept]float64{0, 99, 150, 300, 799, 1000, 1600, math.NaN()}, EndedN: EndedKept}
	var v Vector
	in.TPOTFeatures(&v, 0)
	if got, want := v[tpotEndedFrom:tpotEndedFrom+endedBins], []float64{2, 1, 1, 1, 1}; !slices.Equal(got, want) {
		t.Errorf("ends by age %v, want %v", got, want)
	}
	in.EndedN = 2
	in.TPOTFeatures(&v, 0)
	if got, want := v[tpotEndedFrom:tpotEndedFrom+endedBins], []float64{2, 0, 0, 0, 0}; !slices.Equal(got, want) {
		t.Errorf("with two ends known: %v, want %v", got, want)
	}
}

func TestSpeculativeTokensAreNotARequestsOwnEngineTime(t *testing.T) {
	t.Parallel()
	p, err := New(Options{Synchronous: true})
	if err != nil {
		t.Fatal(err)
	}
	// An earlier request is computing the first 2560 tokens: the
	// request's own prefill is its 64-token tail, as if they were held.
	spec := Input{InputTokens: 2624, SpeculativeTokens: 2560}
	held := Input{InputTokens: 2624, GPUTokens: 2560}
	s, h := p.Predict("10.0.0.1:8000", &spec), p.Predict("10.0.0.1:8000", &held)
	if s.TTFTAlone != h.TTFTAlone {
		t.Errorf("alone: %.1fms with the prefix being computed, %.1fms with it held", s.TTFTAlone, h.TTFTAlone)
	}
	if !(s.TTFT >= h.TTFT) {
		t.Errorf("TTFT %.1fms with the prefix being computed, below %.1fms with it held", s.TTFT, h.TTFT)
	}
}
