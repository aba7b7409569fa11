package index

import (
	"math/bits"

	"github.com/kvroute/kvroute/pkg/events"
)

// Match is what the index knows about one candidate's cached prefix of one
// request's blocks.
type Match struct {
	// Blocks is the longest leading run of the keys the candidate holds in
	// any tier, speculative holdings included.
	Blocks int
	// ByTier counts the run's blocks by the fastest tier holding each (GPU,
	// then CPU, then STORAGE); blocks held only speculatively are not here.
	ByTier [events.NumTiers]int
	// Speculative counts the run's blocks held only speculatively.
	Speculative int
}

// lookupScratch is one lookup's working memory, pooled so that lookups
// allocate nothing.
type lookupScratch struct {
	// slot[id] is 1 + the position in addrs of the endpoint with that id,
	// or 0 when the endpoint is not a candidate.
	slot []int32
	// ids are the endpoints whose slot entries are set.
	ids []uint16
	// homes[j] is the walk's keys[j]'s home in its table (keyTable.home).
	homes []uint64
	// dups pairs a repeated address's position with its first position.
	dups [][2]int
	// credited is the walk's list of candidates credited with the last
	// block whose holders were examined.
	credited []credited
	// hybrid lists the candidates with several KV-cache groups, answered
	// apart from the walk (see hybrid.go).
	hybrid []hybridCand
	// tiers is a hybrid answer's tier per block of its full-attention run.
	tiers []int8
	// grouped is Speculate's keys ordered by shard, due the speculative
	// records expiring.
	grouped []uint64
	due     []specRecord
}

type hybridCand struct {
	pos int
	ep  *ixEndpoint
	l   *layout
}

// Lookup fills out[i] with addrs[i]'s match for keys (a request's block
// keys, from RootKey and AppendBlockKeys). out must be at least as long as
// addrs; addresses the index does not know match nothing. The walk starts at
// block 0 and stops at the first block no candidate still in the running
// holds, so its cost follows the longest match, not the prompt's length;
// along a run of blocks with unchanged holders it costs one map read a block.
func (ix *Index) Lookup(keys []uint64, addrs []string, out []Match) {
	out = out[:len(addrs)]
	clear(out)
	// Members before idLimit: AddEndpoint raises the limit before it
	// publishes the member, so every id seen here fits the table.
	members := *ix.members.Load()
	sc := ix.scratch.Get().(*lookupScratch)
	if need := int(ix.idLimit.Load()); len(sc.slot) < need {
		sc.slot = make([]int32, need+need/4)
	}
	live := 0
	for i, a := range addrs {
		ep := members[a]
		if ep == nil {
			continue
		}
		if first := sc.slot[ep.id]; first != 0 {
			sc.dups = append(sc.dups, [2]int{i, int(first - 1)})
			continue
		}
		sc.slot[ep.id] = int32(i + 1)
		sc.ids = append(sc.ids, ep.id)
		if l := ep.layout.Load(); l != nil && l.hybrid {
			// Kept in the slot table, so that a repeat is still seen as one,
			// but out of the walk: its hit is not the plain leading run.
			sc.hybrid = append(sc.hybrid, hybridCand{pos: i, ep: ep, l: l})
			continue
		}
		live++
	}
	if len(keys) > 0 && (live > 0 || len(sc.hybrid) > 0) {
		if live > 0 {
			for _, h := range sc.hybrid {
				sc.slot[h.ep.id] = 0
			}
			ix.walk(keys, out, sc)
		}
		if len(sc.hybrid) > 0 {
			nowMs := ix.ms(ix.now())
			for _, h := range sc.hybrid {
				held := endpointHoldings{ix: ix, ep: h.ep.id, nowMs: nowMs}
				out[h.pos], sc.tiers = hybridMatch(keys, held, h.l, int(h.ep.blockSize.Load()), sc.tiers)
			}
		}
		for i := range out {
			m := &out[i]
			m.ByTier[events.TierGPU] = m.Blocks - m.Speculative - m.ByTier[events.TierCPU] - m.ByTier[events.TierStorage]
		}
	}
	sc.hybrid = sc.hybrid[:0]
	for _, id := range sc.ids {
		sc.slot[id] = 0
	}
	sc.ids = sc.ids[:0]
	for _, p := range sc.dups {
		out[p[0]] = out[p[1]]
	}
	sc.dups = sc.dups[:0]
	ix.scratch.Put(sc)
}

