package sim

import (
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
)

// TrueHoldings is the engine's ground truth over its whole cache: every
// block it holds, in GPU or CPU, under the key kvroute's index gives it
// (index.RootKey, index.AppendBlockKeys), with the set of tiers holding it
// as a bit mask (1<<events.Tier). An exact index holds for the endpoint
// exactly these (Index.Holdings), not only the blocks of the prompts a
// test happens to ask about. Blocks keyed with multimodal extras cannot
// be named this way, and make it return an error.
func (e *Engine) TrueHoldings() (map[uint64]uint8, error) {
	e.mu.Lock()
	blocks, untraced := e.pool.Blocks()
	e.mu.Unlock()
	if untraced > 0 {
		return nil, fmt.Errorf("engine %s: %d held blocks cannot be traced to a root", e.cfg.Pod, untraced)
	}
	bs := e.cfg.Pool.BlockSize
	out := make(map[uint64]uint8, len(blocks))
	for _, b := range blocks {
		salt, ok := plainSalt(b.Extras, b.LoRA)
		if !ok {
			return nil, fmt.Errorf("engine %s: block %x carries extras no plain request reproduces", e.cfg.Pod, b.Hash)
		}
		k := index.RootKey(e.cfg.Model, b.LoRA, salt)
		for _, tokens := range b.Chain {
			k = index.AppendBlockKeys(nil, k, tokens, bs)[0]
		}
		out[k] |= b.Tiers
	}
	return out, nil
}

// plainSalt reads a chain's extras as a plain request produces them: the
// LoRA name on every block, and a cache salt on the first only.
func plainSalt(extras []events.ExtraKey, lora string) (salt string, ok bool) {
	for i, ex := range extras {
		j := 0
		if lora != "" && j < len(ex) && ex[j] == any(lora) {
			j++
		}
		if i == 0 && j < len(ex) {
			s, isStr := ex[j].(string)
			if !isStr {
				return "", false
			}
			salt = s
			j++
		}
		if j != len(ex) {
			return "", false
		}
	}
	return salt, true
}

// HoldingsDiff compares an index's holdings for one endpoint with its
// engine's ground truth.
type HoldingsDiff struct {
	// False counts blocks the index says the engine holds and it does not;
	// Missing blocks it holds that the index does not know; WrongTier
	// blocks both hold but in different tiers.
	False, Missing, WrongTier int
	// Held is how many blocks the engine holds.
	Held int
}

// Exact reports whether the index equals the truth.
func (d HoldingsDiff) Exact() bool { return d.False == 0 && d.Missing == 0 && d.WrongTier == 0 }

func (d HoldingsDiff) String() string {
	return fmt.Sprintf("%d false, %d missing, %d in the wrong tier, of %d held", d.False, d.Missing, d.WrongTier, d.Held)
}

// DiffHoldings compares indexed (an index's holdings for an endpoint) with
// truth (its engine's).
func DiffHoldings(truth, indexed map[uint64]uint8) HoldingsDiff {
	d := HoldingsDiff{Held: len(truth)}
	for k, t := range truth {
		switch it, ok := indexed[k]; {
		case !ok:
			d.Missing++
		case it != t:
			d.WrongTier++
		}
	}
	for k := range indexed {
		if _, ok := truth[k]; !ok {
			d.False++
		}
	}
	return d
}
