package predict

import (
	"fmt"
	"math"
	"slices"
)

// Accuracy is how well one target was predicted over a trace.
type Accuracy struct {
	// N is the observations scored.
	N int
	// MAPE is the mean absolute percentage error of the mean prediction;
	// MedianAPE its median.
	MAPE, MedianAPE float64
	// Coverage is the share of observations at or under the predicted
	// quantile (0.9 for a well-calibrated p90).
	Coverage float64
}

// Evaluation is a method's accuracy on a held-apart trace.
type Evaluation struct {
	Method     string
	TTFT, TPOT Accuracy
}

// TracePair is a trace to train on and another, held apart, to score on.
type TracePair struct {
	Train, Test []Sample
}

// Evaluate trains a predictor with o on train, in order, then scores each
// observation of test against the prediction made before it: with learn,
// the predictor goes on learning from test as it is scored (prequential
// evaluation, as it runs in the EPP), without it the model is frozen after
// train. Learning on, test is replayed in time as the EPP lived it: each
// request predicted at its Start, having learned only from the responses
// that had ended before then (their End), so that no prediction draws on an
// outcome the EPP could not yet have seen, such as that of a request
// decoding beside it. (A trace without times is taken in its order, each
// prediction learning from every sample before it, which is optimistic.)
// Every endpoint in either trace gets a model of its own, of its recorded
// class.
func Evaluate(o Options, train, test []Sample, learn bool) (Evaluation, error) {
	ev, _, err := EvaluatePairs(o, []TracePair{{Train: train, Test: test}}, learn)
	return ev, err
}

// EvaluatePairs evaluates each pair as Evaluate does, a fresh predictor
// for each, and pools their scores: one held-apart trace's error moves by
// a point or more with its seed, several pooled by much less. It returns
// the pooled evaluation and each pair's.
func EvaluatePairs(o Options, pairs []TracePair, learn bool) (Evaluation, []Evaluation, error) {
	o.Synchronous, o.Record, o.Registerer = true, nil, nil
	var allTT, allTP scorer
	each := make([]Evaluation, 0, len(pairs))
	method := o.Method
	for _, pair := range pairs {
		var tt, tp scorer
		p, err := New(o)
		if err != nil {
			return Evaluation{}, nil, err
		}
		method = p.Method()
		for _, tr := range [][]Sample{pair.Train, pair.Test} {
			for _, s := range tr {
				p.AddEndpoint(s.Endpoint, s.Class)
			}
		}
		for _, s := range pair.Train {
			p.Observe(s)
		}
		replay(pair.Test, learn, func(s *Sample) {
			pr := p.Predict(s.Endpoint, &s.Input)
			if s.HasTTFT {
				tt.add(pr.TTFT, pr.TTFTQuantile, s.TTFTMs)
			}
			if s.HasTPOT {
				tp.add(pr.TPOT, pr.TPOTQuantile, s.TPOTMs)
			}
		}, func(s *Sample) { p.Observe(*s) })
		allTT.merge(&tt)
		allTP.merge(&tp)
		each = append(each, Evaluation{Method: method, TTFT: tt.accuracy(), TPOT: tp.accuracy()})
	}
	return Evaluation{Method: method, TTFT: allTT.accuracy(), TPOT: allTP.accuracy()}, each, nil
}

// replay calls predict for each sample of trace and, with learn,
// learnFrom for each: in time when every sample has its Start and End
// (each prediction at its Start, in order of Start, after learning every
// sample whose End is before it, never its own), else in the trace's
// order, each sample learned right after it is predicted.
func replay(trace []Sample, learn bool, predict, learnFrom func(*Sample)) {
	timed := learn
	for i := range trace {
		timed = timed && !trace[i].Start.IsZero() && !trace[i].End.IsZero()
	}
	if !timed {
		for i := range trace {
			predict(&trace[i])
			if learn {
				learnFrom(&trace[i])
			}
		}
		return
	}
	byStart, byEnd := make([]int, len(trace)), make([]int, len(trace))
	for i := range trace {
		byStart[i], byEnd[i] = i, i
	}
	slices.SortStableFunc(byStart, func(a, b int) int { return trace[a].Start.Compare(trace[b].Start) })
	slices.SortStableFunc(byEnd, func(a, b int) int { return trace[a].End.Compare(trace[b].End) })
	j := 0
	for _, i := range byStart {
		for ; j < len(byEnd) && trace[byEnd[j]].End.Before(trace[i].Start); j++ {
			learnFrom(&trace[byEnd[j]])
		}
		predict(&trace[i])
	}
}

type scorer struct {
	ape     []float64
	covered int
}

func (s *scorer) add(mean, quant, actual float64) {
	if !(actual > 0) {
		return
	}
	s.ape = append(s.ape, math.Abs(mean-actual)/actual)
	if actual <= quant {
		s.covered++
	}
}

func (s *scorer) merge(o *scorer) {
	s.ape = append(s.ape, o.ape...)
	s.covered += o.covered
}

func (s *scorer) accuracy() Accuracy {
	a := Accuracy{N: len(s.ape)}
	if a.N == 0 {
		return a
	}
	sum := 0.0
	for _, v := range s.ape {
		sum += v
	}
	a.MAPE = sum / float64(a.N)
	slices.Sort(s.ape)
	a.MedianAPE = s.ape[a.N/2]
	a.Coverage = float64(s.covered) / float64(a.N)
	return a
}

func (a Accuracy) String() string {
	return fmt.Sprintf("MAPE %.1f%%, median APE %.1f%%, coverage %.1f%% (n=%d)", 100*a.MAPE, 100*a.MedianAPE, 100*a.Coverage, a.N)
}
