package predict

import (
	"math"
	"testing"

	"github.com/kvroute/kvroute/pkg/enginesched"
)

// FuzzPredictionsAreFiniteAndNonNegative feeds a model arbitrary
// observations and asks it arbitrary questions: whatever it learned, no
// answer is NaN, infinite or negative.
func FuzzPredictionsAreFiniteAndNonNegative(f *testing.F) {
	f.Add(1000, 200, 0, 3, 4, 0.5, 2, 900, 5, 3, 40.0, 120.0, 9.0, 12, 3000, 500)
	f.Add(-1, 1<<30, 5, -7, 0, math.NaN(), -3, -100, -1, 99, math.NaN(), math.Inf(1), -2.0, -5, -1, -9)
	f.Add(4000, 0, 0, 0, 8, 1.0, 1, 256, 7, 7, math.Inf(1), 60.0, 11.0, 1<<40, 1<<62, 0)
	f.Fuzz(func(t *testing.T, input, gpu, cpu, waiting, running int, kv float64, prefilling, prefillTokens, decoding, ends int, endMs, ttft, tpot float64, steps, work, chunk int) {
		p, err := New(Options{Synchronous: true})
		if err != nil {
			t.Fatal(err)
		}
		p.AddEndpoint("a", "")
		in := Input{InputTokens: input, GPUTokens: gpu, CPUTokens: cpu, Waiting: waiting, Running: running, KVUsage: kv,
			Prefilling: prefilling, PrefillTokens: prefillTokens, Decoding: decoding, MaxTokens: 32,
			DecodeEnds: ends, OldestPrefillMs: endMs, PrefillAheadMs: endMs, StepRestMs: endMs, RecentPrefillRate: endMs,
			Ahead: enginesched.Ahead{Steps: steps, DecodeSteps: steps, SeqSteps: work, DecodeContext: int64(work), PrefillTokens: work,
				PrefillContext: int64(work) * int64(steps), Decoding: decoding, DecodingContext: int64(work), Budget: chunk, FirstChunk: chunk}}
		for i := range in.DecodeEndsMs {
			in.DecodeEndsMs[i] = endMs * float64(i)
		}
		in.EndedN = ends
		for i := range in.EndedAgoMs {
			in.EndedAgoMs[i] = endMs * float64(i)
		}
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
