package sim_test

import (
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// The ground truth names every held block as an index fed the engine's
// events does, LoRA adapters, cache salts and the CPU tier included; and
// an index that lost an event differs from it.
func TestTrueHoldingsAreWhatAnExactIndexHolds(t *testing.T) {
	t.Parallel()
	const addr, bs = "10.0.0.7:8000", 4
	ix := index.New(index.Options{}, nil)
	ix.AddEndpoint(addr)
	eng := sim.NewEngine(sim.EngineConfig{Pod: "vllm-0", Address: addr, Model: "m", Sink: ix,
		Pool: blockpool.Config{BlockSize: bs, GPUBlocks: 40, CPUBlocks: 12, Seed: 9}}, nil)
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
	truth, err := eng.TrueHoldings()
	if err != nil {
		t.Fatal(err)
	}
	d := sim.DiffHoldings(truth, ix.Holdings(addr))
	if !d.Exact() || d.Held == 0 {
		t.Fatalf("index vs truth: %s", d)
	}
	cpu := 0
	for _, tiers := range truth {
		if tiers&2 != 0 {
			cpu++
		}
	}
	if cpu == 0 {
		t.Fatal("nothing held in CPU: the tier check proves nothing")
	}
	// An index that never saw the engine is missing everything.
	other := index.New(index.Options{}, nil)
	other.AddEndpoint(addr)
	if d := sim.DiffHoldings(truth, other.Holdings(addr)); d.Missing != d.Held || d.False != 0 {
		t.Fatalf("an empty index vs truth: %s", d)
	}
}
