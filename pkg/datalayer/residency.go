package datalayer

import (
	"math"
	"sync"
	"time"
)

// ResidencySlots is how many prefix families a Residency tracks per
// endpoint: more than the groups one engine's cache holds at once in any
// workload where placement decides hits, few enough to walk per candidate.
const ResidencySlots = 16

// Residency is what this EPP lately sent one endpoint, by prefix family:
// requests whose first block is the same (a system prompt, a conversation,
// an application's preamble) share a family, and each family is sized by
// the longest of its requests and aged by its latest. An engine's prefix
// cache evicts least recently used blocks first, so the families it holds
// in order of last use say what a placement there would push out, and how
// soon those families are likely to be asked for again. Recency alone is
// no evidence of a return, though: a family asked for once may never be
// again (unrelated prompts), so one seen once weighs only as much as the
// share of requests to the endpoint that came back to a family it had
// seen. Its zero value is ready to use; it is safe for concurrent use.
//
// It knows only this EPP's requests, and tells families apart by their
// first block alone: prompts that share a first block but diverge later
// count as one family, the longest, which makes it undercount what the
// engine holds (and so what a placement evicts), never overcount it.
type Residency struct {
	mu sync.Mutex
	// slots[:n] are the families from the least recently sent to the
	// most, the order an LRU cache evicts them in, kept as they are
	// touched so that a pick walks them without sorting.
	slots [ResidencySlots]residencySlot
	n     int
	// returns is the share of recent requests whose family the endpoint
	// had been sent before, fading over about reuseMemory requests.
	returns float64
}

// reuseMemory is how many requests Residency.returns averages over.
const reuseMemory = 32

type residencySlot struct {
	first  uint64
	blocks int32
	// uses counts the family's requests.
	uses uint32
	// last is the latest request's dispatch, Unix nanoseconds.
	last int64
}

// Touch records a request of blocks full blocks, whose first block key is
// first, sent to the endpoint at at (Unix nanoseconds): its family becomes
// the most recently sent.
func (r *Residency) Touch(first uint64, blocks int, at int64) {
	if r == nil || blocks <= 0 {
		return
	}
	b := int32(min(blocks, math.MaxInt32))
	r.mu.Lock()
	defer r.mu.Unlock()
	s := residencySlot{first: first, blocks: b, uses: 1, last: at}
	i := 0
	for i < r.n && r.slots[i].first != first {
		i++
	}
	returned := 0.0
	if i < r.n {
		returned = 1
	}
	r.returns += (returned - r.returns) / reuseMemory
	switch {
	case i < r.n:
		old := r.slots[i]
		s.blocks, s.last = max(s.blocks, old.blocks), max(s.last, old.last)
		s.uses = old.uses + min(1, math.MaxUint32-old.uses)
	case r.n < len(r.slots):
		r.n++
	default:
		i = 0 // the least recently sent family makes way
	}
	copy(r.slots[i:r.n-1], r.slots[i+1:r.n])
	r.slots[r.n-1] = s
}

// Eviction is the input of EvictedHot: what a request needs on an
// endpoint and what the endpoint has.
type Eviction struct {
	// Need is the blocks the request would allocate there (its blocks not
	// cached there).
	Need int
	// Capacity is the endpoint's GPU blocks (num_gpu_blocks); Held is
	// how many of them hold cached blocks (the index's count); Pending
	// is blocks already sent there and not yet stored (in-flight
	// prefills).
	Capacity, Held, Pending int
	// Own is the request's first block key: its own family is not
	// evicted for it (its blocks are the ones it reads).
	Own uint64
	// Now is the time of the pick, Unix nanoseconds; Window the time
	// constant a family's hotness fades with since its last request.
	Now    int64
	Window time.Duration
}

// EvictedHot is how many blocks of hot families placing the request on
// the endpoint would evict, each weighed by its family's hotness
// exp(-age/Window), and a family seen once also by the endpoint's share of
// returning requests: 0 when the request fits in the endpoint's free
// blocks. What must be evicted comes from the least recently used end:
// first the blocks the endpoint holds outside any tracked family (other
// EPPs' traffic, long-gone requests' tails: taken as cold), then the
// families from the one sent longest ago. It allocates nothing.
func (r *Residency) EvictedHot(e Eviction) float64 {
	if r == nil || e.Capacity <= 0 || e.Need <= 0 || e.Window <= 0 {
		return 0
	}
	evict := e.Need - max(e.Capacity-e.Held-e.Pending, 0)
	if evict <= 0 {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.slots[:r.n]
	tracked := 0
	for i := range s {
		tracked += int(s[i].blocks)
	}
	// Tracked families beyond what the engine holds were evicted already:
	// the oldest ones, by LRU.
	gone := max(tracked-e.Held, 0)
	evict -= max(e.Held-tracked, 0) // the untracked rest, cold
	hot := 0.0
	for i := range s {
		if evict <= 0 {
			break
		}
		x := &s[i]
		n := int(x.blocks)
		d := min(gone, n)
		n, gone = n-d, gone-d
		if n == 0 || x.first == e.Own {
			continue
		}
		take := min(evict, n)
		evict -= take
		age := max(e.Now-x.last, 0)
		w := math.Exp(-float64(age) / float64(e.Window))
		if x.uses < 2 {
			w *= r.returns
		}
		hot += float64(take) * w
	}
	return hot
}
