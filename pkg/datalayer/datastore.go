package datalayer

import (
	"cmp"
	"iter"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer/readmostly"
	"github.com/kvroute/kvroute/pkg/enginesched"
)

// StreamStates tells the datastore how far each endpoint's event stream can
// be trusted; the exact prefix index satisfies it. since is when the endpoint
// entered that state (the zero time when unknown).
type StreamStates interface {
	State(addr string) (state StreamState, since time.Time)
}

// StreamInfo is what the index knows of one endpoint that a request's
// prefix lookup needs first.
type StreamInfo struct {
	// State is what StreamStates.State returns: StreamNone for an address
	// the index does not know.
	State StreamState
	// Bigram: the endpoint's engine keys blocks by pairs of adjacent tokens
	// (SGLang with EAGLE).
	Bigram bool
	// BlockSize is the block size, in tokens, that the endpoint's events
	// use, 0 before it has published any: the size a request's keys must
	// be built with to match what the endpoint holds.
	BlockSize int
	// GPUBlocks is how many blocks the endpoint's GPU cache holds, by the
	// index's count of its GPU-tier holdings (0 when unknown).
	GPUBlocks int
}

// StreamHandles is a StreamStates that hands out, per address, a handle
// that reads the endpoint's StreamInfo without looking the address up
// again. The datastore keeps each endpoint's handle, so that making a
// request's candidates costs no lookup by address (a string hash and a map
// probe on cold memory, per endpoint per request). Its dynamic type must be
// comparable (a pointer): candidates name it as their info's source
// (Candidate.StreamInfoFrom).
type StreamHandles interface {
	StreamStates
	// StreamHandle returns addr's handle, nil when addr is unknown.
	StreamHandle(addr string) StreamHandle
}

// StreamHandle reads one endpoint's StreamInfo. ok is false once the
// handle is stale (its endpoint left), when a new one must be asked for.
type StreamHandle interface {
	StreamInfo() (info StreamInfo, ok bool)
}

// Datastore is the one place the scheduler reads endpoints from; discovery
// sources write to it and the scraper stores each endpoint's metrics in it.
//
// Reads (Get, List, Candidates, metrics) take no lock: membership is an
// immutable snapshot swapped on every write, and each endpoint's metrics sit
// behind an atomic pointer, so the request path never waits for discovery
// or scraping. Writes are rare and serialised.
type Datastore struct {
	// epoch is when the datastore was made, with the clock's monotonic
	// reading: outlier detection keeps its times as offsets from it
	// (since), so that a step of the wall clock neither ends nor
	// lengthens an ejection.
	epoch time.Time
	// writeMu serialises membership changes and the OnChange calls they make,
	// so that every hook sees the changes in the order they happened.
	writeMu sync.Mutex
	snap    atomic.Pointer[dsSnapshot]
	hooks   []*changeHook
	streams atomic.Pointer[streamStatesHolder]
	// limits are the engines' scheduler limits, as configured (nil:
	// unknown), that each endpoint's replay runs with.
	limits atomic.Pointer[enginesched.Limits]

	// outlier is outlier detection (nil: off); unhealthy counts the
	// endpoints ejected or on probation, so that making candidates reads
	// no clock while there are none; ejectMu serialises ejections, which
	// count the ejected share of the pool.
	outlier   atomic.Pointer[outlierState]
	unhealthy atomic.Int32
	ejectMu   sync.Mutex
	om        *outlierMetrics

	endpoints prometheus.Gauge

	// notes hears the dispatches announced (nil: no one).
	notes atomic.Pointer[dispatchNotes]
}

type dsEntry struct {
	ep *Endpoint
	// role is ep's Role, parsed once.
	role    Role
	metrics atomic.Pointer[Metrics]
	// load is the EPP's own in-flight accounting, kept across a
	// replacement at the same address as the metrics are.
	load *inflight
	// health is the endpoint's outlier state, kept likewise.
	health *health
	// residency is the prefix families sent to the endpoint, kept likewise.
	residency *Residency
	// stream is the endpoint's handle from a StreamHandles, nil until one
	// was had.
	stream atomic.Pointer[streamRef]
}

