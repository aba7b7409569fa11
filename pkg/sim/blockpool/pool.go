// Package blockpool models one vLLM engine's prefix-caching KV block pool,
// closely enough to stand in for the engine wherever kvroute needs its KV
// events: a fixed number of GPU blocks, prefix reuse of cached full blocks,
// least-recently-freed eviction with a removal published only when a cached
// slot is reused, an optional CPU offload tier, and reset_prefix_cache. It
// publishes real events.Event values, one events.Batch per engine step, with
// opaque per-engine hashes (seeded, so two engines hash the same prompt
// differently), and it can say which of a prompt's leading blocks it truly
// holds, the ground truth an index is checked against.
package blockpool

import (
	"container/list"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/kvroute/kvroute/pkg/events"
)

// Errors returned by Pool methods.
var (
	// ErrNoSpace: the request needs more GPU blocks than are free; the
	// engine would queue or preempt instead.
	ErrNoSpace = errors.New("blockpool: not enough free GPU blocks")
	// ErrRunning: a request with this id is already running.
	ErrRunning = errors.New("blockpool: request already running")
	// ErrNotRunning: no running request has this id.
	ErrNotRunning = errors.New("blockpool: request not running")
	// ErrInUse: reset_prefix_cache refuses while requests hold blocks.
	ErrInUse = errors.New("blockpool: blocks in use")
)

// Config describes one engine.
type Config struct {
	// BlockSize is tokens per block (vLLM's default is 16).
	BlockSize int
	// GPUBlocks is the GPU KV cache's capacity in blocks, shared by every
	// KV-cache group as vLLM's one block pool is.
	GPUBlocks int
	// CPUBlocks is the offload tier's capacity in blocks; 0 means no offload.
	// Only a pool of one group offloads.
	CPUBlocks int
	// SelfDescribingOffload makes CPU stores carry their tokens, parent and
	// block size, as vLLM 0.26 does with self_describing_kv_events;
	// otherwise they are placeholders (hashes only), as before.
	SelfDescribingOffload bool
	// ReportRemainingCopies makes each GPU removal say how many copies of
	// the block the pool still caches (vLLM's pending remaining_copy_counts).
	ReportRemainingCopies bool
	// Groups are the model's KV-cache groups, for a hybrid model; nil is one
	// full-attention group whose events name no group, as for most models.
	Groups []Group
	// Seed makes this engine's block hashes its own, as vLLM's per-process
	// hash seed does.
	Seed uint64
	// DPRank is the data-parallel rank written into each batch.
	DPRank int
	// Now stamps batches; nil means time.Now.
	Now func() time.Time
}

// GroupKind is how a KV-cache group's layers use cached blocks.
type GroupKind uint8

// The group kinds vLLM's hybrid models have.
const (
	// FullAttention needs every block of a prefix.
	FullAttention GroupKind = iota
	// SlidingWindow needs only the blocks within Window tokens of the
	// prefix's end, and frees those before it as the request runs.
	SlidingWindow
	// Mamba keeps a state block per prefix end (vLLM's align mode): a
	// prompt caches only the state at its last full block.
	Mamba
)

// Group is one KV-cache group.
type Group struct {
	Kind GroupKind
	// Window is a sliding-window group's window, in tokens.
	Window int
}

func (g Group) specKind() string {
	switch g.Kind {
	case SlidingWindow:
		return "sliding_window"
	case Mamba:
		return "mamba"
	}
	return "full_attention"
}

// MMItem is a multimodal input: its content hash and the token positions its
// placeholder tokens occupy.
type MMItem struct {
	Hash           string
	Offset, Length int
}

// Request is one inference request as the block pool sees it.
type Request struct {
	ID     string
	Tokens []uint32
	LoRA   string
	Salt   string
	MM     []MMItem
}

// Held is the ground truth for one prompt: the leading full blocks the
// engine would serve from cache, each counted under the fastest tier
// holding it.
type Held struct {
	Blocks int
	ByTier [events.NumTiers]int
}

