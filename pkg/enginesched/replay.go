package enginesched

// Limits are an engine's scheduler limits, as vLLM names them. A zero
// field is unknown: no limit on seats, DefaultMaxBatchedTokens for the
// step's budget.
type Limits struct {
	// MaxNumSeqs is how many requests run at once (vLLM's max_num_seqs):
	// beyond it a request waits for a running one to finish.
	MaxNumSeqs int `json:"maxNumSeqs,omitempty"`
	// MaxBatchedTokens is one step's token budget (vLLM's
	// max_num_batched_tokens): a token for each decoding request, the
	// rest for prefill chunks, so that a long prompt is prefilled over
	// several steps that decodes share.
	MaxBatchedTokens int `json:"maxBatchedTokens,omitempty"`
}

// DefaultMaxBatchedTokens is the step budget taken when none is given:
// vLLM's default for its OpenAI server on GPUs of 70 GiB or more but the
// A100 (H100, MI300X). On other GPUs it defaults to 2048, so an EPP in
// front of them should be given the engines' value.
const DefaultMaxBatchedTokens = 8192

// Seq is a request in flight on an endpoint, as the replay takes it.
type Seq struct {
	// Prefill is the prompt tokens it has still to compute (0 once it
	// decodes); Context the tokens of context it has already (its cached
	// prefix, or its prompt and the output so far).
	Prefill, Context int
	// Outputs is the output tokens it has still to generate.
	Outputs int
	// Started marks a prefilling request sent before the engine's step
	// under way began, so admitted into it if it fit; one sent after
	// waits for the next step, as the new request does.
	Started bool
}

// Ahead is what a request sent to an endpoint now waits behind before its
// prefill can start, counted in the engine's work rather than in time:
// the engine's scheduler run forward over the requests in flight there,
// step by step, the way vLLM's runs it (the running requests first, a
// token for each decode and chunks for the prefills under way, then the
// waiting ones admitted in order while seats and budget last), until the
// step that has room for the new request's first chunk. The predictor
// learns what each unit of work costs on each endpoint, so the replay
// needs no speed, and a slow engine and a fast one replay alike.
//
// Every count covers that step too: its decodes and the chunks of others
// in it are work the request's first chunk waits for.
type Ahead struct {
	// Steps is how many steps run, DecodeSteps those of them that decode
	// (each pays a decode step's fixed cost), SeqSteps the decoding
	// requests summed over them and DecodeContext the context they read.
	Steps         int   `json:"steps,omitempty"`
	DecodeSteps   int   `json:"decodeSteps,omitempty"`
	SeqSteps      int   `json:"seqSteps,omitempty"`
	DecodeContext int64 `json:"decodeContext,omitempty"`
	// PrefillTokens is the prompt tokens the requests ahead compute in
	// those steps, and PrefillContext those tokens times the context each
	// attends to.
	PrefillTokens  int   `json:"prefillTokens,omitempty"`
	PrefillContext int64 `json:"prefillContext,omitempty"`
	// Decoding is how many requests decode in the steps after the
	// request's first, while its prefill goes on, and DecodingContext
	// their context: those of its first step that go on, and those whose
	// prefill that step ends.
	Decoding        int   `json:"decoding,omitempty"`
	DecodingContext int64 `json:"decodingContext,omitempty"`
	// Budget is the step's token budget and FirstChunk what of it is
	// left for the request's first chunk.
	Budget     int `json:"budget,omitempty"`
	FirstChunk int `json:"firstChunk,omitempty"`
	// Unseated says the replay reached its horizon before a seat freed:
	// the counts are then a lower bound.
	Unseated bool `json:"unseated,omitempty"`
	// UnderWay says the first step counted is the one under way (a
	// request decodes, or one was sent before it began): the new request
	// cannot join it, and part of it has run by the time it arrives.
	UnderWay bool `json:"underWay,omitempty"`
}

// OwnSteps is how many steps the prefill of uncached tokens takes, its
// first step included, with the budget Ahead leaves it. A zero Ahead (no
// replay known) is an idle engine's.
func (a *Ahead) OwnSteps(uncached int) int {
	budget := a.Budget
	if budget <= 0 {
		budget = DefaultMaxBatchedTokens
	}
	first := a.FirstChunk
	if a.Steps == 0 {
		first = budget
	}
	if uncached <= first {
		return 1
	}
	// Written so that no input, however large or negative, overflows.
	per := max(budget-min(max(a.Decoding, 0), budget), 1)
	rest := uncached - max(first, 0)
	steps := rest / per
	if rest%per != 0 {
		steps++
	}
	return 1 + steps
}

// A replay's bounds, so that no state, however large or odd, makes it
// slow or its sums overflow: the events it walks (a step, or a run of
// decode-only steps taken at once, at most maxSkip), the requests it
// takes (those sent first), and the tokens of any one count. Past the
// first two, the request is taken as seated there, and Unseated says the
// counts are a lower bound.
const (
	replayHorizon = 1024
	maxReplaySeqs = MaxSeqs
	maxSkip       = 1 << 16
	maxSeqTokens  = 1 << 24
)

// MaxSeqs is how many requests a replay takes, those sent first: a
// caller need hand it no more than MaxSeqs+1 (the one past them says that
// some were left out).
const MaxSeqs = 256

