package index

import (
	"slices"

	"github.com/kvroute/kvroute/pkg/events"
)

// Hybrid models keep several KV-cache groups: sliding-window layers beside
// full attention (Gemma 2 and 3, GPT-OSS, Cohere's Command A), Mamba or
// linear-attention layers beside attention (Jamba, Granite 4, Nemotron-H,
// Falcon-H1, Qwen3-Next and Qwen3.5). vLLM publishes each group's blocks
// apart, under the same block hashes, and a prefix is a cache hit only when
// every group can serve it the way its layers need:
//
//   - a full-attention group needs every block of the prefix;
//   - a sliding-window group of window W needs the last ceil((W-1)/B)
//     blocks before the prefix's end (B the block size), or the whole
//     prefix when it is shorter;
//   - a Mamba group needs the state at the prefix's end, one block.
//
// vLLM's hybrid coordinator takes the longest full-attention run and then
// lets each other group shorten it, again and again until no group does.
// The index keeps each group's holdings apart (the group's keys are the
// block keys XORed with a per-group mask) and answers hybrid endpoints the
// same way; endpoints with a single full-attention group keep the fast walk.

// groupClass is how a KV-cache group's layers decide a hit.
type groupClass uint8

const (
	// classFull needs every block: full attention, MLA, attention with
	// sinks, and what the index cannot model more finely (chunked local
	// attention, whose chunk size events do not carry; a sliding window
	// of unknown size; a kind it does not know), which can only make it
	// claim less than the engine would hit, never more.
	classFull groupClass = iota
	// classWindow needs the blocks inside its sliding window.
	classWindow
	// classMamba needs the state block at the prefix's end.
	classMamba
	// classNone is not prefix-cached (cross attention, encoder-only
	// attention); its events are counted and dropped.
	classNone
)

func classify(kind string, window int) groupClass {
	switch kind {
	case "sliding_window", "sliding_window_mla":
		if window > 0 {
			return classWindow
		}
	case "mamba":
		return classMamba
	case "cross_attention", "encoder_only_attention":
		return classNone
	}
	return classFull
}

// groupSpec is what the index knows of one KV-cache group of an endpoint.
type groupSpec struct {
	idx    int
	class  groupClass
	window int // tokens, for classWindow
	// blockSize is the group's own block size in tokens, when its events
	// name one; a multiple of the endpoint's for coarse groups.
	blockSize int
}

// layout is an endpoint's KV-cache groups, immutable once published, so
// that lookups read it without the endpoint's lock.
type layout struct {
	groups []groupSpec // by idx
	// hybrid is set when lookups must follow the coordinator's rule: more
	// than one group, or a single group that is not full attention.
	hybrid bool
}

func (l *layout) spec(g int) (groupSpec, bool) {
	if l == nil {
		return groupSpec{}, false
	}
	for _, s := range l.groups {
		if s.idx == g {
			return s, true
		}
	}
	return groupSpec{}, false
}

// noteGroup records what a stored event says about its group, publishing a
// new layout when that changes anything. Called with ep.mu held.
func (ep *ixEndpoint) noteGroup(e *events.Event) groupClass {
	old := ep.layout.Load()
	cur, known := old.spec(e.GroupIdx)
	next := groupSpec{idx: e.GroupIdx, class: classify(e.KVCacheSpecKind, e.SlidingWindow), window: e.SlidingWindow, blockSize: cur.blockSize}
	if len(e.TokenIDs) > 0 && e.BlockSize > 0 && e.Medium == events.TierGPU {
		// The group's own block size, as its GPU stores show it; offload
		// tiers may store coarser chunks of any group.
		next.blockSize = e.BlockSize
	}
	if known && e.KVCacheSpecKind == "" {
		// Older vLLM names no kind; what an earlier event said stands.
		next.class, next.window = cur.class, cur.window
	}
	if known && next == cur {
		return cur.class
	}
	l := &layout{}
	if old != nil {
		l.groups = slices.Clone(old.groups)
	}
	if i := slices.IndexFunc(l.groups, func(s groupSpec) bool { return s.idx == e.GroupIdx }); i >= 0 {
		l.groups[i] = next
	} else {
		l.groups = append(l.groups, next)
		if !slices.ContainsFunc(l.groups, func(s groupSpec) bool { return s.idx == 0 }) {
			// Every engine has a group 0; until its stores say what it
			// is, it counts as full attention, which holds nothing yet.
			l.groups = append(l.groups, groupSpec{idx: 0, class: classFull})
		}
		slices.SortFunc(l.groups, func(a, b groupSpec) int { return a.idx - b.idx })
	}
	l.hybrid = len(l.groups) > 1 || l.groups[0].idx != 0 || l.groups[0].class != classFull
	ep.layout.Store(l)
	return next.class
}

