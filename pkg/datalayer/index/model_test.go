package index

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// The model-based test runs simulated engines (blockpool.Pool, a model of
// vLLM's block pool) under random workloads, feeds their batches to the
// index through the Sink interface, and after every step checks that the
// index's answer for many prompts equals every engine's true cached prefix.

const (
	modelBS    = 4
	modelModel = "qwen"
)

type modelScenario struct {
	name        string
	endpoints   int
	ranksOfLast int // the last endpoint runs this many data-parallel ranks
	gpuBlocks   int
	cpuBlocks   int
	steps       int
	duplicate   bool    // apply every batch twice (the second must be ignored)
	restartP    float64 // chance per engine step of an engine restart
	resetP      float64 // chance per engine step of reset_prefix_cache
	removeAt    int     // step at which endpoint 0 leaves (0: never)
	readdAt     int     // step at which it comes back, as a new engine
	// groups makes every engine a hybrid model with these KV-cache groups.
	groups []blockpool.Group
	// selfDescribing makes CPU stores carry tokens and parents (vLLM 0.26).
	selfDescribing bool
	// remainingCopies makes removals say how many copies remain.
	remainingCopies bool
}

type modelEngine struct {
	addr     string
	rank     int
	pool     *blockpool.Pool
	instance int
	running  []string
}

type modelWorld struct {
	t       *testing.T
	sc      modelScenario
	rng     *rand.Rand
	ix      *Index
	addrs   []string
	engines [][]*modelEngine // by endpoint
	member  []bool
	groups  [][]uint32
	recent  []blockpool.Request
	// What the run exercised, so a run that tests nothing fails.
	sawMatch, sawCPU, sawPartial int
	// sawHybrid counts answers of hybrid engines that differ from group
	// 0's own leading run: where the other groups decided the hit.
	sawHybrid int
	nextID    int
	nextSeed  uint64
}

func TestIndexMatchesEnginesUnderRandomWorkloads(t *testing.T) {
	t.Parallel()
	scenarios := []modelScenario{
		{name: "steady engines with evictions", endpoints: 4, gpuBlocks: 40, steps: 250},
		{name: "every batch delivered twice", endpoints: 3, gpuBlocks: 40, steps: 200, duplicate: true},
		{name: "engines that restart", endpoints: 3, gpuBlocks: 40, steps: 250, restartP: 0.02},
		{name: "engines that reset their prefix cache", endpoints: 3, gpuBlocks: 40, steps: 250, resetP: 0.03},
		{name: "an endpoint that leaves with events in flight and returns", endpoints: 3, gpuBlocks: 40, steps: 250, removeAt: 80, readdAt: 150},
		{name: "engines with a CPU offload tier", endpoints: 3, gpuBlocks: 24, cpuBlocks: 40, steps: 250},
		{name: "an endpoint with two data-parallel ranks", endpoints: 3, ranksOfLast: 2, gpuBlocks: 32, cpuBlocks: 24, steps: 250},
		{name: "everything at once", endpoints: 4, ranksOfLast: 2, gpuBlocks: 32, cpuBlocks: 32, steps: 300,
			duplicate: true, restartP: 0.01, resetP: 0.01, removeAt: 100, readdAt: 180},
		{name: "engines with self-describing CPU offload events", endpoints: 3, gpuBlocks: 24, cpuBlocks: 40, steps: 250,
			selfDescribing: true},
		{name: "engines whose removals say how many copies remain", endpoints: 3, gpuBlocks: 40, steps: 250,
			remainingCopies: true, duplicate: true},
		{name: "a sliding-window group beside full attention", endpoints: 3, gpuBlocks: 80, steps: 250,
			groups: []blockpool.Group{{Kind: blockpool.FullAttention}, {Kind: blockpool.SlidingWindow, Window: 2*modelBS + 1}}},
		{name: "sliding-window layers in group 0, full attention after", endpoints: 3, gpuBlocks: 80, steps: 250,
			groups: []blockpool.Group{{Kind: blockpool.SlidingWindow, Window: 3 * modelBS}, {Kind: blockpool.FullAttention}}},
		{name: "a Mamba group beside full attention", endpoints: 3, gpuBlocks: 60, steps: 250,
			groups: []blockpool.Group{{Kind: blockpool.FullAttention}, {Kind: blockpool.Mamba}}},
		{name: "full attention, a sliding window and Mamba with restarts and resets", endpoints: 3, gpuBlocks: 110, steps: 300,
			restartP: 0.01, resetP: 0.01, duplicate: true,
			groups: []blockpool.Group{{Kind: blockpool.FullAttention}, {Kind: blockpool.SlidingWindow, Window: 2 * modelBS}, {Kind: blockpool.Mamba}}},
	}
	for _, sc := range scenarios {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", sc.name, seed), func(t *testing.T) {
				t.Parallel()
				runModel(t, sc, seed)
			})
		}
	}
}