// credited is a candidate credited with a block, and under which tier
// (NumTiers for speculative).
type credited struct {
	cand int32
	tier int32
}

// walk credits each block of keys to the candidates whose runs reach it.
// Along a shared prefix consecutive blocks usually have the same holders;
// a block whose holder list has the same signature as the block before
// (and no speculative holders) is credited to the same candidates in the
// same tiers, so such runs cost O(1) a block, settled when the run ends.
func (ix *Index) walk(keys []uint64, out []Match, sc *lookupScratch) {
	slot := sc.slot
	nowMs := ix.ms(ix.now())
	last := sc.credited[:0]
	var prevSig uint64 // 0: the previous block cannot be repeated
	// prevWord is the previous block's holder word when it had a single,
	// real holder (0 otherwise): a block with that very word has the same
	// signature, known without computing it.
	var prevWord uint64
	run := 0
	settle := func() {
		for _, c := range last {
			m := &out[c.cand]
			m.Blocks += run
			if c.tier == events.NumTiers {
				m.Speculative += run
			} else {
				m.ByTier[c.tier] += run
			}
		}
		run = 0
	}
	// The keys are walked in batches, each with the shards of all its
	// keys read-locked at once, in ascending order; no lock is held
	// between batches. Batches double from walkFirstBatch, so that a walk
	// that stops early locks little it does not read; from
	// walkLockAllAfter on, one batch takes all the remaining keys (448
	// keys fall in all 64 shards).
	// The walk prefetches ahead of itself (see prefetchAhead): the probes
	// of a walk that goes on are otherwise cache misses taken one after
	// another, and here they overlap.
	if cap(sc.homes) < len(keys) {
		sc.homes = make([]uint64, len(keys)+len(keys)/4)
	}
	homes := sc.homes[:len(keys)]
	ix.prefetchAhead(keys, homes, 0)
	stopped := false
	for lo, hi := 0, 0; lo < len(keys) && !stopped; lo = hi {
		hi = len(keys)
		if lo < walkLockAllAfter {
			hi = min(hi, max(walkFirstBatch, 2*lo))
		}
		held := shardsOf(keys[lo:hi])
		ix.rlockAll(&held)
		for j := lo; j < hi; j++ {
			if j%prefetchChunk == 0 && j > 0 {
				ix.prefetchAhead(keys, homes, j)
			}
			key := keys[j]
			sh := ix.shard(key)
			v, ok := sh.m.getHome(key, homes[j])
			if !ok {
				stopped = true
				break
			}
			if v == prevWord && v != 0 {
				run++
				continue
			}
			var one [1]uint64
			var hs []uint64
			var sig uint64
			if v&setBit == 0 {
				one[0] = v
				hs = one[:]
				sig = sigOf(v)
			} else {
				hs = sh.sets[uint32(v)]
				if hs[1] == 0 {
					sig = hs[0]
				}
				hs = hs[setHeader:]
			}
			if sig != 0 && sig == prevSig {
				run++
				continue
			}
			settle()
			last = last[:0]
			// Credit block j to each holder that is a candidate whose run
			// reached j unbroken. Written out here rather than in a helper:
			// this loop is the lookup's cost when holders change.
			for _, h := range hs {
				id := int(h & epMask)
				if id >= len(slot) || slot[id] == 0 {
					continue
				}
				c := slot[id] - 1
				m := &out[c]
				if m.Blocks != j {
					continue
				}
				tier := int32(events.TierStorage)
				switch {
				case h&specBit != 0:
					if !specLive(h, nowMs) {
						continue
					}
					tier = events.NumTiers
					m.Speculative++
				case holderRefs(h, events.TierGPU) != 0:
					// Counted at the end, as what the other tiers leave.
					tier = int32(events.TierGPU)
				case holderRefs(h, events.TierCPU) != 0:
					tier = int32(events.TierCPU)
					m.ByTier[events.TierCPU]++
				default:
					m.ByTier[events.TierStorage]++
				}
				m.Blocks++
				last = append(last, credited{cand: c, tier: tier})
			}
			if len(last) == 0 {
				stopped = true
				break
			}
			prevSig = sig
			prevWord = 0
			if v&(setBit|specBit) == 0 {
				prevWord = v
			}
		}
		ix.runlockAll(&held)
	}
	settle()
	sc.credited = last[:0]
}

