package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// ErrTooLarge is a request whose prompt cannot fit the engine's GPU cache
// even when nothing else runs.
var ErrTooLarge = errors.New("sim: prompt larger than the engine's KV cache")

// ErrStopped is a request submitted to, or cut short by, a stopped core.
var ErrStopped = errors.New("sim: core stopped")

// admit allocates a request's blocks and reports its cache hits: leading
// blocks already on GPU, then those after them that only the CPU tier
// holds (loaded back rather than recomputed).
func (e *Engine) admit(req blockpool.Request) (gpuHit, cpuHit int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	tiers := e.pool.BlockTiers(req)
	gpuHit, err = e.pool.Allocate(req)
	if err != nil {
		return 0, 0, fmt.Errorf("engine %s: %w", e.cfg.Pod, err)
	}
	maxHit := 0
	if len(req.Tokens) > 0 {
		maxHit = (len(req.Tokens) - 1) / e.cfg.Pool.BlockSize
	}
	for i := gpuHit; i < min(len(tiers), maxHit) && tiers[i] == events.TierCPU; i++ {
		cpuHit++
	}
	return gpuHit, cpuHit, nil
}

func (e *Engine) release(id string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.pool.Free(id); err != nil {
		return fmt.Errorf("engine %s: %w", e.cfg.Pod, err)
	}
	return nil
}

func (e *Engine) endStep() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.step()
}

func (e *Engine) freeBlocks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.FreeBlocks()
}

// Token is one output token of a sequence, or its end.
type Token struct {
	// Index counts output tokens from 0.
	Index int
	// Done marks the last event; Err is set when the sequence failed.
	Done bool
	Err  error
}

// Seq is one request inside a core.
type Seq struct {
	// Tokens delivers the sequence's output as the engine steps; it is
	// buffered for the whole output, so a slow reader never stalls the
	// engine, and closed after the Done token.
	Tokens <-chan Token

	tokens    chan Token
	req       blockpool.Request
	maxTokens int
	generated int
	// prefillLeft is the prompt tokens still to compute once admitted, ctx
	// the tokens already in its KV cache (cached, computed, generated),
	// chunk the prefill tokens planned for the current step.
	prefillLeft, ctx, chunk int
	// idle marks a decoding sequence that sits out the current step:
	// one without chunked prefill that prefills others.
	idle bool
	// keep: the sequence's blocks stay allocated when it ends, for a
	// remote decode to pull (a prefill-only request's).
	keep bool

	mu     sync.Mutex
	cached int
	loaded int
	steps  int
}

// Cached is the prompt tokens served from the prefix cache (GPU hits and
// tokens loaded back from the CPU tier), as vLLM reports cached_tokens;
// valid after the first token.
func (s *Seq) Cached() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cached
}

// Loaded is the cached prompt tokens that came from the CPU tier.
func (s *Seq) Loaded() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.loaded
}

// WaitedSteps is how many engine steps ran while the sequence waited.
func (s *Seq) WaitedSteps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.steps
}

// PromptTokens is the prompt's length.
func (s *Seq) PromptTokens() int { return len(s.req.Tokens) }

// Core is a simulated engine with vLLM's scheduler loop: a waiting
// queue, a running batch bounded by Timing.MaxSeqs, and steps whose
// duration the timing model gives. Each step prefills newly admitted
// sequences (their uncached tokens), decodes one token for the others, and
// publishes that step's KV events.
type Core struct {
	eng    *Engine
	timing Timing
	wake   chan struct{}

	mu      sync.Mutex
	waiting []*Seq
	running []*Seq
	stopped bool
	n       uint64
	stats   CoreStats
	// inStep is set between a Plan that found work and its Finish;
	// stepEnd is when that step ends, as its driver said.
	inStep  bool
	stepEnd time.Time
}

// CoreStats are a core's cumulative counters, in vLLM's units.
type CoreStats struct {
	Requests         int64
	PromptTokens     int64
	GenerationTokens int64
	// PrefixQueries and PrefixHits count prompt tokens looked up in, and
	// found in, the prefix cache.
	PrefixQueries, PrefixHits int64
	Steps                     int64
	// Busy is the simulated time spent in steps.
	Busy time.Duration
}

