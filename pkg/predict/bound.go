package predict

import (
	"errors"
	"math"
)

// A Linear is one linear model over the predictor's features for one
// target, fitted offline to a whole trace for the least mean absolute
// percentage error. It is not a predictor the EPP runs (it learns nothing
// online, and has no regimes, endpoints or quantile): it measures how far
// the features can go. Fitted on a training trace and scored on a
// held-apart one, it is what a model of the features that had seen all of
// the training trace at once would score; fitted on the very trace it is
// scored on, about the best any linear model of these features can score
// there (the reweighting comes close to the least absolute relative
// error, not exactly to it): a bound for online models, which must learn
// as they go.
type Linear struct {
	ttft  bool
	seats int
	coef  Vector
}

// FitLinear fits a Linear for TTFT (ttft) or TPOT on the samples that
// have that target, by iteratively reweighted least squares: a fit for
// relative squared error, then each sample weighted by one over its
// latency times its absolute residual (floored at linearResidualFloor of
// its latency), which converges to the least absolute relative error.
func FitLinear(trace []Sample, ttft bool) (Linear, error) {
	l := Linear{ttft: ttft}
	for i := range trace {
		if !trace[i].Input.MetricsStale {
			l.seats = max(l.seats, trace[i].Input.Running)
		}
	}
	xs, ys := l.rows(trace)
	if len(ys) == 0 {
		return l, errors.New("predict: no sample has the target")
	}
	var coef Vector
	var free [NumFeatures]bool // none held: every coefficient is fitted
	for it := range linearRounds {
		// The weighted normal equations, symmetric positive definite with
		// the ridge, solved as the online learner solves its own.
		var m [NumFeatures]Vector
		var rhs Vector
		for n := range xs {
			x, y := &xs[n], ys[n]
			w := 1 / (y * y)
			if it > 0 {
				w = 1 / (y * math.Max(math.Abs(dot(&coef, x)-y), linearResidualFloor*y))
			}
			for i := range NumFeatures {
				rhs[i] += w * x[i] * y
				for j := range NumFeatures {
					m[i][j] += w * x[i] * x[j]
				}
			}
		}
		for i := range NumFeatures {
			// A feature the trace never sets gets a zero coefficient.
			m[i][i] += 1e-9 * (1 + m[i][i])
		}
		next, ok := solveFree(&m, &rhs, &free)
		if !ok {
			return l, errors.New("predict: the trace's features are degenerate")
		}
		coef = next
	}
	l.coef = coef
	return l, nil
}

// linearRounds are FitLinear's reweighted solves; linearResidualFloor
// bounds the weight of a sample fitted almost exactly.
const (
	linearRounds        = 30
	linearResidualFloor = 0.01
)

// MAPE is l's mean absolute percentage error on the samples of trace that
// have its target, and how many those are.
func (l Linear) MAPE(trace []Sample) (mape float64, n int) {
	xs, ys := l.rows(trace)
	var sum float64
	for i := range xs {
		sum += math.Abs(max(dot(&l.coef, &xs[i]), floorMs)-ys[i]) / ys[i]
	}
	if len(ys) == 0 {
		return 0, 0
	}
	return sum / float64(len(ys)), len(ys)
}

// rows are the feature vectors and latencies of trace's samples with l's
// target (latencies above the floor).
func (l Linear) rows(trace []Sample) ([]Vector, []float64) {
	var xs []Vector
	var ys []float64
	for i := range trace {
		s := &trace[i]
		var x Vector
		y := s.TPOTMs
		if l.ttft {
			if !s.HasTTFT {
				continue
			}
			s.Input.TTFTFeatures(&x, l.seats)
			y = s.TTFTMs
		} else {
			if !s.HasTPOT {
				continue
			}
			s.Input.TPOTFeatures(&x, l.seats)
		}
		if !(y >= floorMs) || math.IsInf(y, 0) {
			continue
		}
		xs, ys = append(xs, x), append(ys, y)
	}
	return xs, ys
}
