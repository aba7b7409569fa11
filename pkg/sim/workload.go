package sim

import (
	"fmt"
	"math/rand/v2"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// SharedPrefix is a workload of prompt groups that share a system prompt, as
// in the upstream EPP's prefix-cache benchmarks: each prompt is its group's
// system prompt followed by a question of its own.
type SharedPrefix struct {
	Groups          int
	PromptsPerGroup int
	SystemTokens    int
	QuestionTokens  int
	// Vocab bounds the token ids drawn (default 32000).
	Vocab int
	Seed  uint64
}

// Prompts returns the workload's prompts in a shuffled order.
func (w SharedPrefix) Prompts() []blockpool.Request {
	vocab := w.Vocab
	if vocab <= 0 {
		vocab = 32000
	}
	r := rand.New(rand.NewPCG(w.Seed, w.Seed^0x5eed))
	draw := func(n int) []uint32 {
		out := make([]uint32, n)
		for i := range out {
			out[i] = uint32(r.IntN(vocab))
		}
		return out
	}
	var out []blockpool.Request
	for g := range w.Groups {
		system := draw(w.SystemTokens)
		for q := range w.PromptsPerGroup {
			toks := append(append(make([]uint32, 0, w.SystemTokens+w.QuestionTokens), system...), draw(w.QuestionTokens)...)
			out = append(out, blockpool.Request{ID: fmt.Sprintf("g%d-q%d", g, q), Tokens: toks})
		}
	}
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}