// NewCore returns a core scheduling eng with timing t.
func NewCore(eng *Engine, t Timing) *Core {
	if t.MaxSeqs <= 0 {
		t.MaxSeqs = DefaultTiming().MaxSeqs
	}
	return &Core{eng: eng, timing: t, wake: make(chan struct{}, 1)}
}

// Engine is the core's engine.
func (r *Core) Engine() *Engine { return r.eng }

// Timing is the core's timing model.
func (r *Core) Timing() Timing { return r.timing }

// Submit queues a request generating maxTokens output tokens.
func (r *Core) Submit(req blockpool.Request, maxTokens int) (*Seq, error) {
	return r.submit(req, maxTokens, false)
}

func (r *Core) submit(req blockpool.Request, maxTokens int, keep bool) (*Seq, error) {
	if maxTokens <= 0 {
		maxTokens = 1
	}
	ch := make(chan Token, maxTokens+1)
	s := &Seq{Tokens: ch, tokens: ch, req: req, maxTokens: maxTokens, keep: keep}
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return nil, ErrStopped
	}
	r.n++
	s.req.ID = fmt.Sprintf("%s-%d", r.eng.cfg.Pod, r.n)
	r.waiting = append(r.waiting, s)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return s, nil
}

// Load is the core's queue: sequences waiting and running.
func (r *Core) Load() (waiting, running int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.waiting), len(r.running)
}

// Stats returns the core's counters.
func (r *Core) Stats() CoreStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats
}

// Plan starts a step: it gives each decoding sequence its token, continues
// the prefills already under way, then admits waiting sequences in arrival
// order while the batch has seats, the step's token budget lasts and their
// blocks fit, and returns the step's work (SchedPrefillFirst: a step that
// admits prefills only, and the running sequences decode in steps that
// admit nothing). ok is false when there is nothing to do. Plan and Finish
// are the loop's two halves; Run drives them in real time, tests and
// virtual time call them directly.
func (r *Core) Plan() (w StepWork, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := newBudget(r.timing)
	if r.timing.Scheduler == SchedPrefillFirst {
		decoding := len(r.running)
		if r.admit(&b, &w) > 0 {
			for _, s := range r.running[:decoding] {
				s.idle = true
			}
		} else {
			for _, s := range r.running {
				w.Decoding++
				w.DecodeContext += int64(s.ctx)
			}
		}
	} else {
		for _, s := range r.running {
			if s.prefillLeft == 0 {
				w.Decoding++
				w.DecodeContext += int64(s.ctx)
				b.take(1)
			}
		}
		for _, s := range r.running {
			if s.prefillLeft > 0 {
				if s.chunk = b.take(s.prefillLeft); s.chunk == 0 {
					break
				}
				w.addChunk(s.chunk, s.ctx)
			}
		}
		r.admit(&b, &w)
	}
	for _, s := range r.waiting {
		s.mu.Lock()
		s.steps++
		s.mu.Unlock()
	}
	r.inStep = len(r.running) > 0
	return w, r.inStep
}

// admit moves waiting sequences into the running batch in arrival order
// while it has seats, b lasts and their blocks fit, adding their prefill
// chunks to w; it returns how many it admitted.
func (r *Core) admit(b *budget, w *StepWork) int {
	bs := r.eng.cfg.Pool.BlockSize
	n := 0
	for len(r.waiting) > 0 && len(r.running) < r.timing.MaxSeqs && b.left() {
		s := r.waiting[0]
		gpu, cpu, err := r.eng.admit(s.req)
		if errors.Is(err, blockpool.ErrNoSpace) {
			if len(r.running) == 0 {
				// Nothing will ever free enough blocks for it.
				r.waiting = r.waiting[1:]
				s.fail(fmt.Errorf("%w: %d tokens: %w", ErrTooLarge, len(s.req.Tokens), err))
				continue
			}
			break
		}
		r.waiting = r.waiting[1:]
		if err != nil {
			s.fail(err)
			continue
		}
		cached := min((gpu+cpu)*bs, len(s.req.Tokens))
		s.mu.Lock()
		s.cached, s.loaded = cached, cpu*bs
		s.mu.Unlock()
		s.prefillLeft, s.ctx = len(s.req.Tokens)-cached, cached
		s.chunk = b.take(s.prefillLeft)
		w.addChunk(s.chunk, s.ctx)
		w.Loaded += cpu * bs
		w.Admitted++
		n++
		r.running = append(r.running, s)
		r.stats.Requests++
		r.stats.PromptTokens += int64(len(s.req.Tokens))
		r.stats.PrefixQueries += int64(len(s.req.Tokens))
		r.stats.PrefixHits += int64(cached)
	}
	return n
}

