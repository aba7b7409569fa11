package approx

import (
	"encoding/binary"
	"slices"
	"sync"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/request"
)

// Defaults of the approximate prefix fallback, as in the upstream EPP's
// approximate prefix producer, so that an upstream user's tuning carries over.
const (
	DefaultBlockSizeTokens = 16
	DefaultMaxBlocks       = 256
	// DefaultApproxCapacity is blocks remembered per endpoint: about what a
	// Llama-3-8B server on one 80 GB GPU holds (500k tokens / 16).
	DefaultCapacity = 31250
	// ApproxCharsPerToken is how many prompt characters stand for one token
	// when the token ids are unknown.
	CharsPerToken = 4
)

// ApproxHashes appends to dst[:0] the chained block hashes of req's prompt,
// at most maxBlocks of them: over token ids when they are known, blocks of
// blockSizeTokens tokens, otherwise over the prompt text, blocks of
// blockSizeTokens*ApproxCharsPerToken bytes. Only full blocks are hashed, as
// only full blocks are cached. The chain's root is the model, LoRA and cache
// salt, so requests that can never share cached blocks never share hashes.
// A request without a reproducible prefix has none.
func Hashes(dst []uint64, req *request.Request, blockSizeTokens, maxBlocks int) []uint64 {
	dst = dst[:0]
	if req == nil || req.NoReproduciblePrefix || blockSizeTokens <= 0 || maxBlocks <= 0 {
		return dst
	}
	var d xxhash.Digest
	d.Reset()
	_, _ = d.WriteString(req.Model)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(req.LoRA)
	_, _ = d.WriteString("\x00")
	_, _ = d.WriteString(req.CacheSalt)
	prev := d.Sum64()

	// Each block is hashed in one call over prev || block, assembled in a
	// stack buffer: one-shot hashing of a short input costs a fraction of
	// streaming it through a Digest.
	var buf [8 + 4*approxInlineTokens]byte
	if req.TokensKnown() {
		// Tokens and text must never produce the same chain: a text prompt
		// could otherwise alias a token prompt of the same bytes.
		prev ^= 0x9e3779b97f4a7c15
		toks := req.TokenIDs
		// Sized once: the count is known, and growing by appends cost
		// several allocations per request.
		dst = slices.Grow(dst, min(len(toks)/blockSizeTokens, maxBlocks))
		for len(toks) >= blockSizeTokens && len(dst) < maxBlocks {
			block := toks[:blockSizeTokens]
			if blockSizeTokens <= approxInlineTokens {
				binary.LittleEndian.PutUint64(buf[:], prev)
				for i, t := range block {
					binary.LittleEndian.PutUint32(buf[8+4*i:], t)
				}
				prev = xxhash.Sum64(buf[:8+4*blockSizeTokens])
			} else {
				prev = hashLongTokenBlock(&d, prev, block, buf[:])
			}
			dst = append(dst, prev)
			toks = toks[blockSizeTokens:]
		}
		return dst
	}
	size := blockSizeTokens * CharsPerToken
	text := req.Prompt
	dst = slices.Grow(dst, min(len(text)/size, maxBlocks))
	for len(text) >= size && len(dst) < maxBlocks {
		if size <= len(buf)-8 {
			binary.LittleEndian.PutUint64(buf[:], prev)
			copy(buf[8:], text[:size])
			prev = xxhash.Sum64(buf[:8+size])
		} else {
			d.Reset()
			binary.LittleEndian.PutUint64(buf[:], prev)
			_, _ = d.Write(buf[:8])
			_, _ = d.WriteString(text[:size])
			prev = d.Sum64()
		}
		dst = append(dst, prev)
		text = text[size:]
	}
	return dst
}

// approxInlineTokens is the largest block hashed from a stack buffer; vLLM's
// block sizes are 16 to 64 tokens, larger ones stream through a Digest.
const approxInlineTokens = 64

func hashLongTokenBlock(d *xxhash.Digest, prev uint64, block []uint32, buf []byte) uint64 {
	d.Reset()
	binary.LittleEndian.PutUint64(buf, prev)
	_, _ = d.Write(buf[:8])
	for len(block) > 0 {
		n := min(len(block), len(buf)/4)
		for i, t := range block[:n] {
			binary.LittleEndian.PutUint32(buf[4*i:], t)
		}
		_, _ = d.Write(buf[:4*n])
		block = block[n:]
	}
	return d.Sum64()
}