// Replayer replays an endpoint's scheduler; its zero value is ready. It
// keeps its scratch between calls, so a replay allocates nothing once
// warm, and is not safe for concurrent use.
type Replayer struct {
	running, waiting []replaySeq
}

type replaySeq struct {
	Seq
	chunk int
}

// Replay runs the scheduler forward over seqs, in the order they were
// sent: those decoding are running, those prefilling are taken as waiting
// in that order (one already admitted is where it would be anyway, ahead
// of the rest), with nothing new arriving. When a step is under way, the
// first step replayed is it: its decodes, and the chunks of the requests
// sent before it began.
func (r *Replayer) Replay(seqs []Seq, lim Limits) Ahead {
	budget := min(lim.MaxBatchedTokens, maxSeqTokens)
	if budget <= 0 {
		budget = DefaultMaxBatchedTokens
	}
	seats := lim.MaxNumSeqs
	if seats <= 0 {
		seats = int(^uint(0) >> 1)
	}
	r.running, r.waiting = r.running[:0], r.waiting[:0]
	a := Ahead{Budget: budget}
	if len(seqs) > maxReplaySeqs {
		seqs, a.Unseated = seqs[:maxReplaySeqs], true
	}
	clamp := func(n, lo int) int { return min(max(n, lo), maxSeqTokens) }
	for _, s := range seqs {
		s.Prefill, s.Context, s.Outputs = clamp(s.Prefill, 0), clamp(s.Context, 0), clamp(s.Outputs, 1)
		if s.Prefill == 0 {
			r.running = append(r.running, replaySeq{Seq: s})
		} else {
			r.waiting = append(r.waiting, replaySeq{Seq: s})
		}
	}
	a.UnderWay = len(r.running) > 0 || len(r.waiting) > 0 && r.waiting[0].Started
	first := a.UnderWay // the step under way, which the request cannot join
	next := 0           // r.waiting[next:] wait still
	for range replayHorizon {
		if r.decodeOnly(seats) {
			r.skipDecodes(&a)
			first = false
			continue
		}
		left := budget
		var decoding int
		var decodeCtx int64
		for i := range r.running {
			s := &r.running[i]
			if s.Prefill == 0 {
				decoding++
				decodeCtx += int64(s.Context)
				left--
			}
		}
		st := step{left: max(left, 0)}
		for i := range r.running {
			if s := &r.running[i]; s.Prefill > 0 && st.left > 0 {
				st.chunk(s)
			}
		}
		for next < len(r.waiting) && len(r.running) < seats && st.left > 0 && (!first || r.waiting[next].Started) {
			s := r.waiting[next]
			next++
			st.chunk(&s)
			r.running = append(r.running, s)
		}
		a.Steps++
		if decoding > 0 {
			a.DecodeSteps++
		}
		a.SeqSteps += decoding
		a.DecodeContext += decodeCtx
		a.PrefillTokens += st.prefill
		a.PrefillContext += st.prefillCtx
		if left := st.left; !first && next == len(r.waiting) && len(r.running) < seats && left > 0 {
			a.FirstChunk = left
			r.advance()
			for i := range r.running {
				if s := &r.running[i]; s.Prefill == 0 {
					a.Decoding++
					a.DecodingContext += int64(s.Context)
				}
			}
			return a
		}
		r.advance()
		first = false
	}
	a.Unseated = true
	return a
}

// step is one step's prefill chunks as the budget left hands them out.
type step struct {
	left, prefill int
	prefillCtx    int64
}

func (st *step) chunk(s *replaySeq) {
	s.chunk = min(s.Prefill, st.left)
	st.left -= s.chunk
	st.prefill += s.chunk
	st.prefillCtx += int64(s.chunk) * int64(s.Context+s.chunk/2)
}

// decodeOnly reports whether every running request decodes and no
// waiting one can be admitted: the steps until the first of them
// finishes are all alike.
func (r *Replayer) decodeOnly(seats int) bool {
	if len(r.running) == 0 || len(r.running) < seats {
		return false
	}
	for i := range r.running {
		if r.running[i].Prefill > 0 {
			return false
		}
	}
	return true
}

// skipDecodes runs, at once, the decode-only steps until the first
// running request finishes.
func (r *Replayer) skipDecodes(a *Ahead) {
	k := maxSkip
	var ctx int64
	for i := range r.running {
		k = min(k, r.running[i].Outputs)
		ctx += int64(r.running[i].Context)
	}
	n := int64(len(r.running))
	a.Steps += k
	a.DecodeSteps += k
	a.SeqSteps += k * int(n)
	a.DecodeContext += int64(k)*ctx + n*int64(k)*int64(k-1)/2
	kept := r.running[:0]
	for _, s := range r.running {
		s.Context += k
		if s.Outputs -= k; s.Outputs > 0 {
			kept = append(kept, s)
		}
	}
	r.running = kept
}

// advance ends a step: chunks are computed (a prompt computed whole yields
// its first token), and every decoding request generates one token.
func (r *Replayer) advance() {
	kept := r.running[:0]
	for _, s := range r.running {
		if s.Prefill > 0 {
			s.Prefill -= s.chunk
			s.Context += s.chunk
			s.chunk = 0
			if s.Prefill > 0 {
				kept = append(kept, s)
				continue
			}
		}
		s.Context++
		if s.Outputs--; s.Outputs > 0 {
			kept = append(kept, s)
		}
	}
	r.running = kept
}