// budget is a step's token budget (vLLM's max_num_batched_tokens).
type budget struct {
	n         int
	unlimited bool
}

func newBudget(t Timing) budget {
	return budget{n: t.MaxBatchedTokens, unlimited: t.MaxBatchedTokens <= 0 || t.Scheduler == SchedPrefillFirst}
}

// take spends up to want tokens and returns how many it got.
func (b *budget) take(want int) int {
	if b.unlimited {
		return want
	}
	got := max(min(want, b.n), 0)
	b.n -= got
	return got
}

func (b *budget) left() bool { return b.unlimited || b.n > 0 }

// Stepping tells the core that the step its driver started ends at
// until, so that EstimateTTFT can count the wait for it.
func (r *Core) Stepping(until time.Time) {
	r.mu.Lock()
	r.stepEnd = until
	r.mu.Unlock()
}

// Finish ends the step Plan started, of simulated duration d: every
// decoding sequence emits a token, and so does every sequence whose
// prefill this step completed (its first); finished ones release their
// blocks, and the step's KV events are published.
func (r *Core) Finish(d time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Steps++
	r.stats.Busy += d
	r.inStep = false
	kept := r.running[:0]
	var firstErr error
	for _, s := range r.running {
		if s.idle {
			// It sat out a prefill step.
			s.idle = false
			kept = append(kept, s)
			continue
		}
		if s.prefillLeft > 0 {
			s.prefillLeft -= s.chunk
			s.ctx += s.chunk
			s.chunk = 0
			if s.prefillLeft > 0 {
				kept = append(kept, s) // its prefill goes on next step
				continue
			}
		}
		s.tokens <- Token{Index: s.generated}
		s.generated++
		s.ctx++
		r.stats.GenerationTokens++
		if s.generated < s.maxTokens {
			kept = append(kept, s)
			continue
		}
		// A kept sequence's blocks are released by whoever reads its
		// Done token (Server.hold).
		if !s.keep {
			if err := r.eng.release(s.req.ID); err != nil && firstErr == nil {
				firstErr = err
			}
		}
		s.tokens <- Token{Index: s.generated, Done: true}
		close(s.tokens)
	}
	clear(r.running[len(kept):])
	r.running = kept
	if err := r.eng.endStep(); err != nil && firstErr == nil {
		firstErr = err
	}
	return firstErr
}

func (s *Seq) fail(err error) {
	s.tokens <- Token{Index: s.generated, Done: true, Err: err}
	close(s.tokens)
}

// Run drives the core's loop in real time until ctx is done; then every
// sequence still queued or running ends with ErrStopped.
func (r *Core) Run(ctx context.Context) error {
	defer r.stop()
	timer := time.NewTimer(0)
	<-timer.C
	for {
		w, ok := r.Plan()
		if !ok {
			select {
			case <-ctx.Done():
				return nil
			case <-r.wake:
				continue
			}
		}
		d := r.timing.Step(w)
		r.Stepping(time.Now().Add(d))
		timer.Reset(d)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		}
		if err := r.Finish(d); err != nil {
			return err
		}
	}
}

func (r *Core) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopped = true
	for _, s := range r.waiting {
		s.fail(ErrStopped)
	}
	for _, s := range r.running {
		s.fail(ErrStopped)
	}
	r.waiting, r.running = nil, nil
}