// ApproxIndex remembers, per endpoint, the block hashes of the requests
// routed to it, in an LRU of bounded size: the upstream EPP's routing-history
// guess at what an endpoint caches, for endpoints whose event stream is
// missing or uncertain, and where prefixes were sent, for a scorer that
// places by it.
//
// Each endpoint's LRU is self-contained (its map, its list, its lock) and
// there is no reverse map from hash to endpoints: eviction only ever touches
// the structure under the lock already held, so no eviction can race with a
// lookup. Match walks each asked-for endpoint's LRU instead, which costs the
// same as walking a reverse map's endpoint sets.
type Index struct {
	mu        sync.RWMutex
	endpoints map[string]*approxLRU
	capacity  int

	blocks    prometheus.Gauge
	evictions prometheus.Counter
	recorded  prometheus.Counter
	lookups   prometheus.Counter
	matched   prometheus.Counter
}

// NewApproxIndex returns an index remembering up to capacity blocks per
// endpoint (DefaultApproxCapacity when capacity <= 0). Its metrics are
// registered with reg unless reg is nil.
func New(capacity int, reg prometheus.Registerer) *Index {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	x := &Index{
		endpoints: map[string]*approxLRU{},
		capacity:  capacity,
		blocks: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_approx_blocks",
			Help: "Block hashes held by the routing history (the approximate prefix index), all endpoints together.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_approx_evictions_total",
			Help: "Block hashes evicted from an endpoint's LRU in the routing history.",
		}),
		recorded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_approx_recorded_blocks_total",
			Help: "Block hashes recorded after picks in the routing history.",
		}),
		lookups: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_approx_lookups_total",
			Help: "Lookups in the routing history: the approximate fallback's, and the routing-history-producer's.",
		}),
		matched: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_approx_matched_blocks_total",
			Help: "Blocks matched by routing-history lookups, summed over endpoints.",
		}),
	}
	if reg != nil {
		reg.MustRegister(x.blocks, x.evictions, x.recorded, x.lookups, x.matched,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "kvroute_approx_endpoints",
				Help: "Endpoints known to the routing history.",
			}, func() float64 {
				x.mu.RLock()
				defer x.mu.RUnlock()
				return float64(len(x.endpoints))
			}))
	}
	return x
}

// SetCapacity sets how many blocks the index keeps for addr, e.g. from the
// endpoint's vllm:cache_config_info num_gpu_blocks; the oldest are evicted
// at once if it now holds more.
func (x *Index) SetCapacity(addr string, capacity int) {
	if capacity <= 0 {
		capacity = x.capacity
	}
	l := x.lru(addr)
	l.mu.Lock()
	n := l.resize(capacity)
	l.mu.Unlock()
	x.evicted(n)
}

// Record remembers that the blocks hashes were sent to addr. Later hashes of
// a prompt are touched first, so the LRU evicts a prompt from its tail: a
// prefix never outlives the block before it.
func (x *Index) Record(addr string, hashes []uint64) {
	if len(hashes) == 0 {
		return
	}
	l := x.lru(addr)
	l.mu.Lock()
	evicted := 0
	for i := len(hashes) - 1; i >= 0; i-- {
		if l.touch(hashes[i]) {
			evicted++
		}
	}
	l.mu.Unlock()
	x.recorded.Add(float64(len(hashes)))
	x.evicted(evicted)
}

func (x *Index) evicted(n int) {
	if n > 0 {
		x.evictions.Add(float64(n))
	}
}

