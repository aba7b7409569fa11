package enginesched

import (
	"math"
	"testing"
)

func TestAnIdleEngineSeatsARequestInItsFirstStep(t *testing.T) {
	t.Parallel()
	var r Replayer
	if got, want := r.Replay(nil, Limits{MaxNumSeqs: 4, MaxBatchedTokens: 2048}), (Ahead{Steps: 1, Budget: 2048, FirstChunk: 2048}); got != want {
		t.Errorf("replayed %+v, want %+v", got, want)
	}
	if got := r.Replay(nil, Limits{}); got.Budget != DefaultMaxBatchedTokens || got.FirstChunk != DefaultMaxBatchedTokens {
		t.Errorf("with no limits known: %+v, want vLLM's default budget", got)
	}
}

func TestAFullBatchOfDecodesIsWaitedOutAtOnce(t *testing.T) {
	t.Parallel()
	// Two seats, both decoding: 3 and 1000 tokens to go. The first frees
	// its seat after 3 steps; the request joins the fourth.
	var r Replayer
	got := r.Replay([]Seq{{Context: 100, Outputs: 3}, {Context: 200, Outputs: 1000}}, Limits{MaxNumSeqs: 2, MaxBatchedTokens: 512})
	want := Ahead{
		Steps: 4, DecodeSteps: 4, SeqSteps: 2*3 + 1,
		DecodeContext: (100 + 101 + 102) + (200 + 201 + 202) + 203,
		Decoding:      1, DecodingContext: 204, Budget: 512, FirstChunk: 511, UnderWay: true,
	}
	if got != want {
		t.Errorf("replayed %+v\nwant     %+v", got, want)
	}
}

func TestARequestCannotJoinTheStepUnderWay(t *testing.T) {
	t.Parallel()
	var r Replayer
	// A prefill of 300 sent before the step under way began is in it; the
	// new request waits for the next step, though the budget had room.
	got := r.Replay([]Seq{{Prefill: 300, Context: 100, Outputs: 8, Started: true}}, Limits{MaxNumSeqs: 4, MaxBatchedTokens: 1000})
	want := Ahead{Steps: 2, DecodeSteps: 1, SeqSteps: 1, DecodeContext: 401, PrefillTokens: 300, PrefillContext: 300 * (100 + 150),
		Decoding: 1, DecodingContext: 402, Budget: 1000, FirstChunk: 999, UnderWay: true}
	if got != want {
		t.Errorf("replayed %+v\nwant     %+v", got, want)
	}
	// Sent after it began: it waits with the new request, which joins it.
	got = r.Replay([]Seq{{Prefill: 300, Context: 100, Outputs: 8}}, Limits{MaxNumSeqs: 4, MaxBatchedTokens: 1000})
	if got.Steps != 1 || got.UnderWay || got.FirstChunk != 700 {
		t.Errorf("replayed %+v, want the new request in the first step, beside the prefill", got)
	}
}

func TestAReplayThatFindsNoSeatSaysSo(t *testing.T) {
	t.Parallel()
	// Prefills one token a step (the decodes take the rest of the budget)
	// never end within the horizon.
	seqs := []Seq{{Context: 1, Outputs: 1 << 30}, {Context: 1, Outputs: 1 << 30}, {Prefill: 1 << 30, Outputs: 1}}
	var r Replayer
	if got := r.Replay(seqs, Limits{MaxNumSeqs: 3, MaxBatchedTokens: 3}); !got.Unseated || got.Steps != replayHorizon {
		t.Errorf("replayed %+v, want unseated at the horizon", got)
	}
}

func TestOwnStepsChunkAPromptByTheBudgetTheDecodesLeave(t *testing.T) {
	t.Parallel()
	a := Ahead{Steps: 2, Budget: 1000, FirstChunk: 300, Decoding: 100}
	for _, tt := range []struct{ uncached, want int }{
		{0, 1}, {300, 1}, {301, 2}, {300 + 900, 2}, {300 + 901, 3},
	} {
		if got := a.OwnSteps(tt.uncached); got != tt.want {
			t.Errorf("OwnSteps(%d) = %d, want %d", tt.uncached, got, tt.want)
		}
	}
	if got := (&Ahead{}).OwnSteps(DefaultMaxBatchedTokens + 1); got != 2 {
		t.Errorf("no replay: an idle engine's default budget, got %d steps", got)
	}
	if got := (&Ahead{Steps: 1, Budget: 10, FirstChunk: 1, Decoding: math.MinInt}).OwnSteps(math.MaxInt); got <= 1 {
		t.Errorf("extreme values: %d steps", got)
	}
}

// FuzzReplay replays arbitrary requests in flight under arbitrary limits:
// every replay ends, within its horizon, with counts that make sense.
func FuzzReplay(f *testing.F) {
	f.Add(3, 500, 100, 5, 0, 2000, 30, 4, 4096)
	f.Add(0, 0, 0, 0, 0, 0, 0, 0, 0)
	f.Add(-5, 1<<40, -1, 1<<62, 7, -3, 1<<50, -2, 1)
	f.Fuzz(func(t *testing.T, n, prefill, context, outputs, decode, prefill2, outputs2, seats, budget int) {
		n = min(max(n, 0), 64)
		seqs := make([]Seq, 0, n)
		for i := range n {
			s := Seq{Prefill: prefill, Context: context, Outputs: outputs}
			if i%2 == 1 {
				s = Seq{Prefill: prefill2 * (i % 3), Context: decode, Outputs: outputs2}
			}
			seqs = append(seqs, s)
		}
		var r Replayer
		a := r.Replay(seqs, Limits{MaxNumSeqs: seats, MaxBatchedTokens: budget})
		if a.Steps < 1 || a.DecodeSteps < 0 || a.DecodeSteps > a.Steps || a.SeqSteps < a.DecodeSteps ||
			a.DecodeContext < 0 || a.PrefillTokens < 0 || a.PrefillContext < 0 || a.Decoding < 0 || a.DecodingContext < 0 ||
			a.FirstChunk < 0 || a.FirstChunk > a.Budget || a.Budget <= 0 {
			t.Fatalf("Replay(%+v, seats %d, budget %d) = %+v", seqs, seats, budget, a)
		}
		if own := a.OwnSteps(prefill); own < 1 {
			t.Fatalf("OwnSteps(%d) = %d", prefill, own)
		}
	})
}