// Pool is one engine's block pool. It is not safe for concurrent use: an
// engine's scheduler is one loop.
type Pool struct {
	cfg    Config
	groups []Group
	hybrid bool

	// Per GPU slot: the hash of the full block it caches and the group it
	// caches it for (valid when hashed), and how many running requests use
	// it.
	hash   []uint64
	group  []int
	hashed []bool
	refs   []int

	// free is the queue of slots with no running request, least recently
	// freed first; a cached slot stays cached in it until it is reused.
	free     *list.List
	freeElem []*list.Element

	// cached maps, per group, a hash to the GPU slots caching it: vLLM
	// does not de-duplicate, so a block computed twice is cached twice.
	cached []map[uint64][]int

	// cpu is the offload tier: hash to its place in an LRU list.
	cpu    map[uint64]*list.Element
	cpuLRU *list.List

	running map[string][]int
	// heldBy counts, in a hybrid pool, each running request's slots per
	// group, in the order running lists them.
	heldBy map[string][]int

	// content is what each block stored was computed from, for the ground
	// truth (truth.go); pruned to held blocks and their ancestors.
	content map[uint64]blockContent

	pending []events.Event
	seq     uint64
	steps   uint64
}

// New returns an empty pool. It panics on a configuration no engine could
// have (a programming error, not input).
func New(cfg Config) *Pool {
	groups := cfg.Groups
	if len(groups) == 0 {
		groups = []Group{{Kind: FullAttention}}
	}
	bad := cfg.BlockSize <= 0 || cfg.GPUBlocks <= 0 || cfg.CPUBlocks < 0 ||
		(len(cfg.Groups) > 0 && cfg.CPUBlocks > 0)
	for _, g := range groups {
		bad = bad || (g.Kind == SlidingWindow && g.Window <= 0) || g.Kind > Mamba
	}
	if bad {
		panic(fmt.Sprintf("blockpool: invalid config %+v", cfg))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Pool{
		cfg:      cfg,
		groups:   groups,
		hybrid:   len(cfg.Groups) > 0,
		hash:     make([]uint64, cfg.GPUBlocks),
		group:    make([]int, cfg.GPUBlocks),
		hashed:   make([]bool, cfg.GPUBlocks),
		refs:     make([]int, cfg.GPUBlocks),
		free:     list.New(),
		freeElem: make([]*list.Element, cfg.GPUBlocks),
		cached:   make([]map[uint64][]int, len(groups)),
		cpu:      map[uint64]*list.Element{},
		cpuLRU:   list.New(),
		running:  map[string][]int{},
		content:  map[uint64]blockContent{},
	}
	for g := range p.cached {
		p.cached[g] = map[uint64][]int{}
	}
	for s := range cfg.GPUBlocks {
		p.freeElem[s] = p.free.PushBack(s)
	}
	return p
}

// Config returns the pool's configuration.
func (p *Pool) Config() Config { return p.cfg }

// FreeBlocks is the number of GPU blocks no running request uses.
func (p *Pool) FreeBlocks() int { return p.free.Len() }

// Usage is the share of GPU blocks in use by running requests, as vLLM's
// kv_cache_usage reports it.
func (p *Pool) Usage() float64 {
	return 1 - float64(p.free.Len())/float64(p.cfg.GPUBlocks)
}

// ResidentUsage is the share of GPU blocks holding KV: those running
// requests use, and those cached that no request uses until reused.
func (p *Pool) ResidentUsage() float64 {
	empty := 0
	for e := p.free.Front(); e != nil; e = e.Next() {
		if !p.hashed[e.Value.(int)] {
			empty++
		}
	}
	return 1 - float64(empty)/float64(p.cfg.GPUBlocks)
}

// BlockHashes returns the engine's hashes of req's full blocks. Every
// KV-cache group names a block by the same hash, as vLLM does.
func (p *Pool) BlockHashes(req Request) []uint64 {
	bs := p.cfg.BlockSize
	n := len(req.Tokens) / bs
	out := make([]uint64, n)
	var parent uint64
	for i := range n {
		parent = p.blockHash(parent, req.Tokens[i*bs:(i+1)*bs], extraKeys(req, i, bs))
		out[i] = parent
	}
	return out
}

// blockHash stands in for vLLM's hash of (parent, tokens, extras): opaque,
// seeded per engine, never zero (some publishers write 0 for "no parent").
func (p *Pool) blockHash(parent uint64, tokens []uint32, extra events.ExtraKey) uint64 {
	d := xxhash.NewWithSeed(p.cfg.Seed)
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], parent)
	_, _ = d.Write(b[:])
	for _, t := range tokens {
		binary.LittleEndian.PutUint32(b[:4], t)
		_, _ = d.Write(b[:4])
	}
	for _, x := range extra {
		_, _ = fmt.Fprintf(d, "|%v", x)
	}
	if h := d.Sum64(); h != 0 {
		return h
	}
	return 1
}

