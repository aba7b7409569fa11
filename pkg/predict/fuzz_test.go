package predict

import (
	"math"
	"testing"
)

// FuzzPredictionsAreFiniteAndNonNegative feeds a model arbitrary
// observations and asks it arbitrary questions: whatever it learned, no
// answer is NaN, infinite or negative.
func FuzzPredictionsAreFiniteAndNonNegative(f *testing.F) {
	f.Add(1000, 200, 0, 3, 4, 0.5, 2, 900, 120.0, 9.0)
	f.Add(-1, 1<<30, 5, -7, 0, math.NaN(), -3, -100, math.Inf(1), -2.0)
	f.Fuzz(func(t *testing.T, input, gpu, cpu, waiting, running int, kv float64, prefilling, prefillTokens int, ttft, tpot float64) {
		p, err := New(Options{Synchronous: true})
		if err != nil {
			t.Fatal(err)
		}
		p.AddEndpoint("a", "")
		in := Input{InputTokens: input, GPUTokens: gpu, CPUTokens: cpu, Waiting: waiting, Running: running, KVUsage: kv,
			Prefilling: prefilling, PrefillTokens: prefillTokens}
		for range 40 {
			p.Observe(Sample{Endpoint: "a", Input: in, TTFTMs: ttft, TPOTMs: tpot, HasTTFT: true, HasTPOT: true})
		}
		pr := p.Predict("a", &in)
		for _, v := range []float64{pr.TTFT, pr.TTFTQuantile, pr.TPOT, pr.TPOTQuantile} {
			if !(v >= 0) || math.IsInf(v, 0) {
				t.Fatalf("Predict(%+v) = %+v", in, pr)
			}
		}
	})
}
