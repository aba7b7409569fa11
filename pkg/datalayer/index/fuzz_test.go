package index

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// fuzzReader hands out the fuzz input a byte at a time, zeros once it runs out.
type fuzzReader struct {
	b []byte
}

func (r *fuzzReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *fuzzReader) done() bool { return len(r.b) == 0 }

// fuzzExtra builds one block's extras from the input: nothing, strings that
// may be a LoRA name or salt, integers of several widths, bytes, a tuple.
func (r *fuzzReader) extra() events.ExtraKey {
	n := int(r.next() % 4)
	if n == 0 {
		return nil
	}
	ex := make(events.ExtraKey, n)
	for i := range ex {
		switch r.next() % 6 {
		case 0:
			ex[i] = "lora"
		case 1:
			ex[i] = "salt"
		case 2:
			ex[i] = int8(r.next())
		case 3:
			ex[i] = uint64(r.next()) << 56
		case 4:
			ex[i] = []byte{r.next()}
		default:
			ex[i] = []any{"x", []any{nil, 1.5}}
		}
	}
	return ex
}

// FuzzIndexApply drives the index with arbitrary event sequences (hashes,
// parents, tokens, block sizes, extras, tiers, kinds as the network might
// send them) and checks it never panics, keeps its gauges equal to its
// contents, answers consistently, and forgets everything of an endpoint
// that leaves.
func FuzzIndexApply(f *testing.F) {
	f.Add([]byte{0, 3, 1, 0, 4, 1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{0, 2, 0, 0, 2, 9, 9, 9, 9, 1, 1, 0, 2, 0, 5})
	f.Add([]byte{0, 1, 0, 0, 1, 7, 7, 3, 1, 1, 4, 1, 0, 6, 0})
	f.Add([]byte{0, 2, 3, 2, 3, 1, 2, 3, 4, 5, 6, 1, 2, 1, 1, 5, 0, 4, 0, 3, 0})
	f.Add([]byte{0, 4, 129, 3, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 7, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		clk := newIxClock()
		var ages [events.NumTiers]time.Duration
		ages[events.TierCPU] = time.Second
		ix := New(Options{Now: clk.Now, MaxHoldings: 200, TierMaxAge: ages}, nil)
		ix.AddEndpoint(ixTestAddr)
		r := &fuzzReader{b: data}
		o := events.Origin{Stream: events.Stream{Endpoint: ixTestAddr}, Model: "m", Instance: "i", BlockSize: 2}
		var batch events.Batch
		for steps := 0; !r.done() && steps < 100; steps++ {
			batch.Reset()
			o.DPRank = int(r.next() % 2)
			for range 1 + int(r.next()%3) {
				var e events.Event
				switch r.next() % 8 {
				case 0, 1, 2:
					e.Kind = events.KindBlockStored
					n := int(r.next() % 5)
					for range n {
						e.BlockHashes = append(e.BlockHashes, uint64(r.next()%16)|uint64(r.next()%2)<<63)
					}
					if p := r.next(); p%3 != 0 {
						e.ParentHash, e.HasParent = uint64(p%16), true
					}
					e.BlockSize = int(r.next() % 4)
					for range int(r.next() % 12) {
						e.TokenIDs = append(e.TokenIDs, uint32(r.next()%4))
					}
					if r.next()%2 == 0 {
						e.LoRAName = "lora"
					}
					if r.next()%4 == 0 {
						e.LoRAID, e.HasLoRAID = int64(r.next()), true
					}
					for range int(r.next() % 4) {
						e.ExtraKeys = append(e.ExtraKeys, r.extra())
					}
					e.Medium = events.Tier(r.next() % events.NumTiers)
					e.GroupIdx = int(r.next() % 5 / 4)
					// Hybrid kinds, sparse offsets, token pairs, opaque
					// tokens and salts, as the newer publishers send them.
					switch r.next() % 6 {
					case 1:
						e.KVCacheSpecKind, e.SlidingWindow = "sliding_window", int(r.next()%7)
					case 2:
						e.KVCacheSpecKind = "mamba"
					case 3:
						e.KVCacheSpecKind = "cross_attention"
					}
					if r.next()%4 == 0 {
						off := int32(0)
						for range e.BlockHashes {
							off += int32(r.next() % 3)
							e.BlockOffsets = append(e.BlockOffsets, off)
							off++
						}
					}
					if r.next()%5 == 0 {
						e.Bigram, e.BigramNext = true, uint32(r.next()%4)
					}
					if r.next()%5 == 0 && len(e.TokenIDs) > 0 {
						e.OpaqueTokens = []int32{int32(int(r.next()) % len(e.TokenIDs))}
					}
					if r.next()%6 == 0 {
						e.CacheSalt = "salt"
					}
				case 3, 4:
					e.Kind = events.KindBlockRemoved
					for range int(r.next() % 4) {
						e.BlockHashes = append(e.BlockHashes, uint64(r.next()%16))
					}
					e.Medium = events.Tier(r.next() % events.NumTiers)
					e.GroupIdx = int(r.next() % 5 / 4)
					if r.next()%3 == 0 {
						for range e.BlockHashes {
							e.RemainingCopies = append(e.RemainingCopies, int32(r.next()%3))
						}
					}
				case 5:
					e.Kind = events.KindAllBlocksCleared
				case 6:
					ix.Speculate(ixTestAddr, AppendBlockKeys(nil, RootKey("m", "", ""), []uint32{0, 1, 2, 3}, 2))
					ix.SpeculateRank(ixTestAddr, int(r.next()%3), AppendBlockKeys(nil, RootKey("m", "", ""), []uint32{0, 1, 2, 3}, 2))
					clk.Advance(500e6)
					continue
				default:
					e.Kind = events.Kind(r.next())
				}
				batch.Events = append(batch.Events, e)
			}
			switch r.next() % 16 {
			case 0:
				ix.Restart(o.Stream)
				o.Seq = 0
			case 1:
				ix.Uncertain(o.Stream, events.Reason(r.next()%byte(events.NumReasons+1)))
			case 3:
				ix.SetStreamState(o.Stream, datalayer.StreamState(r.next()%byte(datalayer.NumStreamStates+1)))
			case 2:
				o.Seq-- // a replayed or reordered batch
			}
			ix.Apply(o, &batch)
			o.Seq++
			for _, lora := range []string{"", "lora"} {
				for _, salt := range []string{"", "salt"} {
					keys := AppendBlockKeys(nil, RootKey("m", lora, salt), []uint32{0, 1, 2, 3, 0, 0, 1, 1}, 2)
					out := make([]Match, 2)
					ix.Lookup(keys, []string{ixTestAddr, "other"}, out)
					m := out[0]
					if m.Blocks > len(keys) || m.Blocks != m.ByTier[0]+m.ByTier[1]+m.ByTier[2]+m.Speculative || out[1] != (Match{}) {
						t.Fatalf("inconsistent match %+v", out)
					}
					for _, rm := range ix.LookupRanks(keys, ixTestAddr, nil) {
						// A rank's own blocks are the endpoint's too.
						if rm.Blocks > len(keys) || rm.Speculative > rm.Blocks || rm.Blocks-rm.Speculative > m.Blocks {
							t.Fatalf("rank %+v against the endpoint's %+v", rm, m)
						}
					}
				}
			}
			if steps%16 == 0 {
				checkGaugesMatchContents(t, ix)
				checkRankSets(t, ix, ixTestAddr)
			}
		}
		checkGaugesMatchContents(t, ix)
		checkRankSets(t, ix, ixTestAddr)
		ix.Expire()
		ix.RemoveEndpoint(ixTestAddr)
		checkGaugesMatchContents(t, ix)
		if n := ix.stats.blocks.Load(); n != 0 {
			t.Fatalf("%d blocks left after the endpoint left", n)
		}
	})
}