func runModel(t *testing.T, sc modelScenario, seed uint64) {
	w := &modelWorld{t: t, sc: sc, rng: rand.New(rand.NewPCG(seed, 99)), nextSeed: seed * 1000}
	w.ix = New(Options{}, prometheus.NewRegistry())
	for i := range sc.endpoints {
		addr := fmt.Sprintf("10.1.0.%d:8000", i+1)
		w.addrs = append(w.addrs, addr)
		w.ix.AddEndpoint(addr)
		w.member = append(w.member, true)
		ranks := 1
		if i == sc.endpoints-1 && sc.ranksOfLast > 1 {
			ranks = sc.ranksOfLast
		}
		var engs []*modelEngine
		for r := range ranks {
			e := &modelEngine{addr: addr, rank: r}
			w.freshPool(e)
			engs = append(engs, e)
		}
		w.engines = append(w.engines, engs)
	}
	for range 6 {
		w.groups = append(w.groups, w.benchTokens(modelBS*(1+w.rng.IntN(10))))
	}
	for step := 1; step <= sc.steps; step++ {
		if step == sc.removeAt {
			w.ix.RemoveEndpoint(w.addrs[0])
			w.member[0] = false
		}
		if step == sc.readdAt {
			// A new pod behind the old address: a new engine, from seq 0.
			w.ix.AddEndpoint(w.addrs[0])
			w.member[0] = true
			for _, e := range w.engines[0] {
				w.freshPool(e)
			}
		}
		for _, engs := range w.engines {
			for _, e := range engs {
				w.stepEngine(e)
			}
		}
		w.check(step)
	}
	if w.ix.stats.dropped[dropUnknownParent].Load() != 0 {
		t.Fatalf("faithful streams produced unknown parents")
	}
	removed := w.ix.stats.applied[events.KindBlockRemoved].Load()
	if w.sawMatch < sc.steps || w.sawPartial == 0 || removed == 0 || (sc.cpuBlocks > 0 && w.sawCPU == 0) {
		t.Fatalf("the workload exercised too little: %d matches, %d partial, %d removals, %d CPU blocks",
			w.sawMatch, w.sawPartial, removed, w.sawCPU)
	}
	if sc.duplicate && w.ix.stats.dropped[dropDuplicateBatch].Load() == 0 {
		t.Fatal("no duplicate batch was dropped")
	}
	if len(sc.groups) > 0 && w.sawHybrid == 0 {
		t.Fatal("no answer depended on the groups beyond group 0")
	}
}

func (w *modelWorld) freshPool(e *modelEngine) {
	w.nextSeed++
	e.pool = blockpool.New(blockpool.Config{
		BlockSize: modelBS, GPUBlocks: w.sc.gpuBlocks, CPUBlocks: w.sc.cpuBlocks,
		Seed: w.nextSeed, DPRank: e.rank, Groups: w.sc.groups,
		SelfDescribingOffload: w.sc.selfDescribing, ReportRemainingCopies: w.sc.remainingCopies,
	})
	e.instance++
	e.running = nil
}

func (w *modelWorld) benchTokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(w.rng.IntN(50))
	}
	return out
}

// randomRequest is a prompt from a shared-prefix group or from nowhere, with
// a random tail (often not a whole block), and sometimes a LoRA adapter, a
// cache salt or a multimodal item.
func (w *modelWorld) randomRequest(allowMM bool) blockpool.Request {
	var tokens []uint32
	if w.rng.IntN(4) != 0 {
		g := w.groups[w.rng.IntN(len(w.groups))]
		tokens = append(tokens, g[:modelBS*w.rng.IntN(len(g)/modelBS+1)]...)
	}
	tokens = append(tokens, w.benchTokens(w.rng.IntN(5*modelBS))...)
	if len(tokens) == 0 {
		tokens = w.benchTokens(1)
	}
	w.nextID++
	r := blockpool.Request{ID: fmt.Sprintf("r%d", w.nextID), Tokens: tokens}
	switch w.rng.IntN(10) {
	case 0:
		r.LoRA = "lora-a"
	case 1:
		r.LoRA = "lora-b"
	}
	if w.rng.IntN(7) == 0 {
		r.Salt = "tenant-" + string(rune('x'+w.rng.IntN(2)))
	}
	if allowMM && w.rng.IntN(10) == 0 && len(tokens) > modelBS {
		off := w.rng.IntN(len(tokens) - modelBS)
		r.MM = []blockpool.MMItem{{Hash: fmt.Sprintf("img-%d", w.rng.IntN(3)), Offset: off, Length: 1 + w.rng.IntN(2*modelBS)}}
	}
	return r
}