// groupClassOf returns the class of group g as the endpoint knows it: what
// its stores said, or full attention when none has named it.
func (ep *ixEndpoint) groupClassOf(g int) groupClass {
	if s, ok := ep.layout.Load().spec(g); ok {
		return s.class
	}
	return classFull
}

// groupMask is XORed into a block key to name the same block in group g's
// holdings; group 0 keeps the plain keys, so an endpoint with one group
// costs nothing. The mask keeps the low bits a key leaves free, and XOR
// lets a group's handle give back the block's plain key.
func groupMask(g int) uint64 {
	if g == 0 {
		return 0
	}
	x := uint64(g) + 0x9e3779b97f4a7c15
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	if x &= keyMask; x == 0 {
		x = 1 << keyLowBits
	}
	return x
}

// group returns the sub-stream that holds group g's blocks of st's engine:
// st itself for group 0. Called with ep.mu held.
func (st *ixStream) group(g int) *ixStream {
	if g == 0 {
		return st
	}
	sub := st.groups[g]
	if sub == nil {
		if st.groups == nil {
			st.groups = make(map[int]*ixStream)
		}
		sub = &ixStream{handles: make(map[uint64]uint64), gidx: g, root: st}
		st.groups[g] = sub
	}
	return sub
}

// keyOf returns the plain block key the engine's hash h names, looking in
// sub's group first and then in every other group of st: a hash names the
// same prefix in every group of one engine.
func (st *ixStream) keyOf(sub *ixStream, h uint64) (uint64, bool) {
	if hv, ok := sub.handles[h]; ok {
		return hv&keyMask ^ groupMask(sub.gidx), true
	}
	if sub != st {
		if hv, ok := st.handles[h]; ok {
			return hv & keyMask, true
		}
	}
	for g, other := range st.groups {
		if other == sub {
			continue
		}
		if hv, ok := other.handles[h]; ok {
			return hv&keyMask ^ groupMask(g), true
		}
	}
	return 0, false
}

// holdings is where a hybrid match looks a block up: an endpoint's
// blocks merged over its ranks, or one data-parallel rank's.
type holdings interface {
	// heldIn reports whether block key k is held in group g: really, in
	// any tier, or speculatively (a speculative holding is recorded under
	// the plain key and stands for every group, as the engine about to
	// compute the prompt will hold it in all of them). It also returns the
	// fastest real tier, NumTiers when the holding is speculative only.
	heldIn(k uint64, g int) (bool, int32)
}

// endpointHoldings are an endpoint's blocks in the key shards.
type endpointHoldings struct {
	ix    *Index
	ep    uint16
	nowMs uint64
}

func (e endpointHoldings) heldIn(k uint64, g int) (bool, int32) {
	h := e.ix.holderOf(k^groupMask(g), e.ep)
	if h != 0 && h&specBit == 0 {
		for t := events.Tier(0); t < events.NumTiers; t++ {
			if holderRefs(h, t) != 0 {
				return true, int32(t)
			}
		}
	}
	if g != 0 {
		h = e.ix.holderOf(k, e.ep)
	}
	if h&specBit != 0 && specLive(h, e.nowMs) {
		return true, events.NumTiers
	}
	return false, 0
}

func (ix *Index) holderOf(k uint64, ep uint16) uint64 {
	sh := ix.shard(k)
	sh.mu.RLock()
	h := sh.get(k, ep)
	sh.mu.RUnlock()
	return h
}

