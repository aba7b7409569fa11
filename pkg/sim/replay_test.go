package sim

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// The EPP replays each endpoint's scheduler over the requests it has in
// flight, counting work rather than time (enginesched.Replayer); the
// predictor learns what each unit costs. Priced at this engine's own
// costs, the counts must come to the TTFT its scheduler then takes, from
// the same state. The prompts share nothing, so that the cache plays no
// part (the replay takes each prompt's uncached tokens as given).
func TestTheReplayPricedAtTheEnginesCostsIsTheTTFTItsSchedulerTakes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		maxSeqs, budget int
		queued, stepped int
		target          int
	}{
		{"an idle engine", 4, 4096, 0, 0, 300},
		{"a batch decoding", 4, 4096, 3, 2, 300},
		{"a prefill under way, chunked beside the decodes", 4, 700, 4, 3, 300},
		{"a full batch: the request waits for a seat", 2, 4096, 5, 1, 300},
		{"the request's own prefill chunked over steps that decode", 3, 500, 2, 2, 1400},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := testReplica(4096, 0, tt.maxSeqs)
			r.timing.MaxBatchedTokens = tt.budget
			tm := r.Timing()
			for i := range tt.queued {
				if _, err := r.Submit(blockpool.Request{Tokens: prompt(i, 600+100*i)}, 40+i); err != nil {
					t.Fatal(err)
				}
			}
			for range tt.stepped {
				w, ok := r.Plan()
				if !ok {
					t.Fatal("nothing to step")
				}
				if err := r.Finish(tm.Step(w)); err != nil {
					t.Fatal(err)
				}
			}
			// What the EPP would know: every request in the order sent,
			// with what it has still to compute and to generate; all of
			// them were sent before the step that now begins.
			var seqs []enginesched.Seq
			for _, s := range append(append([]*Seq{}, r.running...), r.waiting...) {
				left, ctx := s.prefillLeft, s.ctx
				if !r.isRunning(s) {
					left, ctx = len(s.req.Tokens), 0
				}
				seqs = append(seqs, enginesched.Seq{Prefill: left, Context: ctx, Outputs: s.maxTokens - s.generated, Started: left > 0})
			}
			var rp enginesched.Replayer
			a := rp.Replay(seqs, enginesched.Limits{MaxNumSeqs: tt.maxSeqs, MaxBatchedTokens: tt.budget})

			// The request arrives as that step begins: the engine's
			// estimate counts the whole step under way, as the replay does.
			now := time.Unix(1000, 0)
			if w, ok := r.Plan(); ok {
				r.Stepping(now.Add(tm.Step(w)))
			}
			target := prompt(99, tt.target)
			want := r.EstimateTTFT(target, now)
			got, tolerance := price(tm, a, tt.target)
			if d := got - want; d < -tolerance || d > tolerance {
				t.Errorf("the replay priced comes to %v, the scheduler takes %v (replayed %+v)", got, want, a)
			}
		})
	}
}

func (r *Core) isRunning(s *Seq) bool {
	for _, x := range r.running {
		if x == s {
			return true
		}
	}
	return false
}

// price is what a's work and a request of uncached tokens (no context
// before them) cost at t, and how far the sum may be from the engine's,
// which rounds each step's context terms apart.
func price(t Timing, a enginesched.Ahead, uncached int) (cost, tolerance time.Duration) {
	own := a.OwnSteps(uncached) - 1
	decodeSteps, seqSteps, decodeCtx := a.DecodeSteps, a.SeqSteps, a.DecodeContext
	if a.Decoding > 0 {
		decodeSteps += own
		seqSteps += own * a.Decoding
		decodeCtx += int64(own) * a.DecodingContext
	}
	// The request's own chunks: the first with what its first step left,
	// the rest with what the decodes leave.
	var prefillCtx int64
	left, ctx, chunk := uncached, 0, min(uncached, a.FirstChunk)
	for left > 0 {
		prefillCtx += int64(chunk) * int64(ctx+chunk/2)
		left, ctx = left-chunk, ctx+chunk
		chunk = min(left, a.Budget-a.Decoding)
	}
	cost = time.Duration(decodeSteps)*t.DecodeStep + time.Duration(seqSteps)*t.DecodePerSeq
	cost += time.Duration(decodeCtx * int64(t.DecodePerKToken) / 1024)
	cost += time.Duration(a.PrefillTokens+uncached) * t.PrefillPerToken
	cost += time.Duration((a.PrefillContext + prefillCtx) * int64(t.PrefillAttention) / 1024)
	steps := time.Duration(a.Steps + own)
	// The decodes' context grows a token a step in the engine, and the
	// replay carries the first step's into the request's own.
	tolerance = steps*(t.DecodePerKToken+t.PrefillAttention) + time.Duration(own*own*a.Decoding)*t.DecodePerKToken/1024
	return cost, tolerance
}