// streamRef is a handle and the stream states it came from, so that a
// handle from states since replaced (SetStreamStates) is not used.
type streamRef struct {
	src *streamStatesHolder
	h   StreamHandle
}

// dsSnapshot is never modified once published.
type dsSnapshot struct {
	byName map[string]*dsEntry
	// sorted is byName's entries ordered by name, so List and Candidates are
	// deterministic.
	sorted []*dsEntry
	// byAddr finds an endpoint by the address its events name; of two
	// endpoints at one address, the first by name.
	byAddr map[string]*dsEntry
	// eps are sorted's endpoints, shared by every reader (Endpoints).
	eps []*Endpoint
}

type changeHook struct {
	fn func(added, removed []*Endpoint)
}

type streamStatesHolder struct{ s StreamStates }

// NewDatastore returns an empty datastore. Its metrics are registered with
// reg unless reg is nil.
func NewDatastore(reg prometheus.Registerer) *Datastore {
	ds := &Datastore{
		epoch: time.Now(),
		endpoints: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvroute_datastore_endpoints",
			Help: "Endpoints currently in the datastore.",
		}),
	}
	ds.om = newOutlierMetrics(ds)
	ds.snap.Store(&dsSnapshot{byName: map[string]*dsEntry{}, byAddr: map[string]*dsEntry{}})
	if reg != nil {
		reg.MustRegister(ds.endpoints)
		reg.MustRegister(ds.om.collectors()...)
	}
	return ds
}

// SetEngineLimits sets the scheduler limits of the engines behind the
// pool (vLLM's max_num_seqs and max_num_batched_tokens), with which each
// endpoint's in-flight requests are replayed (InFlight.Ahead). A zero
// field is unknown: the seats are then the most requests the endpoint has
// been seen running.
func (ds *Datastore) SetEngineLimits(l enginesched.Limits) {
	ds.limits.Store(&l)
}

// SetStreamStates sets where Candidates reads each endpoint's stream state;
// until it is set (or when s is nil) every endpoint is StreamNone.
func (ds *Datastore) SetStreamStates(s StreamStates) {
	ds.streams.Store(&streamStatesHolder{s: s})
}

// OnChange registers fn to hear of membership changes. fn is first called
// with the endpoints already present, so a late subscriber misses nothing.
// An endpoint replaced under the same name and address is reported in added
// only; one whose address changed is reported as the old one removed and the
// new one added. fn runs while writes are held off: it must not write to the
// datastore, and should be quick. The returned func unsubscribes.
func (ds *Datastore) OnChange(fn func(added, removed []*Endpoint)) (unsubscribe func()) {
	h := &changeHook{fn: fn}
	ds.writeMu.Lock()
	ds.hooks = append(ds.hooks, h)
	if cur := ds.List(); len(cur) > 0 {
		fn(cur, nil)
	}
	ds.writeMu.Unlock()
	return func() {
		ds.writeMu.Lock()
		ds.hooks = slices.DeleteFunc(ds.hooks, func(x *changeHook) bool { return x == h })
		ds.writeMu.Unlock()
	}
}

// Upsert adds ep or replaces the endpoint of the same name. The endpoint's
// last metrics are kept when its address is unchanged. ep must not be
// modified afterwards.
func (ds *Datastore) Upsert(ep *Endpoint) {
	if ep == nil {
		return
	}
	ds.writeMu.Lock()
	defer ds.writeMu.Unlock()
	old := ds.snap.Load()
	prev, had := old.byName[ep.Name]
	if had && prev.ep.Equal(ep) {
		return
	}
	e := &dsEntry{ep: ep, role: RoleOf(ep.Labels) | roleKnown, load: &inflight{limits: &ds.limits}, health: &health{}, residency: &Residency{}}
	var removed []*Endpoint
	if had {
		if prev.ep.Address == ep.Address {
			e.metrics.Store(prev.metrics.Load())
			e.load, e.health, e.residency = prev.load, prev.health, prev.residency
		} else {
			removed = []*Endpoint{prev.ep}
			ds.forgetHealth(prev)
		}
	}
	byName := maps.Clone(old.byName)
	byName[ep.Name] = e
	ds.publish(byName)
	ds.notify([]*Endpoint{ep}, removed)
}