// hybridMatch answers keys on held, with layout l and block size bs, as
// vLLM's hybrid coordinator would decide the hit; tiers is scratch, handed
// back for reuse.
func hybridMatch[H holdings](keys []uint64, held H, l *layout, bs int, tiers []int8) (Match, []int8) {
	n := len(keys)
	// Full attention is downward closed: every full group must hold every
	// block, so one left-to-right pass bounds the hit. The tier each block
	// is reported in (the first full group's) is noted on the way.
	primary := -1
	for _, s := range l.groups {
		if s.class == classFull {
			primary = s.idx
			break
		}
	}
	tiers = tiers[:0]
	if primary >= 0 {
		j := 0
	walk:
		for ; j < n; j++ {
			for _, s := range l.groups {
				if s.class != classFull {
					continue
				}
				ok, t := held.heldIn(keys[j], s.idx)
				if !ok {
					break walk
				}
				if s.idx == primary {
					tiers = append(tiers, int8(t))
				}
			}
		}
		n = j
	}
	// Every other group may only shorten the hit; shortening can change
	// another group's answer, so repeat until none shortens it.
	for changed := true; changed && n > 0; {
		changed = false
		for _, s := range l.groups {
			var hit int
			switch s.class {
			case classWindow:
				hit = windowHit(keys[:n], s, bs, held)
			case classMamba:
				hit = mambaHit(keys[:n], s.idx, held)
			default:
				continue
			}
			if hit < n {
				n, changed = hit, true
			}
		}
	}
	n = alignHit(n, l, bs)
	var m Match
	m.Blocks = n
	for j := 0; j < n; j++ {
		var t int32
		if primary >= 0 {
			t = int32(tiers[j])
		} else {
			_, t = held.heldIn(keys[j], l.groups[0].idx)
		}
		switch {
		case t == events.NumTiers:
			m.Speculative++
		case t == int32(events.TierCPU):
			m.ByTier[events.TierCPU]++
		case t == int32(events.TierStorage):
			m.ByTier[events.TierStorage]++
		}
	}
	return m, tiers
}

// windowHit is a sliding-window group's hit within keys: scanning from the
// end, the first run of blocks long enough to fill the window, or else the
// run of held blocks from the start.
func windowHit[H holdings](keys []uint64, s groupSpec, bs int, held H) int {
	if bs <= 0 {
		return len(keys)
	}
	need := (s.window - 1 + bs - 1) / bs
	if need < 1 {
		need = 1
	}
	run := 0
	for i := len(keys) - 1; i >= 0; i-- {
		if ok, _ := held.heldIn(keys[i], s.idx); !ok {
			run = 0
			continue
		}
		if run++; run >= need {
			return i + need
		}
	}
	return run
}

// mambaHit is a Mamba group's hit within keys: up to the last block whose
// state the group holds.
func mambaHit[H holdings](keys []uint64, g int, held H) int {
	for i := len(keys) - 1; i >= 0; i-- {
		if ok, _ := held.heldIn(keys[i], g); ok {
			return i + 1
		}
	}
	return 0
}

// alignHit rounds a hit down to the coarsest group's block, as vLLM aligns
// hits to the least common multiple of its groups' block sizes.
func alignHit(n int, l *layout, bs int) int {
	if bs <= 0 {
		return n
	}
	align := 1
	for _, s := range l.groups {
		if s.blockSize > bs && s.blockSize%bs == 0 {
			align = lcm(align, s.blockSize/bs)
		}
	}
	return n - n%align
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}

// synthHandle names the j-th block inside a coarse store (an event whose
// block is a multiple of the engine's, such as LMCache's 256-token chunks)
// so that each such block has a handle of its own; the store's own hash
// names its last block.
func synthHandle(h uint64, j int) uint64 {
	x := h ^ (uint64(j)+1)*0xd6e8feb86659fd93
	x ^= x >> 32
	x *= 0xd6e8feb86659fd93
	x ^= x >> 32
	return x
}
