package sim

import "time"

// Timing is an engine's performance model: what one scheduler step costs.
// Only ratios matter to routing; the defaults keep those of an 8B model on
// one modern GPU (prefill ~20k tokens/s, a decode step ~10 ms, a CPU-tier
// block copied back ~10x faster than recomputed) while staying coarse
// enough for timers on a loaded machine.
type Timing struct {
	// PrefillPerToken is the cost of computing one uncached prompt token.
	PrefillPerToken time.Duration
	// LoadPerToken is the cost of copying one cached token back from the
	// CPU tier.
	LoadPerToken time.Duration
	// DecodeStep is the cost of one decode step (one output token for
	// every running sequence); DecodePerSeq is added per running sequence.
	DecodeStep, DecodePerSeq time.Duration
	// MaxSeqs limits concurrently running sequences (vLLM's max_num_seqs);
	// requests beyond it wait, which is how queues form.
	MaxSeqs int
}

// DefaultTiming is the model the benchmark and demo run.
func DefaultTiming() Timing {
	return Timing{
		PrefillPerToken: 50 * time.Microsecond,
		LoadPerToken:    5 * time.Microsecond,
		DecodeStep:      8 * time.Millisecond,
		DecodePerSeq:    100 * time.Microsecond,
		MaxSeqs:         8,
	}
}

// StepWork is what one step does: prompt tokens computed, tokens loaded
// from the CPU tier, and sequences decoding.
type StepWork struct {
	Prefill, Loaded, Decoding int
}

// Step is the simulated duration of one step.
func (t Timing) Step(w StepWork) time.Duration {
	d := time.Duration(w.Prefill)*t.PrefillPerToken + time.Duration(w.Loaded)*t.LoadPerToken
	if w.Decoding > 0 {
		d += t.DecodeStep + time.Duration(w.Decoding)*t.DecodePerSeq
	}
	return d
}