// Remove drops the endpoint named name, if present.
func (ds *Datastore) Remove(name string) {
	ds.writeMu.Lock()
	defer ds.writeMu.Unlock()
	old := ds.snap.Load()
	prev, had := old.byName[name]
	if !had {
		return
	}
	byName := maps.Clone(old.byName)
	delete(byName, name)
	ds.publish(byName)
	ds.forgetHealth(prev)
	ds.notify(nil, []*Endpoint{prev.ep})
}

// publish must be called with writeMu held.
func (ds *Datastore) publish(byName map[string]*dsEntry) {
	sorted := slices.Collect(maps.Values(byName))
	slices.SortFunc(sorted, func(a, b *dsEntry) int { return cmp.Compare(a.ep.Name, b.ep.Name) })
	byAddr := make(map[string]*dsEntry, len(sorted))
	for _, e := range sorted {
		if _, dup := byAddr[e.ep.Address]; !dup {
			byAddr[e.ep.Address] = e
		}
	}
	eps := make([]*Endpoint, len(sorted))
	for i, e := range sorted {
		eps[i] = e.ep
	}
	ds.snap.Store(&dsSnapshot{byName: byName, sorted: sorted, byAddr: byAddr, eps: eps})
	ds.endpoints.Set(float64(len(sorted)))
}

// notify must be called with writeMu held.
func (ds *Datastore) notify(added, removed []*Endpoint) {
	for _, h := range ds.hooks {
		h.fn(added, removed)
	}
}

// Get returns the endpoint named name.
func (ds *Datastore) Get(name string) (*Endpoint, bool) {
	e, ok := ds.snap.Load().byName[name]
	if !ok {
		return nil, false
	}
	return e.ep, true
}

// ByAddress returns the endpoint at addr (ip:port), the one an event's
// Kv-Endpoint names; of two at one address, the first by name.
func (ds *Datastore) ByAddress(addr string) (*Endpoint, bool) {
	e, ok := ds.snap.Load().byAddr[addr]
	if !ok {
		return nil, false
	}
	return e.ep, true
}

// List returns the endpoints ordered by name. The slice is the caller's.
func (ds *Datastore) List() []*Endpoint {
	s := ds.snap.Load()
	out := make([]*Endpoint, len(s.sorted))
	for i, e := range s.sorted {
		out[i] = e.ep
	}
	return out
}

// Endpoints returns the endpoints ordered by name, as List does, without
// copying: the slice is shared by every caller until the membership
// changes, and must not be modified. It is for readers behind an interface
// (the director's), where All's iterator would be allocated per call.
func (ds *Datastore) Endpoints() []*Endpoint { return ds.snap.Load().eps }

// ReadyPods counts the pods the endpoints belong to (an endpoint without
// a pod counts alone): what upstream reports as the pool's ready pods,
// since only ready pods contribute endpoints. It runs at each metrics
// scrape, not on the request path.
func (ds *Datastore) ReadyPods() int {
	eps := ds.snap.Load().eps
	pods := make(map[string]struct{}, len(eps))
	for _, e := range eps {
		key := e.Namespace + "/" + e.Pod
		if e.Pod == "" {
			key = "\x00" + e.Name
		}
		pods[key] = struct{}{}
	}
	return len(pods)
}

// All yields the endpoints in name order. Unlike List it copies nothing,
// so the request path can search the pool without allocating.
func (ds *Datastore) All() iter.Seq[*Endpoint] {
	s := ds.snap.Load()
	return func(yield func(*Endpoint) bool) {
		for _, e := range s.sorted {
			if !yield(e.ep) {
				return
			}
		}
	}
}

// Len returns the number of endpoints.
func (ds *Datastore) Len() int { return len(ds.snap.Load().sorted) }