func (x *Index) lru(addr string) *approxLRU {
	x.mu.RLock()
	l := x.endpoints[addr]
	x.mu.RUnlock()
	if l != nil {
		return l
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if l = x.endpoints[addr]; l == nil {
		l = newApproxLRU(x.capacity, x.blocks)
		x.endpoints[addr] = l
	}
	return l
}

// Match writes to out[i] the number of leading hashes that addrs[i] holds.
// out must be at least as long as addrs. It does not change the LRU order:
// only picks (Record) count as use.
func (x *Index) Match(hashes []uint64, addrs []string, out []int) {
	out = out[:len(addrs)]
	x.mu.RLock()
	defer x.mu.RUnlock()
	total := 0
	for i, addr := range addrs {
		out[i] = 0
		l := x.endpoints[addr]
		if l == nil {
			continue
		}
		l.mu.RLock()
		n := 0
		for n < len(hashes) {
			if _, ok := l.slot[hashes[n]]; !ok {
				break
			}
			n++
		}
		l.mu.RUnlock()
		out[i] = n
		total += n
	}
	x.lookups.Inc()
	x.matched.Add(float64(total))
}

// RemoveEndpoint forgets everything recorded for addr.
func (x *Index) RemoveEndpoint(addr string) {
	x.mu.Lock()
	l := x.endpoints[addr]
	delete(x.endpoints, addr)
	x.mu.Unlock()
	if l != nil {
		l.mu.Lock()
		l.blocks.Sub(float64(len(l.slot)))
		l.slot = nil
		l.nodes = nil
		l.mu.Unlock()
	}
}

// approxLRU is one endpoint's LRU of block hashes: a map from hash to slot
// and a doubly linked list threaded through a slice of slots by index, so an
// entry costs a map entry and 16 bytes, and nothing is allocated per touch
// once the slice has grown.
type approxLRU struct {
	mu       sync.RWMutex
	slot     map[uint64]int32
	nodes    []approxNode
	head     int32 // most recently used, -1 when empty
	capacity int
	blocks   prometheus.Gauge
}

type approxNode struct {
	hash       uint64
	prev, next int32
}

func newApproxLRU(capacity int, blocks prometheus.Gauge) *approxLRU {
	return &approxLRU{slot: map[uint64]int32{}, head: -1, capacity: capacity, blocks: blocks}
}

// touch makes h the most recently used entry, adding it if absent, and
// reports whether that evicted the least recently used one.
func (l *approxLRU) touch(h uint64) (evicted bool) {
	if l.slot == nil {
		// Removed while a Record held a stale pointer to it; drop the write.
		return false
	}
	if i, ok := l.slot[h]; ok {
		l.unlink(i)
		l.pushFront(i)
		return false
	}
	var i int32
	if len(l.nodes) < l.capacity {
		i = int32(len(l.nodes))
		l.nodes = append(l.nodes, approxNode{})
		l.blocks.Inc()
	} else {
		i = l.nodes[l.head].prev // the tail
		l.unlink(i)
		delete(l.slot, l.nodes[i].hash)
		evicted = true
	}
	l.nodes[i].hash = h
	l.slot[h] = i
	l.pushFront(i)
	return evicted
}

// resize changes the capacity, evicting from the tail; it returns how many
// entries it evicted. Shrinking compacts the slot slice.
func (l *approxLRU) resize(capacity int) int {
	l.capacity = capacity
	if len(l.nodes) <= capacity {
		return 0
	}
	// Keep the capacity most recent entries, oldest first, and rebuild.
	keep := make([]uint64, 0, capacity)
	for i, n := l.head, 0; n < capacity; n++ {
		keep = append(keep, l.nodes[i].hash)
		i = l.nodes[i].next
	}
	evicted := len(l.nodes) - capacity
	l.blocks.Sub(float64(evicted))
	l.slot = make(map[uint64]int32, capacity)
	l.nodes = l.nodes[:0:0]
	l.head = -1
	for i := len(keep) - 1; i >= 0; i-- {
		idx := int32(len(l.nodes))
		l.nodes = append(l.nodes, approxNode{hash: keep[i]})
		l.slot[keep[i]] = idx
		l.pushFront(idx)
	}
	return evicted
}

// The list is circular: head.prev is the tail.
func (l *approxLRU) unlink(i int32) {
	n := &l.nodes[i]
	if n.next == i {
		l.head = -1
		return
	}
	l.nodes[n.prev].next = n.next
	l.nodes[n.next].prev = n.prev
	if l.head == i {
		l.head = n.next
	}
}

func (l *approxLRU) pushFront(i int32) {
	if l.head < 0 {
		l.nodes[i].prev, l.nodes[i].next = i, i
		l.head = i
		return
	}
	h := l.head
	t := l.nodes[h].prev
	l.nodes[i].prev, l.nodes[i].next = t, h
	l.nodes[t].next = i
	l.nodes[h].prev = i
	l.head = i
}
