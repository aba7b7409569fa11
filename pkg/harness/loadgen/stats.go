package loadgen

import (
	"math"
	"slices"
	"time"
)

// Sample is what one request saw.
type Sample struct {
	Start time.Duration // since the run began
	// TTFT and E2E; for a request cut off by the run's deadline they are
	// lower bounds (time until the cut) and Cut is set.
	TTFT, E2E    time.Duration
	Cut          bool
	PromptTokens int
	CachedTokens int
	OutputTokens int
	// SLO is the request's TTFT objective (zero: none); Shed marks a
	// request the EPP refused with 429, never served.
	SLO  time.Duration
	Shed bool
	Err  error
	// Engine is the index of the engine that served the request, in
	// virtual time; -1 where none did or it is not known.
	Engine int
	// Replica is the EPP replica (the gateway's ext_proc host) whose
	// stream the request passed; Bypass marks a request sent past every
	// EPP (Shape.Bypass).
	Replica string
	Bypass  bool
	// Tenant and Objective are the request's flow and objective, as it
	// named them (empty: none); Status is the EPP's or engine's HTTP
	// status (0: no answer).
	Tenant, Objective string
	Status            int
}

// Summary condenses a run.
type Summary struct {
	Requests, Errors, Cut     int
	TTFTp50, TTFTp90, TTFTp99 time.Duration
	E2Ep50, E2Ep90            time.Duration
	// OutputTPS is output tokens per second over the run's makespan.
	OutputTPS float64
	// OutputTokens is the output tokens delivered, those of cut requests
	// up to their cut included.
	OutputTokens int
	// HitRate is cached prompt tokens over prompt tokens.
	HitRate float64
	// Shed counts requests refused with 429. SLOAttainment is the share of
	// the admitted requests with an SLO whose TTFT met it (cut ones count
	// as missed unless their first token came in time); Goodput is those
	// that met it per second of the run.
	Shed          int
	WithSLO       int
	SLOAttainment float64
	Goodput       float64
}

// Percentile is the nearest-rank p-th percentile (0 < p <= 100) of xs,
// which it sorts; 0 for none.
func Percentile(xs []time.Duration, p float64) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	rank := int(math.Ceil(p / 100 * float64(len(xs))))
	return xs[min(max(rank, 1), len(xs))-1]
}

// Summarize condenses samples from a run whose traffic took makespan.
// Failed requests count in Errors and nowhere else; cut ones count with
// their lower bounds, so that overload shows in the tail instead of
// vanishing from it.
func Summarize(samples []Sample, makespan time.Duration) Summary {
	var s Summary
	var ttft, e2e []time.Duration
	var prompt, cached, output, withSLO, met int
	for _, x := range samples {
		s.Requests++
		if x.Shed {
			s.Shed++
			continue
		}
		if x.Err != nil {
			s.Errors++
			continue
		}
		if x.SLO > 0 {
			withSLO++
			if x.TTFT <= x.SLO {
				met++
			}
		}
		if x.Cut {
			s.Cut++
		}
		ttft = append(ttft, x.TTFT)
		e2e = append(e2e, x.E2E)
		prompt += x.PromptTokens
		cached += x.CachedTokens
		output += x.OutputTokens
	}
	s.TTFTp50, s.TTFTp90, s.TTFTp99 = Percentile(ttft, 50), Percentile(ttft, 90), Percentile(ttft, 99)
	s.E2Ep50, s.E2Ep90 = Percentile(e2e, 50), Percentile(e2e, 90)
	s.OutputTokens = output
	if makespan > 0 {
		s.OutputTPS = float64(output) / makespan.Seconds()
	}
	if prompt > 0 {
		s.HitRate = float64(cached) / float64(prompt)
	}
	s.WithSLO = withSLO
	if withSLO > 0 {
		s.SLOAttainment = float64(met) / float64(withSLO)
	}
	if makespan > 0 {
		s.Goodput = float64(met) / makespan.Seconds()
	}
	return s
}