// SetMetrics stores the latest metrics of the endpoint named name; metrics
// for an endpoint that is no longer present are dropped.
func (ds *Datastore) SetMetrics(name string, m Metrics) {
	if e, ok := ds.snap.Load().byName[name]; ok {
		e.metrics.Store(&m)
		e.load.sawRunning(m.RunningRequests)
	}
}

// SetMetricsAt is SetMetrics for a scrape of addr: dropped when the endpoint
// has meanwhile moved to another address, whose load this is not.
func (ds *Datastore) SetMetricsAt(name, addr string, m Metrics) {
	if e, ok := ds.snap.Load().byName[name]; ok && e.ep.Address == addr {
		e.metrics.Store(&m)
		e.load.sawRunning(m.RunningRequests)
	}
}

// Metrics returns the latest metrics of the endpoint named name; they are the
// zero Metrics (never scraped) when none were stored.
func (ds *Datastore) Metrics(name string) (Metrics, bool) {
	e, ok := ds.snap.Load().byName[name]
	if !ok {
		return Metrics{}, false
	}
	return e.loadMetrics(), true
}

func (e *dsEntry) loadMetrics() Metrics {
	if m := e.metrics.Load(); m != nil {
		return *m
	}
	return Metrics{}
}

// Candidates snapshots, for one request, every endpoint that filter accepts
// (all of them when filter is nil), with its current metrics, stream state
// and in-flight work. An endpoint outlier detection has ejected is left
// out, and one on probation is in only for its share of requests; but
// when that would leave no candidate at all, they are all in.
func (ds *Datastore) Candidates(filter func(*Endpoint) bool) []*Candidate {
	return ds.CandidatesInto(nil, filter)
}

// CandidateSet is memory for one request's candidates, to be reused by a
// later request (CandidatesInto) once nothing uses the earlier one's, and
// for what producers publish on them (RequestMemory).
type CandidateSet struct {
	slab []Candidate
	ptrs []*Candidate

	// mem is every RequestMemory caller's memory, an owner's *[]T under
	// the owner and T, read without a lock: a request's filters ask for
	// theirs in every cycle, and a caller's memory is its own.
	mem readmostly.List[memoryKey, any]
}

// memoryKey is a RequestMemory caller's: its owner, and (*[]T)(nil) for
// its T.
type memoryKey struct {
	owner, typ any
}

// RequestMemory returns n zeroed values of T that live as long as the
// request's candidates, cands, do: a producer publishes pointers into it.
// When the candidates were made in a CandidateSet (CandidatesInto), the
// memory is the set's, and is given to the same owner again for the
// set's next request, when nothing uses this one's any more; so what is
// published costs no allocation per request. owner tells its callers
// apart (a producer passes itself); each owner has one such slice per
// type. Without a set, the memory is new.
func RequestMemory[T any](cands []*Candidate, owner any, n int) []T {
	return requestMemory[T](cands, owner, n, true)
}

// RequestMemoryOverwritten is RequestMemory for a caller that writes each
// value whole before anything reads it: the values are what the set's
// previous request left there, not zeroed. Clearing what is written again
// at once was about 4 µs of the latency producer's 22 a request on the
// ext_proc path (64 candidates' inputs, 25 KB, most of it cache misses).
func RequestMemoryOverwritten[T any](cands []*Candidate, owner any, n int) []T {
	return requestMemory[T](cands, owner, n, false)
}

func requestMemory[T any](cands []*Candidate, owner any, n int, zero bool) []T {
	var set *CandidateSet
	if len(cands) > 0 {
		set = cands[0].set
		if b := cands[0].base; b != nil {
			set = b.set
		}
	}
	if set == nil {
		return make([]T, n)
	}
	p := set.mem.GetOrAdd(memoryKey{owner: owner, typ: (*[]T)(nil)}, 0, func() any { return new([]T) }).(*[]T)
	if cap(*p) < n {
		*p = make([]T, n)
	}
	*p = (*p)[:n]
	if zero {
		clear(*p)
	}
	return *p
}