// walkFirstBatch is the keys in a walk's first batch; walkLockAllAfter is
// the block from which a walk's next batch is all its remaining keys.
const (
	walkFirstBatch   = 8
	walkLockAllAfter = 64
)

// A walk at block j (a multiple of prefetchChunk) prefetches the home
// slots of the chunk of keys prefetchChunk*homesAhead blocks ahead; at
// block 0, those of the chunks before that too. A slot's address is read
// from its shard's first line (which the lock will want too), and the key's
// home is kept for the probe.
const (
	prefetchChunk = 16
	homesAhead    = 2
)

// prefetchAhead is the walk's prefetching at block j: it sets homes[i] to
// keys[i]'s home for the keys it prefetches. It allocates nothing: an
// allocation here, while the collector marks, costs the walk its share of
// the marking, many times what the prefetching saves.
func (ix *Index) prefetchAhead(keys, homes []uint64, j int) {
	lo, hi := j+homesAhead*prefetchChunk, min(len(keys), j+(homesAhead+1)*prefetchChunk)
	if j == 0 {
		lo = 0
	}
	var addrs [(homesAhead + 1) * prefetchChunk]uintptr
	n := 0
	for i := lo; i < hi; i++ {
		t := &ix.shard(keys[i]).m
		h := t.home(keys[i])
		homes[i] = h
		if a := t.slotAddr(h); a != 0 {
			addrs[n] = a
			n++
		}
	}
	prefetch(addrs[:n])
}

// shardSet is a set of shards, one bit each.
type shardSet [numShards / 64]uint64

// shardsOf is the set of shards keys fall in.
func shardsOf(keys []uint64) shardSet {
	var s shardSet
	for _, k := range keys {
		i := k >> shardShift
		s[i/64] |= 1 << (i % 64)
	}
	return s
}

// rlockAll read-locks every shard in s, in ascending order.
//
// Why holding many shards cannot deadlock: a walk is the only holder of
// more than one shard lock, it holds no other lock of the index, and it
// takes its shards in ascending order. Every other user of a shard lock
// (Apply, Speculate, expiry, hybrid and single-key reads) holds one
// shard at a time and waits for nothing while holding it. A walk waiting
// for shard b (behind a writer queued on b, which Go's RWMutex lets go
// first) holds only shards below b; the writer waits only for b's readers,
// each of which holds b and waits, if at all, for a shard above b. So
// every chain of waits climbs the shard order and ends; none can close
// into a cycle. Writers are not starved either: a queued writer holds
// back new readers of its shard, and a walk holds its shards only for
// one batch of its keys.
func (ix *Index) rlockAll(s *shardSet) {
	for w, word := range s {
		for ; word != 0; word &= word - 1 {
			ix.shards[w*64+bits.TrailingZeros64(word)].mu.RLock()
		}
	}
}

// runlockAll releases what rlockAll took.
func (ix *Index) runlockAll(s *shardSet) {
	for w, word := range s {
		for ; word != 0; word &= word - 1 {
			ix.shards[w*64+bits.TrailingZeros64(word)].mu.RUnlock()
		}
	}
}
