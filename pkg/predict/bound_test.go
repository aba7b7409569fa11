package predict

import (
	"math"
	"math/rand/v2"
	"testing"
)

// A linear relation of TPOT to two of its features, with one sample in
// ten an outlier three times as slow: the least absolute relative error
// fit recovers the relation (the inliers' error near zero), where a
// least-squares fit would be pulled toward the outliers.
func TestFitLinearRecoversARelationDespiteOutliers(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 7))
	truth := func(in *Input) float64 { return 4 + 0.5*float64(in.Decoding) + 2*float64(in.InputTokens)/1e3 }
	var trace, inliers []Sample
	for i := range 2000 {
		in := Input{Decoding: rng.IntN(30), InputTokens: rng.IntN(8000), MetricsStale: true}
		s := Sample{Input: in, TPOTMs: truth(&in), HasTPOT: true}
		if i%10 == 0 {
			s.TPOTMs *= 3
		} else {
			inliers = append(inliers, s)
		}
		trace = append(trace, s)
	}
	l, err := FitLinear(trace, false)
	if err != nil {
		t.Fatal(err)
	}
	if mape, n := l.MAPE(inliers); n != len(inliers) || mape > 0.01 {
		t.Fatalf("inliers' MAPE %.4f over %d samples, want under 1%% over %d", mape, n, len(inliers))
	}
	if mape, _ := l.MAPE(trace); math.Abs(mape-0.1*2/3) > 0.01 {
		t.Fatalf("whole trace's MAPE %.4f, want about the outliers' share of 2/3: %.4f", mape, 0.1*2/3)
	}
	// The TTFT model of the same trace has nothing to fit.
	if _, err := FitLinear(trace, true); err == nil {
		t.Fatal("a TTFT fit of a trace without TTFTs succeeded")
	}
}