// extraKeys is what vLLM folds into block i's hash, in its order: the LoRA
// name, each multimodal item overlapping the block as (its hash, its start
// relative to the block), and the cache salt on the first block only. Nil
// when there is none.
func extraKeys(req Request, i, bs int) events.ExtraKey {
	var ex events.ExtraKey
	if req.LoRA != "" {
		ex = append(ex, req.LoRA)
	}
	lo, hi := i*bs, (i+1)*bs
	for _, mm := range req.MM {
		if mm.Offset < hi && mm.Offset+mm.Length > lo {
			ex = append(ex, []any{mm.Hash, int64(mm.Offset - lo)})
		}
	}
	if i == 0 && req.Salt != "" {
		ex = append(ex, req.Salt)
	}
	return ex
}

// has reports whether group g caches the block with hash h.
func (p *Pool) has(g int, h uint64) bool { return len(p.cached[g][h]) > 0 }

// hitLength is the longest prefix of hashes that vLLM's KV-cache coordinator
// would serve from cache: every full-attention group must hold each of its
// blocks; then each sliding-window and Mamba group may shorten it, over
// and over until none does. (Only the GPU tier: a hybrid pool does not
// offload.)
func (p *Pool) hitLength(hashes []uint64) int {
	n := len(hashes)
	for i, h := range hashes {
		held := true
		for g, grp := range p.groups {
			if grp.Kind == FullAttention && !p.has(g, h) {
				held = false
			}
		}
		if !held {
			n = i
			break
		}
	}
	bs := p.cfg.BlockSize
	for shortened := true; shortened; {
		shortened = false
		for g, grp := range p.groups {
			var hit int
			switch grp.Kind {
			case SlidingWindow:
				hit = p.windowHit(g, grp, hashes[:n], bs)
			case Mamba:
				hit = p.stateHit(g, hashes[:n])
			default:
				continue
			}
			if hit < n {
				n, shortened = hit, true
			}
		}
	}
	return n
}

// windowHit follows vLLM's sliding-window manager: from the right, the
// first run of ceil((window-1)/bs) cached blocks ends the hit there; with
// none, only the run of cached blocks from the start counts.
func (p *Pool) windowHit(g int, grp Group, hashes []uint64, bs int) int {
	need := max(1, (grp.Window-1+bs-1)/bs)
	run := 0
	for i := len(hashes) - 1; i >= 0; i-- {
		if !p.has(g, hashes[i]) {
			run = 0
			continue
		}
		if run++; run >= need {
			return i + need
		}
	}
	return run
}

// stateHit follows vLLM's Mamba manager: the hit ends after the last block
// whose state is cached.
func (p *Pool) stateHit(g int, hashes []uint64) int {
	for i := len(hashes) - 1; i >= 0; i-- {
		if p.has(g, hashes[i]) {
			return i + 1
		}
	}
	return 0
}