func (w *modelWorld) stepEngine(e *modelEngine) {
	p := e.pool
	if len(e.running) > 0 && w.rng.IntN(2) == 0 {
		i := w.rng.IntN(len(e.running))
		if err := p.Free(e.running[i]); err != nil {
			w.t.Fatal(err)
		}
		e.running = append(e.running[:i], e.running[i+1:]...)
	}
	if w.rng.Float64() < w.sc.resetP {
		w.freeAll(e)
		if err := p.ResetPrefixCache(); err != nil {
			w.t.Fatal(err)
		}
	}
	for range 1 + w.rng.IntN(2) {
		r := w.randomRequest(true)
		_, err := p.Allocate(r)
		if errors.Is(err, blockpool.ErrNoSpace) {
			w.freeAll(e)
			_, err = p.Allocate(r)
		}
		if errors.Is(err, blockpool.ErrNoSpace) {
			continue // longer than the whole cache
		}
		if err != nil {
			w.t.Fatal(err)
		}
		e.running = append(e.running, r.ID)
		if len(r.MM) == 0 {
			w.recent = append(w.recent, r)
			if len(w.recent) > 40 {
				w.recent = w.recent[1:]
			}
		}
	}
	b, seq, ok := p.Step()
	if ok {
		w.deliver(e, b, seq)
	}
	if w.rng.Float64() < w.sc.restartP {
		w.ix.Restart(events.Stream{Endpoint: e.addr, DPRank: e.rank})
		w.freshPool(e)
	}
}

func (w *modelWorld) freeAll(e *modelEngine) {
	for _, id := range e.running {
		if err := e.pool.Free(id); err != nil {
			w.t.Fatal(err)
		}
	}
	e.running = nil
}

func (w *modelWorld) deliver(e *modelEngine, b *events.Batch, seq uint64) {
	o := events.Origin{
		Stream:    events.Stream{Endpoint: e.addr, DPRank: e.rank},
		Pod:       "pod-" + e.addr,
		Model:     modelModel,
		Instance:  fmt.Sprintf("inst-%d", e.instance),
		BlockSize: modelBS,
		Seq:       seq,
	}
	w.ix.Apply(o, b)
	if w.sc.duplicate {
		w.ix.Apply(o, b)
	}
	// The batch is the sink's only until Apply returns.
	for i := range b.Events {
		ev := &b.Events[i]
		for j := range ev.BlockHashes {
			ev.BlockHashes[j] = 0xdead
		}
		clear(ev.TokenIDs)
		ev.ExtraKeys = nil
	}
}

func (w *modelWorld) check(step int) {
	probes := append([]blockpool.Request(nil), w.recent...)
	for range 10 {
		probes = append(probes, w.randomRequest(false))
	}
	out := make([]Match, len(w.addrs))
	for _, r := range probes {
		keys := AppendBlockKeys(nil, RootKey(modelModel, r.LoRA, r.Salt), r.Tokens, modelBS)
		w.ix.Lookup(keys, w.addrs, out)
		for i, engs := range w.engines {
			var want blockpool.Held
			if w.member[i] {
				want = unionHeld(engs, r)
			}
			got := blockpool.Held{Blocks: out[i].Blocks, ByTier: out[i].ByTier}
			if want.Blocks > 0 {
				w.sawMatch++
				if want.Blocks < len(keys) {
					w.sawPartial++
				}
			}
			w.sawCPU += want.ByTier[events.TierCPU]
			if w.member[i] && len(w.sc.groups) > 0 {
				if plain := blockpool.HeldFrom(engs[0].pool.BlockTiers(r)); plain.Blocks != want.Blocks {
					w.sawHybrid++
				}
			}
			if got != want || out[i].Speculative != 0 {
				w.t.Fatalf("step %d, %s, prompt %v (lora %q salt %q): index %+v, engines %+v",
					step, w.addrs[i], r.Tokens, r.LoRA, r.Salt, out[i], want)
			}
		}
	}
	checkGaugesMatchContents(w.t, w.ix)
}

// unionHeld is what an endpoint with several ranks holds: a block is held
// if any rank holds it, in the fastest tier any rank has it. A hybrid
// engine's answer is its coordinator's (such scenarios run one rank).
func unionHeld(engs []*modelEngine, r blockpool.Request) blockpool.Held {
	if len(engs[0].pool.Config().Groups) > 0 {
		return engs[0].pool.Held(r)
	}
	tiers := engs[0].pool.BlockTiers(r)
	for _, e := range engs[1:] {
		for i, t := range e.pool.BlockTiers(r) {
			tiers[i] = min(tiers[i], t)
		}
	}
	return blockpool.HeldFrom(tiers)
}
