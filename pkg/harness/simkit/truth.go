package simkit

import (
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
)

// TrueHoldings is e's ground truth (Engine.HeldBlocks) under the keys
// kvroute's index gives its blocks (index.RootKey, index.AppendBlockKeys),
// with the set of tiers holding each as a bit mask (1<<events.Tier): what
// an exact index holds for the endpoint (Index.Holdings). Blocks keyed
// with multimodal extras cannot be named this way, and make it return an
// error.
func TrueHoldings(e *sim.Engine) (map[uint64]uint8, error) {
	blocks, err := e.HeldBlocks()
	if err != nil {
		return nil, err
	}
	cfg := e.Config()
	out := make(map[uint64]uint8, len(blocks))
	var keys []uint64
	for _, b := range blocks {
		salt, ok := plainSalt(b.Extras, b.LoRA)
		if !ok {
			return nil, fmt.Errorf("engine %s: block %x carries extras no plain request reproduces", cfg.Pod, b.Hash)
		}
		k := index.RootKey(cfg.Model, b.LoRA, salt)
		for _, tokens := range b.Chain {
			keys = index.AppendBlockKeys(keys[:0], k, tokens, cfg.Pool.BlockSize)
			k = keys[0]
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