// Allocate admits a request: its leading full blocks already cached are
// reused (all but the last token can hit, as in vLLM; in a hybrid model,
// as far as every group can serve them), fresh blocks are taken for the
// rest, and its newly computed full blocks are cached at once. It returns
// how many blocks hit. Nothing changes when it fails.
func (p *Pool) Allocate(req Request) (hit int, err error) {
	if _, ok := p.running[req.ID]; ok {
		return 0, fmt.Errorf("allocate %q: %w", req.ID, ErrRunning)
	}
	bs := p.cfg.BlockSize
	hashes := p.BlockHashes(req)
	total := (len(req.Tokens) + bs - 1) / bs
	full := len(hashes)
	maxHit := 0
	if len(req.Tokens) > 0 {
		maxHit = (len(req.Tokens) - 1) / bs
	}
	hit = p.hitLength(hashes[:maxHit])

	// Which cached slots each group reuses, and how many fresh ones it needs.
	reuse := make([][]int, len(p.groups))
	fresh := 0
	for g, grp := range p.groups {
		lo, need := 0, total-hit
		switch grp.Kind {
		case SlidingWindow:
			lo = max(0, hit-max(1, (grp.Window-1+bs-1)/bs))
		case Mamba:
			// The state at the hit, copied into the block of the prompt's
			// last full block when that is computed.
			lo, need = max(0, hit-1), 0
			if full > hit {
				need = 1
			}
		}
		for i := lo; i < hit; i++ {
			reuse[g] = append(reuse[g], p.cached[g][hashes[i]][0])
		}
		fresh += need
	}
	reusedFree := 0
	for _, slots := range reuse {
		for _, s := range slots {
			if p.refs[s] == 0 {
				reusedFree++
			}
		}
	}
	if fresh > p.free.Len()-reusedFree {
		return 0, fmt.Errorf("allocate %q: %d blocks needed, %d free: %w",
			req.ID, fresh, p.free.Len()-reusedFree, ErrNoSpace)
	}

	// Every group's hits are taken before any group takes a fresh slot, so
	// that one group's fresh slot cannot evict another's hit (vLLM touches
	// all hits first for the same reason).
	held := make([][]int, len(p.groups))
	for g := range p.groups {
		for _, s := range reuse[g] {
			p.take(s)
			held[g] = append(held[g], s)
		}
	}
	for g, grp := range p.groups {
		switch grp.Kind {
		case Mamba:
			if full > hit {
				s := p.fresh()
				p.cache(s, g, hashes[full-1])
				if len(held[g]) > 0 {
					// The state it was copied from is no longer the
					// request's; it stays cached for others.
					p.release(held[g][0])
					held[g] = held[g][:0]
				}
				held[g] = append(held[g], s)
			}
		default:
			for i := hit; i < total; i++ {
				s := p.fresh()
				if i < full {
					p.cache(s, g, hashes[i])
				}
				held[g] = append(held[g], s)
			}
		}
	}
	p.running[req.ID] = nil
	if full > hit {
		for i := hit; i < full; i++ {
			p.remember(req, hashes, i)
		}
		for g, grp := range p.groups {
			p.publishStored(req, hashes, hit, full, g, grp)
		}
		p.offload(req, hashes, hit, full)
	}
	// A sliding-window group frees the blocks the window has left behind
	// (vLLM does so at the request's next step): they stay cached, first in
	// line for eviction.
	for g, grp := range p.groups {
		if grp.Kind != SlidingWindow {
			continue
		}
		skipped := max(0, len(req.Tokens)-grp.Window+1) / bs
		first := max(0, hit-len(reuse[g])) // block index of held[g][0]
		var keep, drop []int
		for j, s := range held[g] {
			if first+j < skipped {
				drop = append(drop, s)
			} else {
				keep = append(keep, s)
			}
		}
		for j := len(drop) - 1; j >= 0; j-- {
			p.release(drop[j])
		}
		held[g] = keep
	}
	for _, slots := range held {
		p.running[req.ID] = append(p.running[req.ID], slots...)
	}
	p.runningGroups(req.ID, held)
	return hit, nil
}

// runningGroups remembers how many of a running request's slots each group
// holds, so that Free can release them group by group as vLLM does.
func (p *Pool) runningGroups(id string, held [][]int) {
	if !p.hybrid {
		return
	}
	if p.heldBy == nil {
		p.heldBy = map[string][]int{}
	}
	counts := make([]int, len(held))
	for g, slots := range held {
		counts[g] = len(slots)
	}
	p.heldBy[id] = counts
}

// take makes a cached slot a running request's.
func (p *Pool) take(s int) {
	if p.refs[s] == 0 {
		p.free.Remove(p.freeElem[s])
		p.freeElem[s] = nil
	}
	p.refs[s]++
}

// fresh takes the least recently freed slot, evicting what it cached.
func (p *Pool) fresh() int {
	s := p.free.Remove(p.free.Front()).(int)
	p.freeElem[s] = nil
	p.evictGPU(s)
	p.refs[s] = 1
	return s
}

// release drops a running request's use of a slot.
func (p *Pool) release(s int) {
	if p.refs[s]--; p.refs[s] == 0 {
		p.freeElem[s] = p.free.PushBack(s)
	}
}

