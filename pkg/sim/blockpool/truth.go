package blockpool

import (
	"slices"

	"github.com/kvroute/kvroute/pkg/events"
)

// blockContent is what one block was computed from: its parent's hash and
// its own tokens and extras, which together with the request's LoRA name
// say what any index should key it by.
type blockContent struct {
	parent    uint64
	hasParent bool
	tokens    []uint32
	lora      string
	extra     events.ExtraKey
}

// remember records what block i of req (hashes being req's) was computed
// from, and prunes the record when it has grown well past what the pool
// can hold.
func (p *Pool) remember(req Request, hashes []uint64, i int) {
	bs := p.cfg.BlockSize
	c := blockContent{tokens: slices.Clone(req.Tokens[i*bs : (i+1)*bs]), lora: req.LoRA, extra: extraKeys(req, i, bs)}
	if i > 0 {
		c.parent, c.hasParent = hashes[i-1], true
	}
	p.content[hashes[i]] = c
	if len(p.content) > 4*(p.cfg.GPUBlocks+p.cfg.CPUBlocks)+64 {
		p.prune()
	}
}

// prune keeps the records of held blocks and of their ancestors, which a
// held block's key is computed through.
func (p *Pool) prune() {
	keep := make(map[uint64]bool, len(p.cached[0])+len(p.cpu))
	var mark func(h uint64)
	mark = func(h uint64) {
		for !keep[h] {
			c, ok := p.content[h]
			if !ok {
				return
			}
			keep[h] = true
			if !c.hasParent {
				return
			}
			h = c.parent
		}
	}
	for _, cached := range p.cached {
		for h := range cached {
			mark(h)
		}
	}
	for h := range p.cpu {
		mark(h)
	}
	for h := range p.content {
		if !keep[h] {
			delete(p.content, h)
		}
	}
}

// Block is one block the engine holds, as the ground truth describes it.
type Block struct {
	// Hash is the engine's own hash of the block.
	Hash uint64
	// Tiers is the set of tiers holding it, as a bit mask (1<<events.Tier).
	Tiers uint8
	// Chain is the block's tokens and those of its ancestors, root first,
	// one entry per block, and LoRA the request's adapter: what a router's
	// key for the block is computed from.
	Chain [][]uint32
	LoRA  string
	// Extras are the chain's per-block extras (nil where a block has none),
	// in the same order.
	Extras []events.ExtraKey
}

// Blocks returns every block the engine holds, in GPU (for any of its
// KV-cache groups) or CPU, with what it was computed from: the whole
// ground truth, not one prompt's prefix. Blocks whose chain cannot be traced to a root (never so in this model)
// are left out and counted.
func (p *Pool) Blocks() (out []Block, untraced int) {
	tiers := make(map[uint64]uint8, len(p.cached[0])+len(p.cpu))
	for _, cached := range p.cached {
		for h := range cached {
			tiers[h] |= 1 << events.TierGPU
		}
	}
	for h := range p.cpu {
		tiers[h] |= 1 << events.TierCPU
	}
	for h, t := range tiers {
		b := Block{Hash: h, Tiers: t}
		ok := true
		for cur := h; ; {
			c, found := p.content[cur]
			if !found {
				ok = false
				break
			}
			b.Chain = append(b.Chain, c.tokens)
			b.Extras = append(b.Extras, c.extra)
			b.LoRA = c.lora
			if !c.hasParent {
				break
			}
			cur = c.parent
		}
		if !ok {
			untraced++
			continue
		}
		slices.Reverse(b.Chain)
		slices.Reverse(b.Extras)
		out = append(out, b)
	}
	return out, untraced
}
