package loadgen

import (
	"math/rand/v2"
	"sync"

	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/sim"
)

// upstreamApprox is the upstream EPP's default scheduling with its
// approximate prefix cache, run in the client: the prompt's text is hashed
// in 16-token-sized chunks (datalayer.ApproxHashes, upstream's algorithm),
// matched against a per-endpoint LRU of what was routed there
// (datalayer.ApproxIndex, upstream's 31250-block capacity), and the
// default profile's scores are summed: prefix match 3, queue 2 (min-max
// over waiting), KV-cache utilisation 2 (1 - usage); the highest wins,
// ties broken at random. Queue and usage are read from the engines
// directly, which is fresher than upstream's 50ms scrape.
type upstreamApprox struct {
	replicas []*sim.Core
	model    string
	index    *approx.Index

	mu  sync.Mutex
	rng *rand.Rand
}

func newUpstreamApprox(replicas []*sim.Core, model string, seed uint64) *upstreamApprox {
	return &upstreamApprox{replicas: replicas, model: model,
		index: approx.New(0, nil), rng: rand.New(rand.NewPCG(seed, 2))}
}

func (u *upstreamApprox) pickText(prompt string) (address string) {
	req := &request.Request{Model: u.model, Prompt: prompt}
	hashes := approx.Hashes(nil, req, approx.DefaultBlockSizeTokens, approx.DefaultMaxBlocks)
	addrs := make([]string, len(u.replicas))
	waiting := make([]int, len(u.replicas))
	minW, maxW := int(^uint(0)>>1), 0
	for i, r := range u.replicas {
		addrs[i] = r.Engine().Config().Address
		waiting[i], _ = r.Load()
		minW, maxW = min(minW, waiting[i]), max(maxW, waiting[i])
	}
	match := make([]int, len(addrs))
	u.index.Match(hashes, addrs, match)

	u.mu.Lock()
	defer u.mu.Unlock()
	best, bestScore, ties := 0, -1.0, 0
	for i, r := range u.replicas {
		prefix := 0.0
		if len(hashes) > 0 {
			prefix = float64(match[i]) / float64(len(hashes))
		}
		queue := 1.0
		if maxW > minW {
			queue = float64(maxW-waiting[i]) / float64(maxW-minW)
		}
		score := 3*prefix + 2*queue + 2*(1-r.Engine().Usage())
		switch {
		case score > bestScore:
			best, bestScore, ties = i, score, 1
		case score == bestScore:
			ties++
			if u.rng.IntN(ties) == 0 {
				best = i
			}
		}
	}
	u.index.Record(addrs[best], hashes)
	return addrs[best]
}
