package sim

import (
	"fmt"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// HeldBlocks is the engine's ground truth over its whole cache: every
// block it holds, in GPU or CPU, with the tiers holding it and the token
// runs (and LoRA adapter and extras) it was computed from, root first. A
// router's index fed the engine's events holds for it exactly the blocks
// these name, not only those of the prompts a test happens to ask about.
func (e *Engine) HeldBlocks() ([]blockpool.Block, error) {
	e.mu.Lock()
	blocks, untraced := e.pool.Blocks()
	e.mu.Unlock()
	if untraced > 0 {
		return nil, fmt.Errorf("engine %s: %d held blocks cannot be traced to a root", e.cfg.Pod, untraced)
	}
	return blocks, nil
}