// CandidatesInto is Candidates, making the candidates in set's memory
// (grown when it is too small); a nil set is Candidates. The candidates set
// held before are overwritten: the caller reuses a set only once nothing
// uses the request it served.
func (ds *Datastore) CandidatesInto(set *CandidateSet, filter func(*Endpoint) bool) []*Candidate {
	s := ds.snap.Load()
	streams := ds.streams.Load()
	if streams != nil && streams.s == nil {
		streams = nil
	}
	var (
		outlier *outlierState
		now     int64
	)
	if ds.unhealthy.Load() > 0 {
		if outlier = ds.outlier.Load(); outlier != nil {
			now = ds.since(outlier.o.Now())
		}
	}
	// The candidates live in one slab: this runs for every request, and one
	// allocation per endpoint was most of its cost.
	var slab []Candidate
	reused := set != nil && cap(set.slab) >= len(s.sorted)
	if reused {
		slab = set.slab[:0]
	} else {
		slab = make([]Candidate, 0, len(s.sorted))
	}
	for {
		skipped := 0
		for _, e := range s.sorted {
			if filter != nil && !filter(e.ep) {
				continue
			}
			if outlier != nil && !ds.admit(outlier, e.health, now) {
				skipped++
				continue
			}
			// Each candidate is written whole, so that nothing of an earlier
			// request's candidate in this memory (what producers published on
			// it) is seen again; in place, since appending a composite literal
			// builds the large struct twice and copies it whole. Clearing the
			// slab first, then filling it, wrote every line twice.
			slab = slab[:len(slab)+1]
			c := &slab[len(slab)-1]
			*c = Candidate{Endpoint: e.ep, Metrics: unscraped, set: set, role: e.role, Residency: e.residency}
			if streams != nil {
				var info StreamInfo
				if info, c.described = e.streamInfo(streams); c.described {
					c.blockSize, c.bigram, c.describedBy = int32(info.BlockSize), info.Bigram, streams.s
					c.GPUBlocks = info.GPUBlocks
				}
				c.Stream = info.State
			}
			e.load.loadInto(&c.InFlight)
			if e.load.ranks.by.Load() != nil {
				c.RankLoads = e.load.ranks.loads(nil)
			}
			if m := e.metrics.Load(); m != nil {
				c.Metrics = m
			}
		}
		if len(slab) > 0 || skipped == 0 {
			break
		}
		// Ejection never empties a request's candidates: all again.
		outlier = nil
	}
	if reused && len(slab) < len(set.slab) {
		// Candidates the filter left out this time: what an earlier
		// request published there is no one's now.
		clear(set.slab[len(slab):len(set.slab)])
	}
	var out []*Candidate
	if set != nil && cap(set.ptrs) >= len(slab) {
		out = set.ptrs[:len(slab)]
	} else {
		out = make([]*Candidate, len(slab))
	}
	for i := range slab {
		out[i] = &slab[i]
	}
	if set != nil {
		set.slab, set.ptrs = slab, out
	}
	return out
}

// streamInfo reads the endpoint's stream info from streams, through its
// handle when streams hands them out (described then reports true: the
// info is whole), else its state alone by address.
func (e *dsEntry) streamInfo(streams *streamStatesHolder) (info StreamInfo, described bool) {
	if r := e.stream.Load(); r != nil && r.src == streams {
		if info, ok := r.h.StreamInfo(); ok {
			return info, true
		}
	}
	if hs, ok := streams.s.(StreamHandles); ok {
		if h := hs.StreamHandle(e.ep.Address); h != nil {
			if info, ok := h.StreamInfo(); ok {
				e.stream.Store(&streamRef{src: streams, h: h})
				return info, true
			}
		}
	}
	info.State, _ = streams.s.State(e.ep.Address)
	return info, false
}

// Equal reports whether a and b describe the same endpoint.
func (a *Endpoint) Equal(b *Endpoint) bool {
	return a == b || (a.Name == b.Name && a.Address == b.Address && a.Pod == b.Pod &&
		a.Namespace == b.Namespace && a.Model == b.Model && maps.Equal(a.Labels, b.Labels) && a.Topology == b.Topology)
}
