package simkit_test

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// The ground truth names every held block as an index fed the engine's
// events does, LoRA adapters, cache salts, the CPU tier and a hybrid
// model's KV-cache groups included; and an index that lost an event
// differs from it.
func TestTrueHoldingsAreWhatAnExactIndexHolds(t *testing.T) {
	t.Parallel()
	const bs = 4
	for _, tc := range []struct {
		name string
		pool blockpool.Config
		cpu  bool
	}{
		{"an engine offloading to CPU", blockpool.Config{BlockSize: bs, GPUBlocks: 40, CPUBlocks: 12, Seed: 9}, true},
		{"a hybrid engine: full attention, a sliding window and Mamba", blockpool.Config{BlockSize: bs, GPUBlocks: 60, Seed: 9,
			Groups: []blockpool.Group{{Kind: blockpool.FullAttention}, {Kind: blockpool.SlidingWindow, Window: 2*bs + 1}, {Kind: blockpool.Mamba}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const addr = "10.0.0.7:8000"
			ix := index.New(index.Options{}, nil)
			ix.AddEndpoint(addr)
			eng := sim.NewEngine(sim.EngineConfig{Pod: "vllm-0", Address: addr, Model: "m", Sink: ix, Pool: tc.pool}, nil)
			prompts := sim.SharedPrefix{Groups: 4, PromptsPerGroup: 4, SystemTokens: 3 * bs, QuestionTokens: 3 * bs, Seed: 2}.Prompts()
			for i, p := range prompts {
				switch i % 4 {
				case 1:
					p.LoRA = "adapter-a"
				case 2:
					p.Salt = "tenant-b"
				}
				for range 2 {
					p.ID = ""
					if _, err := eng.Serve(p); err != nil {
						t.Fatal(err)
					}
				}
			}
			truth, err := simkit.TrueHoldings(eng)
			if err != nil {
				t.Fatal(err)
			}
			d := simkit.DiffHoldings(truth, ix.Holdings(addr))
			if !d.Exact() || d.Held == 0 {
				t.Fatalf("index vs truth: %s", d)
			}
			cpu := 0
			for _, tiers := range truth {
				if tiers&2 != 0 {
					cpu++
				}
			}
			if tc.cpu && cpu == 0 {
				t.Fatal("nothing held in CPU: the tier check proves nothing")
			}
			// An index that never saw the engine is missing everything.
			other := index.New(index.Options{}, nil)
			other.AddEndpoint(addr)
			if d := simkit.DiffHoldings(truth, other.Holdings(addr)); d.Missing != d.Held || d.False != 0 {
				t.Fatalf("an empty index vs truth: %s", d)
			}
		})
	}
}