func (p *Pool) cache(s, g int, h uint64) {
	p.hash[s], p.group[s], p.hashed[s] = h, g, true
	p.cached[g][h] = append(p.cached[g][h], s)
}

// publishStored queues the store of blocks [hit, full) of one group: dense
// for attention groups, the state block alone (with its offset among the
// tokens) for a Mamba group.
func (p *Pool) publishStored(req Request, hashes []uint64, hit, full, g int, grp Group) {
	bs := p.cfg.BlockSize
	e := events.Event{
		Kind:        events.KindBlockStored,
		BlockHashes: slices.Clone(hashes[hit:full]),
		TokenIDs:    slices.Clone(req.Tokens[hit*bs : full*bs]),
		BlockSize:   bs,
		LoRAName:    req.LoRA,
		Medium:      events.TierGPU,
	}
	if hit > 0 {
		e.ParentHash, e.HasParent = hashes[hit-1], true
	}
	for i := hit; i < full; i++ {
		e.ExtraKeys = append(e.ExtraKeys, extraKeys(req, i, bs))
	}
	if p.hybrid {
		e.GroupIdx, e.KVCacheSpecKind = g, grp.specKind()
		if grp.Kind == SlidingWindow {
			e.SlidingWindow = grp.Window
		}
		if grp.Kind == Mamba {
			e.BlockHashes = []uint64{hashes[full-1]}
			e.BlockOffsets = []int32{int32(full - 1 - hit)}
			e.ExtraKeys = []events.ExtraKey{extraKeys(req, full-1, bs)}
		}
	}
	p.pending = append(p.pending, e)
}

// evictGPU drops the cached block in slot s, if any, as its slot is reused;
// only now does vLLM publish its removal.
func (p *Pool) evictGPU(s int) {
	if !p.hashed[s] {
		return
	}
	h, g := p.hash[s], p.group[s]
	p.hashed[s] = false
	p.cached[g][h] = slices.DeleteFunc(p.cached[g][h], func(x int) bool { return x == s })
	left := len(p.cached[g][h])
	if left == 0 {
		delete(p.cached[g], h)
	}
	e := events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{h}, Medium: events.TierGPU, GroupIdx: g}
	if p.cfg.ReportRemainingCopies {
		e.RemainingCopies = []int32{int32(left)}
	}
	p.pending = append(p.pending, e)
}

// offload copies newly cached blocks [hit, full) to the CPU tier, evicting
// its least recently used blocks when full. The stores are placeholders
// (no tokens), as vLLM's offloading publishes them, unless the pool is
// configured self-describing.
func (p *Pool) offload(req Request, hashes []uint64, hit, full int) {
	if p.cfg.CPUBlocks == 0 {
		return
	}
	run := -1 // first block of the run of stores not yet published
	flush := func(end int) {
		if run >= 0 && end > run {
			p.flushCPUStore(req, hashes, run, end)
		}
		run = -1
	}
	for i := hit; i < full; i++ {
		h := hashes[i]
		if el, ok := p.cpu[h]; ok {
			p.cpuLRU.MoveToBack(el)
			flush(i)
			continue
		}
		if p.cpuLRU.Len() >= p.cfg.CPUBlocks {
			old := p.cpuLRU.Remove(p.cpuLRU.Front()).(uint64)
			delete(p.cpu, old)
			// A block stored and evicted within one offload run is published
			// in that order.
			if run >= 0 && slices.Contains(hashes[run:i], old) {
				flush(i)
			}
			p.pending = append(p.pending, events.Event{
				Kind: events.KindBlockRemoved, BlockHashes: []uint64{old}, Medium: events.TierCPU,
			})
		}
		p.cpu[h] = p.cpuLRU.PushBack(h)
		if run < 0 {
			run = i
		}
	}
	flush(full)
}

func (p *Pool) flushCPUStore(req Request, hashes []uint64, from, to int) {
	e := events.Event{Kind: events.KindBlockStored, BlockHashes: slices.Clone(hashes[from:to]), Medium: events.TierCPU}
	if p.cfg.SelfDescribingOffload {
		bs := p.cfg.BlockSize
		e.TokenIDs = slices.Clone(req.Tokens[from*bs : to*bs])
		e.BlockSize = bs
		e.LoRAName = req.LoRA
		if from > 0 {
			e.ParentHash, e.HasParent = hashes[from-1], true
		}
		for i := from; i < to; i++ {
			e.ExtraKeys = append(e.ExtraKeys, extraKeys(req, i, bs))
		}
	}
	p.pending = append(p.pending, e)
}

