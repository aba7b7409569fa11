package sim

import "time"

// Timing is an engine's performance model: what one scheduler step costs.
// Only ratios matter to routing; the defaults keep those of an 8B model on
// one modern GPU (prefill ~20k tokens/s, a decode step ~10 ms, a CPU-tier
// block copied back ~10x faster than recomputed) while staying coarse
// enough for timers on a loaded machine.
//
// A step's cost grows with everything in its batch, as a real engine's
// does: each prompt token computed, each token of context that a computed
// token attends to, each token copied back from the CPU tier, and each
// decoding sequence with the context it reads. A long prompt may be
// prefilled over several steps (chunked prefill) when the step's token
// budget is smaller than it, so that prefills and decodes share steps.
type Timing struct {
	// PrefillPerToken is the cost of computing one uncached prompt token.
	PrefillPerToken time.Duration
	// PrefillAttention is what each computed prompt token costs per 1024
	// tokens of context before it (the cached prefix and the part already
	// computed): attention makes a prefill on a long context dearer than
	// the same tokens on a short one.
	PrefillAttention time.Duration
	// LoadPerToken is the cost of copying one cached token back from the
	// CPU tier.
	LoadPerToken time.Duration
	// DecodeStep is the cost of one decode step (one output token for
	// every running sequence); DecodePerSeq is added per running sequence,
	// and DecodePerKToken per 1024 tokens of each decoding sequence's
	// context (its KV cache read every step).
	DecodeStep, DecodePerSeq, DecodePerKToken time.Duration
	// MaxSeqs limits concurrently running sequences (vLLM's max_num_seqs);
	// requests beyond it wait, which is how queues form.
	MaxSeqs int
	// MaxBatchedTokens is the step's token budget (vLLM's
	// max_num_batched_tokens): one per decoding sequence, the rest for
	// prefill chunks. 0 means no budget: every admitted prompt is
	// prefilled whole in its first step, beside the others' decodes.
	MaxBatchedTokens int
	// Scheduler is how steps are composed (zero: SchedChunked).
	Scheduler Scheduler
	// RequestOverhead is a fixed cost paid once per request, in the step
	// that admits it (tokenization, sampling set-up, a host round trip).
	RequestOverhead time.Duration
}

// Scheduler is how an engine composes its steps.
type Scheduler int

const (
	// SchedChunked is vLLM's: each step decodes every running sequence
	// and spends the rest of its token budget on prefills, chunking them.
	SchedChunked Scheduler = iota
	// SchedPrefillFirst is a scheduler without chunked prefill: a step
	// admits waiting prompts and prefills them whole, and running
	// sequences decode only in steps that admit nothing. It has no token
	// budget: MaxBatchedTokens is not used.
	SchedPrefillFirst
)

// DefaultTiming is the model the benchmark and demo run.
func DefaultTiming() Timing {
	return Timing{
		PrefillPerToken:  50 * time.Microsecond,
		PrefillAttention: 2 * time.Microsecond,
		LoadPerToken:     5 * time.Microsecond,
		DecodeStep:       8 * time.Millisecond,
		DecodePerSeq:     100 * time.Microsecond,
		DecodePerKToken:  40 * time.Microsecond,
		MaxSeqs:          8,
		MaxBatchedTokens: 4096,
	}
}

// Scaled is the timing of an engine speed times as fast (speed 0.5: every
// cost doubled). The limits stay as they are.
func (t Timing) Scaled(speed float64) Timing {
	if !(speed > 0) || speed == 1 {
		return t
	}
	s := func(d time.Duration) time.Duration { return time.Duration(float64(d) / speed) }
	t.PrefillPerToken, t.PrefillAttention, t.LoadPerToken = s(t.PrefillPerToken), s(t.PrefillAttention), s(t.LoadPerToken)
	t.DecodeStep, t.DecodePerSeq, t.DecodePerKToken = s(t.DecodeStep), s(t.DecodePerSeq), s(t.DecodePerKToken)
	t.RequestOverhead = s(t.RequestOverhead)
	return t
}

// StepWork is what one step does: prompt tokens computed, the context
// they attend to, tokens loaded from the CPU tier, and sequences decoding
// with their context.
type StepWork struct {
	Prefill, Loaded, Decoding int
	// PrefillContext sums, over the step's prefill chunks, chunk length
	// times the mean context each of its tokens attends to.
	PrefillContext int64
	// DecodeContext sums the decoding sequences' context lengths.
	DecodeContext int64
	// Admitted is the requests the step admits, each paying the
	// request overhead.
	Admitted int
}

// addChunk records a prefill chunk of n tokens computed after ctx tokens
// of context.
func (w *StepWork) addChunk(n, ctx int) {
	w.Prefill += n
	w.PrefillContext += int64(n) * int64(ctx+n/2)
}

// Step is the simulated duration of one step.
func (t Timing) Step(w StepWork) time.Duration {
	d := time.Duration(w.Prefill)*t.PrefillPerToken + time.Duration(w.Loaded)*t.LoadPerToken
	d += time.Duration(w.PrefillContext / 1024 * int64(t.PrefillAttention))
	d += time.Duration(w.Admitted) * t.RequestOverhead
	if w.Decoding > 0 {
		d += t.DecodeStep + time.Duration(w.Decoding)*t.DecodePerSeq
		d += time.Duration(w.DecodeContext / 1024 * int64(t.DecodePerKToken))
	}
	return d
}
