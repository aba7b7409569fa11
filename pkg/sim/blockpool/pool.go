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
	// GPUBlocks is the GPU KV cache's capacity in blocks.
	GPUBlocks int
	// CPUBlocks is the offload tier's capacity in blocks; 0 means no offload.
	CPUBlocks int
	// Seed makes this engine's block hashes its own, as vLLM's per-process
	// hash seed does.
	Seed uint64
	// DPRank is the data-parallel rank written into each batch.
	DPRank int
	// Now stamps batches; nil means time.Now.
	Now func() time.Time
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
// engine holds, each counted under the fastest tier holding it.
type Held struct {
	Blocks int
	ByTier [events.NumTiers]int
}

// Pool is one engine's block pool. It is not safe for concurrent use: an
// engine's scheduler is one loop.
type Pool struct {
	cfg Config

	// Per GPU slot: the hash of the full block it caches (valid when
	// hashed), and how many running requests use it.
	hash   []uint64
	hashed []bool
	refs   []int

	// free is the queue of slots with no running request, least recently
	// freed first; a cached slot stays cached in it until it is reused.
	free     *list.List
	freeElem []*list.Element

	// cached maps a hash to the GPU slots caching it: vLLM does not
	// de-duplicate, so a block computed twice is cached twice.
	cached map[uint64][]int

	// cpu is the offload tier: hash to its place in an LRU list.
	cpu    map[uint64]*list.Element
	cpuLRU *list.List

	running map[string][]int

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
	if cfg.BlockSize <= 0 || cfg.GPUBlocks <= 0 || cfg.CPUBlocks < 0 {
		panic(fmt.Sprintf("blockpool: invalid config %+v", cfg))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	p := &Pool{
		cfg:      cfg,
		hash:     make([]uint64, cfg.GPUBlocks),
		hashed:   make([]bool, cfg.GPUBlocks),
		refs:     make([]int, cfg.GPUBlocks),
		free:     list.New(),
		freeElem: make([]*list.Element, cfg.GPUBlocks),
		cached:   map[uint64][]int{},
		cpu:      map[uint64]*list.Element{},
		cpuLRU:   list.New(),
		running:  map[string][]int{},
		content:  map[uint64]blockContent{},
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

// BlockHashes returns the engine's hashes of req's full blocks.
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
// name, the hashes of multimodal items overlapping the block, and the cache
// salt on the first block only. Nil when there is none.
func extraKeys(req Request, i, bs int) events.ExtraKey {
	var ex events.ExtraKey
	if req.LoRA != "" {
		ex = append(ex, req.LoRA)
	}
	lo, hi := i*bs, (i+1)*bs
	for _, mm := range req.MM {
		if mm.Offset < hi && mm.Offset+mm.Length > lo {
			ex = append(ex, mm.Hash)
		}
	}
	if i == 0 && req.Salt != "" {
		ex = append(ex, req.Salt)
	}
	return ex
}

// Allocate admits a request: its leading full blocks already cached on GPU
// are reused (all but the last token can hit, as in vLLM), fresh blocks are
// taken for the rest, and its newly computed full blocks are cached at once.
// It returns how many blocks hit. Nothing changes when it fails.
func (p *Pool) Allocate(req Request) (hit int, err error) {
	if _, ok := p.running[req.ID]; ok {
		return 0, fmt.Errorf("allocate %q: %w", req.ID, ErrRunning)
	}
	bs := p.cfg.BlockSize
	hashes := p.BlockHashes(req)
	total := (len(req.Tokens) + bs - 1) / bs
	maxHit := 0
	if len(req.Tokens) > 0 {
		maxHit = (len(req.Tokens) - 1) / bs
	}
	for hit < maxHit && len(p.cached[hashes[hit]]) > 0 {
		hit++
	}
	reusedFree := 0
	for _, h := range hashes[:hit] {
		if p.refs[p.cached[h][0]] == 0 {
			reusedFree++
		}
	}
	if total-hit > p.free.Len()-reusedFree {
		return 0, fmt.Errorf("allocate %q: %d blocks needed, %d free: %w",
			req.ID, total-hit, p.free.Len()-reusedFree, ErrNoSpace)
	}

	slots := make([]int, 0, total)
	for _, h := range hashes[:hit] {
		s := p.cached[h][0]
		if p.refs[s] == 0 {
			p.free.Remove(p.freeElem[s])
			p.freeElem[s] = nil
		}
		p.refs[s]++
		slots = append(slots, s)
	}
	for len(slots) < total {
		s := p.free.Remove(p.free.Front()).(int)
		p.freeElem[s] = nil
		p.evictGPU(s)
		p.refs[s] = 1
		slots = append(slots, s)
	}
	p.running[req.ID] = slots

	full := len(hashes)
	if full > hit {
		for i := hit; i < full; i++ {
			s := slots[i]
			p.hash[s], p.hashed[s] = hashes[i], true
			p.cached[hashes[i]] = append(p.cached[hashes[i]], s)
			p.remember(req, hashes, i)
		}
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
		p.pending = append(p.pending, e)
		p.offload(hashes[hit:full])
	}
	return hit, nil
}

// evictGPU drops the cached block in slot s, if any, as its slot is reused;
// only now does vLLM publish its removal.
func (p *Pool) evictGPU(s int) {
	if !p.hashed[s] {
		return
	}
	h := p.hash[s]
	p.hashed[s] = false
	p.cached[h] = slices.DeleteFunc(p.cached[h], func(x int) bool { return x == s })
	if len(p.cached[h]) == 0 {
		delete(p.cached, h)
	}
	p.pending = append(p.pending, events.Event{
		Kind: events.KindBlockRemoved, BlockHashes: []uint64{h}, Medium: events.TierGPU,
	})
}

// offload copies newly cached blocks to the CPU tier, evicting its least
// recently used blocks when full. The stores are placeholders (no tokens),
// as vLLM's offloading publishes them.
func (p *Pool) offload(hashes []uint64) {
	if p.cfg.CPUBlocks == 0 {
		return
	}
	var stored []uint64
	for _, h := range hashes {
		if el, ok := p.cpu[h]; ok {
			p.cpuLRU.MoveToBack(el)
			continue
		}
		if p.cpuLRU.Len() >= p.cfg.CPUBlocks {
			old := p.cpuLRU.Remove(p.cpuLRU.Front()).(uint64)
			delete(p.cpu, old)
			// A block stored and evicted within one offload run is published
			// in that order.
			if slices.Contains(stored, old) {
				p.flushCPUStore(stored)
				stored = nil
			}
			p.pending = append(p.pending, events.Event{
				Kind: events.KindBlockRemoved, BlockHashes: []uint64{old}, Medium: events.TierCPU,
			})
		}
		p.cpu[h] = p.cpuLRU.PushBack(h)
		stored = append(stored, h)
	}
	p.flushCPUStore(stored)
}

func (p *Pool) flushCPUStore(hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	p.pending = append(p.pending, events.Event{
		Kind: events.KindBlockStored, BlockHashes: slices.Clone(hashes), Medium: events.TierCPU,
	})
}

// Free ends a request: its blocks go back to the free queue, last block
// first so that a prompt's tail is evicted before its head, and stay cached
// until their slots are reused.
func (p *Pool) Free(id string) error {
	slots, ok := p.running[id]
	if !ok {
		return fmt.Errorf("free %q: %w", id, ErrNotRunning)
	}
	delete(p.running, id)
	for i := len(slots) - 1; i >= 0; i-- {
		s := slots[i]
		if p.refs[s]--; p.refs[s] == 0 {
			p.freeElem[s] = p.free.PushBack(s)
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
	clear(p.cached)
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
// engine holds it in, or NotHeld. Blocks after one not held can still be
// held (a middle block evicted before the tail), though no prefix reaches
// them.
func (p *Pool) BlockTiers(req Request) []events.Tier {
	hashes := p.BlockHashes(req)
	out := make([]events.Tier, len(hashes))
	for i, h := range hashes {
		switch {
		case len(p.cached[h]) > 0:
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
// blocks held on GPU or CPU, each under the fastest tier holding it.
func (p *Pool) Held(req Request) Held {
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