// Free ends a request: its blocks go back to the free queue, group by
// group, last block first so that a prompt's tail is evicted before its
// head, and stay cached until their slots are reused.
func (p *Pool) Free(id string) error {
	slots, ok := p.running[id]
	if !ok {
		return fmt.Errorf("free %q: %w", id, ErrNotRunning)
	}
	delete(p.running, id)
	counts := []int{len(slots)}
	if p.hybrid {
		counts = p.heldBy[id]
		delete(p.heldBy, id)
	}
	at := 0
	for _, n := range counts {
		group := slots[at : at+n]
		at += n
		for i := len(group) - 1; i >= 0; i-- {
			p.release(group[i])
		}
	}
	return nil
}

// Running returns the ids of running requests, sorted.
func (p *Pool) Running() []string {
	ids := make([]string, 0, len(p.running))
	for id := range p.running {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// ResetPrefixCache forgets every cached block, on GPU and CPU, and
// publishes AllBlocksCleared, which carries no tier and so clears the whole
// engine. Like vLLM it refuses while requests are running.
func (p *Pool) ResetPrefixCache() error {
	if len(p.running) > 0 {
		return fmt.Errorf("reset prefix cache with %d requests running: %w", len(p.running), ErrInUse)
	}
	clear(p.hashed)
	for g := range p.cached {
		clear(p.cached[g])
	}
	clear(p.cpu)
	clear(p.content)
	p.cpuLRU.Init()
	p.pending = append(p.pending, events.Event{Kind: events.KindAllBlocksCleared})
	return nil
}

// Step ends an engine step. It returns the step's events as one batch with
// its sequence number (from 0, +1 per published batch), or ok false when
// nothing happened, as vLLM then publishes nothing.
func (p *Pool) Step() (b *events.Batch, seq uint64, ok bool) {
	p.steps++
	if len(p.pending) == 0 {
		return nil, 0, false
	}
	now := p.cfg.Now()
	b = &events.Batch{
		TS:        float64(now.UnixNano()) / 1e9,
		DPRank:    p.cfg.DPRank,
		HasDPRank: true,
		Events:    p.pending,
	}
	p.pending = nil
	seq = p.seq
	p.seq++
	return b, seq, true
}

// NotHeld is BlockTiers' answer for a block the engine does not hold.
const NotHeld = events.Tier(events.NumTiers)

// BlockTiers returns, for each of req's full blocks, the fastest tier the
// engine holds it in (group 0's, in a hybrid pool), or NotHeld. Blocks
// after one not held can still be held (a middle block evicted before the
// tail), though no prefix reaches them.
func (p *Pool) BlockTiers(req Request) []events.Tier {
	return p.TiersOf(p.BlockHashes(req))
}

// TiersOf is BlockTiers for blocks whose hashes (BlockHashes) are known.
func (p *Pool) TiersOf(hashes []uint64) []events.Tier {
	out := make([]events.Tier, len(hashes))
	for i, h := range hashes {
		switch {
		case p.has(0, h):
			out[i] = events.TierGPU
		case p.cpu[h] != nil:
			out[i] = events.TierCPU
		default:
			out[i] = NotHeld
		}
	}
	return out
}

// Held is the ground truth for req's prompt: its longest run of leading full
// blocks held on GPU or CPU, each under the fastest tier holding it. In a
// hybrid pool it is the longest prefix of its full blocks that the
// coordinator would serve from cache (all on GPU).
func (p *Pool) Held(req Request) Held {
	if p.hybrid {
		n := p.hitLength(p.BlockHashes(req))
		var h Held
		h.Blocks, h.ByTier[events.TierGPU] = n, n
		return h
	}
	return HeldFrom(p.BlockTiers(req))
}

// HeldFrom summarises per-block tiers (as BlockTiers returns them, or the
// fastest over several engines) into the leading run's Held.
func HeldFrom(tiers []events.Tier) Held {
	var out Held
	for _, t := range tiers {
		if t >= NotHeld {
			break
		}
		out.ByTier[t]++
		out.Blocks++
	}
	return out
}
