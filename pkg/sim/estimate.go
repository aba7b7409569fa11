package sim

import (
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// maxEstimateSteps bounds EstimateTTFT's walk; a queue that long is
// answered as far as the walk got.
const maxEstimateSteps = 100000

// estSeq is a sequence as EstimateTTFT replays it.
type estSeq struct {
	// promptLen, hashes and tiers describe a waiting sequence's prompt: its
	// full blocks and the tier holding each now.
	promptLen  int
	hashes     []uint64
	tiers      []events.Tier
	left, ctx  int
	chunk      int
	decodeLeft int
	target     bool
	idle       bool
}

// EstimateTTFT is how long a request with these tokens, arriving at now,
// would wait for its first token on this core if nothing else arrived:
// the core's scheduler run forward, step by step with its own timing
// model, from its true state (the step in progress, the running batch with
// each sequence's remaining prefill and output, the waiting queue with each
// prompt's blocks as the engine holds them now, and the blocks that the
// sequences admitted before it will have computed by then). It is what an
// oracle that knows every engine's caches and queues can compute; it does
// not know future arrivals, nor evictions the wait would cause.
func (r *Core) EstimateTTFT(tokens []uint32, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	bs := r.eng.cfg.Pool.BlockSize
	var elapsed time.Duration
	running := make([]*estSeq, 0, len(r.running)+len(r.waiting)+1)
	for _, s := range r.running {
		e := &estSeq{left: s.prefillLeft, ctx: s.ctx, decodeLeft: s.maxTokens - s.generated}
		if r.inStep && !s.idle {
			// The step under way ends first; the replay starts after it
			// (a sequence sitting it out stays as it is).
			if e.left > 0 {
				e.left -= s.chunk
				e.ctx += s.chunk
			}
			if e.left == 0 {
				e.ctx++
				if e.decodeLeft--; e.decodeLeft == 0 {
					continue
				}
			}
		}
		running = append(running, e)
	}
	if r.inStep && r.stepEnd.After(now) {
		elapsed = r.stepEnd.Sub(now)
	}
	waiting := make([]*estSeq, 0, len(r.waiting)+1)
	for _, s := range append(r.waiting, nil) {
		e := &estSeq{target: s == nil}
		req := blockpool.Request{Tokens: tokens}
		if s != nil {
			req = s.req
			e.decodeLeft = s.maxTokens
		}
		e.promptLen = len(req.Tokens)
		e.hashes, e.tiers = r.eng.blocks(req)
		waiting = append(waiting, e)
	}
	// computed holds the blocks of the sequences admitted during the
	// replay: the engine caches a block when it is allocated, so those
	// who come after hit it.
	computed := map[uint64]bool{}
	admit := func(s *estSeq) (cached, loaded int) {
		maxHit := 0
		if s.promptLen > 0 {
			maxHit = (s.promptLen - 1) / bs
		}
		n := 0
		for n < min(len(s.hashes), maxHit) {
			switch {
			case computed[s.hashes[n]] || s.tiers[n] == events.TierGPU:
			case s.tiers[n] == events.TierCPU:
				loaded += bs
			default:
				maxHit = n // the first miss ends the prefix
				continue
			}
			n++
		}
		for _, h := range s.hashes {
			computed[h] = true
		}
		return n * bs, loaded
	}

	for range maxEstimateSteps {
		var w StepWork
		b := newBudget(r.timing)
		admitAll := func() int {
			n := 0
			for len(waiting) > 0 && len(running) < r.timing.MaxSeqs && b.left() {
				s := waiting[0]
				waiting = waiting[1:]
				cached, loaded := admit(s)
				s.left, s.ctx = s.promptLen-cached, cached
				s.chunk = b.take(s.left)
				w.addChunk(s.chunk, s.ctx)
				w.Loaded += loaded
				w.Admitted++
				running = append(running, s)
				n++
			}
			return n
		}
		if r.timing.Scheduler == SchedPrefillFirst {
			decoding := len(running)
			if admitAll() > 0 {
				for _, s := range running[:decoding] {
					s.idle = true
				}
			} else {
				for _, s := range running {
					w.Decoding++
					w.DecodeContext += int64(s.ctx)
				}
			}
		} else {
			for _, s := range running {
				if s.left == 0 {
					w.Decoding++
					w.DecodeContext += int64(s.ctx)
					b.take(1)
				}
			}
			for _, s := range running {
				if s.left > 0 {
					if s.chunk = b.take(s.left); s.chunk == 0 {
						break
					}
					w.addChunk(s.chunk, s.ctx)
				}
			}
			admitAll()
		}
		elapsed += r.timing.Step(w)
		kept := running[:0]
		for _, s := range running {
			if s.idle {
				s.idle = false
				kept = append(kept, s)
				continue
			}
			if s.left > 0 {
				s.left -= s.chunk
				s.ctx += s.chunk
				s.chunk = 0
				if s.left > 0 {
					kept = append(kept, s)
					continue
				}
				if s.target {
					return elapsed
				}
			}
			s.ctx++
			if s.decodeLeft--; s.decodeLeft > 0 {
				kept = append(kept, s)
			}
		}
		running = kept
	}
	return elapsed
}
