// Package flowcontrol holds requests in the EPP while the pool cannot serve
// them in time: per priority band, per flow (the client's fairness id), in
// an ordering policy's order, served across flows by a fairness policy,
// bounded by a TTL and by byte and count limits, displacing the lowest
// priority waiting requests when full. A request leaves its queue when its
// release check says an endpoint can take it now, when its SLO is out of
// reach, when its TTL ends or when its client goes away.
package flowcontrol

import (
	"container/heap"
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Verdict is a release check's answer for a waiting request.
type Verdict struct {
	// Release: dispatch the request now.
	Release bool
	// Refuse, when set, ends the request's wait with this error.
	Refuse error
}

// Request is one request asking to be dispatched.
type Request struct {
	// FlowID is the request's fairness id; empty is DefaultFlowID.
	FlowID   string
	Priority int
	// Bytes is what the request holds while it waits (its body).
	Bytes int64
	// TTL bounds its wait; zero takes the controller's DefaultTTL.
	TTL time.Duration
	// SLO is its TTFT SLO (zero: none): EDF's deadline.
	SLO time.Duration
	// Cost is the request's work for FairShare (its prompt tokens); zero
	// counts as one.
	Cost float64
	// GiveUp, when positive, is how long after its arrival the request's
	// SLO is out of reach even if dispatched then (its SLO less the best
	// TTFT any endpoint could give it): it is refused with
	// ErrSLOUnreachable then instead of waiting out its TTL.
	GiveUp time.Duration
	// Check decides on the controller's goroutine, one call at a time,
	// whether the request may go now, having waited waited.
	Check func(waited time.Duration) Verdict
}

// Controller queues requests and releases them. Run drives its releases;
// Wait is safe for concurrent use.
type Controller struct {
	cfg     Config
	now     func() time.Time
	metrics *Metrics
	kick    chan struct{}
	// waiting mirrors count for Kick, which has nothing to do (and no
	// goroutine to wake) while no one waits.
	waiting atomic.Int64

	mu sync.Mutex
	// shares are the flows' usage lately (share.go).
	shares map[string]*share
	// slos are the least TTFT SLO (or band target) seen lately in each
	// priority, for Protect.
	slos map[int]sloMark
	// demand is every flow's demand summed, decaying as each does, and
	// active the flows active lately as counted at activeAt, for the
	// flood limit (share.go).
	demand   decayed
	active   int
	activeAt time.Time

	bands   map[int]*band
	order   []*band // by priority, highest first
	count   int
	bytes   int64
	seq     uint64
	stopped bool
}

type band struct {
	cfg   Band
	flows map[string]*flow
	ring  []*flow // non-empty flows, in the order round-robin serves them
	next  int     // round-robin's cursor into ring
	count int
	bytes int64
	label string
}

type flow struct {
	id    string
	label string
	items items
	bytes int64
}

type item struct {
	req      *Request
	band     *band
	flow     *flow
	enqueued time.Time
	deadline time.Time // EDF's
	seq      uint64
	index    int
	done     chan error
	finished bool
	// checking is held while the request's check runs on the release
	// loop: its waiter returns only once no check of it runs, because
	// the check uses memory the request's caller reuses once it returns.
	checking sync.Mutex
}

// New makes a controller; now is its clock (nil: time.Now), metrics its
// metrics (nil: unregistered ones).
func New(cfg Config, now func() time.Time, metrics *Metrics) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 100 * time.Millisecond
	}
	if metrics == nil {
		metrics = NewMetrics(nil, cfg.MaxFlowLabels)
	}
	return &Controller{cfg: cfg, now: now, metrics: metrics, kick: make(chan struct{}, 1), bands: map[int]*band{},
		shares: map[string]*share{}, slos: map[int]sloMark{}}, nil
}

// Config is the configuration in force.
func (c *Controller) Config() Config { return c.cfg }

// Kick asks for the waiting requests' release to be evaluated again: a
// response ended, a request was dispatched, metrics were scraped. The
// caller of a Wait that returned nil kicks once the request's dispatch is
// accounted (or has failed): the controller releases one request a cycle,
// so that the next is checked against the load the last one added.
func (c *Controller) Kick() {
	if c.waiting.Load() == 0 {
		return
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Len is the number of requests waiting.
func (c *Controller) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// Run evaluates releases on every Kick, and at least every Recheck while
// requests wait (never while none do), until ctx ends; then it refuses
// every waiting request with ErrStopped.
func (c *Controller) Run(ctx context.Context) {
	t := time.NewTimer(c.cfg.Recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.stop()
			return
		case <-c.kick:
		case <-t.C:
		}
		c.cycle()
		if c.waiting.Load() > 0 {
			t.Reset(c.cfg.Recheck)
		} else {
			// The arrival that ends the idleness kicks.
			t.Stop()
		}
	}
}

func (c *Controller) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped = true
	var all []*item
	for _, b := range c.order {
		for _, f := range b.flows {
			all = append(all, f.items.unwrap()...)
		}
	}
	for _, it := range all {
		c.finishLocked(it, ErrStopped)
	}
}

// Wait enqueues r and returns once it is dispatched (nil) or refused or
// evicted (an error of this package's, StatusOf's status). A request with
// nothing of its priority or higher waiting, that its check releases, goes
// at once without queueing.
func (c *Controller) Wait(ctx context.Context, r *Request) error {
	if r.FlowID == "" {
		r.FlowID = DefaultFlowID
	}
	start := c.now()
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return ErrStopped
	}
	c.noteSLOLocked(r, start)
	c.arrivedLocked(r.FlowID, r.Cost, start)
	ahead := c.waitingAtOrAboveLocked(r.Priority) || c.flowAheadLocked(r.FlowID, start)
	c.mu.Unlock()
	if !ahead && r.Check != nil {
		v := r.Check(0)
		if v.Release {
			c.mu.Lock()
			c.releasedLocked(r.FlowID, r.Cost, c.now())
			c.mu.Unlock()
		}
		if v.Release || v.Refuse != nil {
			// A released request's caller kicks once it is dispatched.
			c.metrics.observe(r.FlowID, r.Priority, v.Refuse, 0)
			return v.Refuse
		}
	}
	it, err := c.enqueue(r, start)
	if err != nil {
		c.metrics.observe(r.FlowID, r.Priority, err, 0)
		return err
	}
	c.Kick()

	ttl := r.TTL
	if ttl <= 0 {
		ttl = c.cfg.DefaultTTL
	}
	var expire <-chan time.Time
	var expireErr error
	if ttl > 0 {
		expireErr = ErrTTLExpired
	}
	if r.GiveUp > 0 && (ttl <= 0 || r.GiveUp < ttl) {
		ttl, expireErr = r.GiveUp, ErrSLOUnreachable
	}
	if expireErr != nil {
		t := time.NewTimer(max(ttl-c.now().Sub(start), 0))
		defer t.Stop()
		expire = t.C
	}
	select {
	case err = <-it.done:
	case <-ctx.Done():
		err = c.leave(it, ErrCancelled)
	case <-expire:
		err = c.leave(it, expireErr)
	}
	// Out once no check of the request runs on the release loop.
	it.checking.Lock()
	it.checking.Unlock() //nolint:staticcheck // empty on purpose

	c.metrics.observe(r.FlowID, r.Priority, err, c.now().Sub(start))
	return err
}

// leave takes it out of its queue with err, unless it was finished first:
// then its first outcome stands.
func (c *Controller) leave(it *item, err error) error {
	c.mu.Lock()
	if !it.finished {
		c.finishLocked(it, err)
	}
	c.mu.Unlock()
	return <-it.done
}

func (c *Controller) waitingAtOrAboveLocked(priority int) bool {
	for _, b := range c.order {
		if b.cfg.Priority < priority {
			break
		}
		if b.count > 0 {
			return true
		}
	}
	return false
}

func (c *Controller) bandLocked(priority int) *band {
	if b, ok := c.bands[priority]; ok {
		return b
	}
	cfg := c.cfg.DefaultBand
	for _, bc := range c.cfg.Bands {
		if bc.Priority == priority {
			cfg = bc
		}
	}
	cfg.Priority = priority
	b := &band{cfg: cfg.withDefaults(), flows: map[string]*flow{}, label: priorityLabel(priority)}
	c.bands[priority] = b
	i, _ := slices.BinarySearchFunc(c.order, priority, func(x *band, p int) int { return p - x.cfg.Priority })
	c.order = slices.Insert(c.order, i, b)
	return b
}

// enqueue admits r into its band and flow, displacing lower-priority
// waiting requests if the limits demand it.
func (c *Controller) enqueue(r *Request, now time.Time) (*item, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.bandLocked(r.Priority)
	if !c.makeRoomLocked(b, r.Bytes) {
		if b.count == 0 && len(b.flows) == 0 {
			c.dropBandLocked(b)
		}
		return nil, ErrQueueAtCapacity
	}
	f := b.flows[r.FlowID]
	if f == nil {
		f = &flow{id: r.FlowID, label: c.metrics.flowLabel(r.FlowID)}
		b.flows[r.FlowID] = f
		b.ring = append(b.ring, f)
	}
	c.seq++
	it := &item{req: r, band: b, flow: f, enqueued: now, seq: c.seq, done: make(chan error, 1)}
	switch {
	case r.SLO > 0:
		it.deadline = now.Add(r.SLO)
	case r.TTL > 0:
		it.deadline = now.Add(r.TTL)
	case c.cfg.DefaultTTL > 0:
		it.deadline = now.Add(c.cfg.DefaultTTL)
	}
	heap.Push(&f.items, orderedItem{it, b.cfg.Ordering})
	f.bytes += r.Bytes
	b.count++
	b.bytes += r.Bytes
	c.count++
	c.waiting.Add(1)
	c.bytes += r.Bytes
	c.metrics.queued(f.label, b.label, 1, r.Bytes)
	return it, nil
}

// fits reports whether n more bytes and one more request fit b and the
// controller.
func (c *Controller) fitsLocked(b *band, n int64) bool {
	return b.count+1 <= b.cfg.MaxRequests && b.bytes+n <= b.cfg.MaxBytes &&
		(c.cfg.MaxRequests == 0 || c.count+1 <= c.cfg.MaxRequests) &&
		(c.cfg.MaxBytes == 0 || c.bytes+n <= c.cfg.MaxBytes)
}

// makeRoomLocked makes room for a request of n bytes in b, displacing the
// lowest-priority waiting requests below b's priority; it displaces
// nothing unless that makes enough room.
func (c *Controller) makeRoomLocked(b *band, n int64) bool {
	if c.fitsLocked(b, n) {
		return true
	}
	if b.count+1 > b.cfg.MaxRequests || b.bytes+n > b.cfg.MaxBytes {
		// Only the band's own requests count against its limits, and
		// none of them is of lower priority.
		return false
	}
	// Plan first: the global limits, freed from the lowest bands up.
	needCount := 0
	if c.cfg.MaxRequests > 0 {
		needCount = c.count + 1 - c.cfg.MaxRequests
	}
	var needBytes int64
	if c.cfg.MaxBytes > 0 {
		needBytes = c.bytes + n - c.cfg.MaxBytes
	}
	var victims []*item
	for i := len(c.order) - 1; i >= 0 && (needCount > 0 || needBytes > 0); i-- {
		lb := c.order[i]
		if lb.cfg.Priority >= b.cfg.Priority {
			break
		}
		for _, it := range lb.victims() {
			if needCount <= 0 && needBytes <= 0 {
				break
			}
			victims = append(victims, it)
			needCount--
			needBytes -= it.req.Bytes
		}
	}
	if needCount > 0 || needBytes > 0 {
		return false
	}
	for _, it := range victims {
		c.finishLocked(it, ErrDisplaced)
	}
	return true
}

// victims are b's requests in the order displacement takes them: from the
// flow holding the most, its last in the band's ordering first.
func (b *band) victims() []*item {
	var all []*item
	for _, f := range b.flows {
		all = append(all, f.items.unwrap()...)
	}
	ord := b.cfg.Ordering
	slices.SortFunc(all, func(x, y *item) int {
		if nx, ny := len(x.flow.items), len(y.flow.items); nx != ny {
			return ny - nx
		}
		if x.flow != y.flow {
			return compareStrings(x.flow.id, y.flow.id)
		}
		if before(x, y, ord) {
			return 1
		}
		return -1
	})
	return all
}

func compareStrings(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// finishLocked takes it out of its queue and hands its outcome to its waiter.
func (c *Controller) finishLocked(it *item, err error) {
	it.finished = true
	f, b := it.flow, it.band
	heap.Remove(&f.items, it.index)
	f.bytes -= it.req.Bytes
	b.count--
	b.bytes -= it.req.Bytes
	c.count--
	c.waiting.Add(-1)
	c.bytes -= it.req.Bytes
	c.metrics.queued(f.label, b.label, -1, -it.req.Bytes)
	if len(f.items) == 0 {
		// An empty flow is forgotten: flows are the clients' to name.
		delete(b.flows, f.id)
		i := slices.Index(b.ring, f)
		b.ring = slices.Delete(b.ring, i, i+1)
		if i < b.next {
			b.next--
		}
		if b.next >= len(b.ring) {
			b.next = 0
		}
	}
	if b.count == 0 {
		c.dropBandLocked(b)
	}
	it.done <- err
}

func (c *Controller) dropBandLocked(b *band) {
	delete(c.bands, b.cfg.Priority)
	if i := slices.Index(c.order, b); i >= 0 {
		c.order = slices.Delete(c.order, i, i+1)
	}
}

// head is the request b serves next by its fairness policy.
func (b *band) head() *item {
	if len(b.ring) == 0 {
		return nil
	}
	if b.cfg.Fairness == RoundRobin {
		return b.ring[b.next].items[0].item
	}
	var best *item
	for _, f := range b.ring {
		if h := f.items[0].item; best == nil || before(h, best, b.cfg.Ordering) {
			best = h
		}
	}
	return best
}

// heads is b's head, then its other flows' heads in the order its
// fairness policy would serve them.
func (b *band) heads() []*item {
	h := b.head()
	if h == nil {
		return nil
	}
	out := []*item{h}
	if b.cfg.Fairness == RoundRobin {
		for i := 1; i < len(b.ring); i++ {
			out = append(out, b.ring[(b.next+i)%len(b.ring)].items[0].item)
		}
		return out
	}
	for _, f := range b.ring {
		if g := f.items[0].item; g != h {
			out = append(out, g)
		}
	}
	slices.SortStableFunc(out[1:], func(x, y *item) int {
		if before(x, y, b.cfg.Ordering) {
			return -1
		}
		if before(y, x, b.cfg.Ordering) {
			return 1
		}
		return 0
	})
	return out
}

// served moves round-robin's cursor past the flow just served.
func (b *band) served(f *flow) {
	if b.cfg.Fairness != RoundRobin || len(b.ring) == 0 {
		return
	}
	if i := slices.Index(b.ring, f); i >= 0 {
		b.next = (i + 1) % len(b.ring)
	}
}

// cycle releases the next request that may go, and refuses the ones that
// never can, in the order nextLocked gives. A request held back holds back
// every later one of a lower standing (its priority, then whether its flow
// is within its share), so that none overtakes it; one of its own standing
// is still tried, as a request held because its own wait has used up its
// SLO must not keep a fresher one from an endpoint that can serve it in
// time, up to maxHeldPerCycle held ones a cycle (each check runs
// PrepareData). It releases one request: the next is checked after that
// one's dispatch kicks.
func (c *Controller) cycle() {
	c.mu.Lock()
	now := c.now()
	flood := c.floodLimitLocked(now)
	order := c.nextLocked(flood, now)
	c.mu.Unlock()
	held := 0
	var heldAt standing
	for _, it := range order {
		c.mu.Lock()
		at := c.standingLocked(it, flood, now)
		gone := it.finished
		c.mu.Unlock()
		if gone || (held > 0 && c.below(at, heldAt)) {
			continue
		}
		// The check runs under checking, and only while the request still
		// waits: its waiter, once out, takes checking before its caller
		// may reuse what the check reads.
		it.checking.Lock()
		c.mu.Lock()
		gone = it.finished
		c.mu.Unlock()
		v := Verdict{Release: true}
		if !gone && it.req.Check != nil {
			v = it.req.Check(c.now().Sub(it.enqueued))
		}
		it.checking.Unlock()
		c.mu.Lock()
		if !it.finished {
			switch {
			case v.Refuse != nil:
				c.finishLocked(it, v.Refuse)
			case v.Release:
				b, f := it.band, it.flow
				c.releasedLocked(it.flow.id, it.req.Cost, c.now())
				c.finishLocked(it, nil)
				b.served(f)
				c.mu.Unlock()
				return
			default:
				if held == 0 || c.below(heldAt, at) {
					heldAt = at
				}
				held++
			}
		}
		c.mu.Unlock()
		if held >= maxHeldPerCycle {
			return
		}
	}
}

// maxHeldPerCycle bounds the checks a cycle spends on requests that stay
// held: the most due are tried, the rest at the next kick.
const maxHeldPerCycle = 8

// standing is how urgent a waiting request is: its priority, and whether
// its flow is within its share (does not flood).
type standing struct {
	priority int
	within   bool
}

// below says whether s is less urgent than o. Under FairShare a flow
// that floods waits behind every flow within its share, whatever their
// priorities: what it sends beyond its share is served from what the
// others leave (share.go). Under upstream's bands priority is strict, and
// the share orders only requests of one priority.
func (c *Controller) below(s, o standing) bool {
	if c.cfg.FairShare && s.within != o.within {
		return o.within
	}
	return s.priority < o.priority || (s.priority == o.priority && !s.within && o.within)
}

func (c *Controller) standingLocked(it *item, flood float64, now time.Time) standing {
	return standing{priority: it.band.cfg.Priority, within: !c.floodsBeyond(it.flow.id, flood, now)}
}

// nextLocked is the waiting requests that may go next, in the order they
// are tried, with flood the flood limit now. By band: bands highest
// first, in each its head by its fairness and ordering policies, then its
// other flows' heads in that order. Under FairShare: each waiting flow's
// most urgent request, the flows within their share first, and among
// those and then among the flooding ones the flows with the least usage
// lately first (priority, then arrival, at equal usage).
func (c *Controller) nextLocked(flood float64, now time.Time) []*item {
	var out []*item
	if !c.cfg.FairShare {
		for _, b := range c.order {
			out = append(out, b.heads()...)
		}
		return out
	}
	// Bands highest first: a flow's first head found is its most urgent.
	type rank struct {
		floods bool
		use    float64
	}
	ranks := map[string]rank{}
	for _, b := range c.order {
		for _, f := range b.ring {
			if _, seen := ranks[f.id]; !seen {
				ranks[f.id] = rank{floods: c.floodsBeyond(f.id, flood, now), use: c.usageLocked(f.id, now)}
				out = append(out, f.items[0].item)
			}
		}
	}
	slices.SortStableFunc(out, func(x, y *item) int {
		rx, ry := ranks[x.flow.id], ranks[y.flow.id]
		if rx.floods != ry.floods {
			if ry.floods {
				return -1
			}
			return 1
		}
		if rx.use != ry.use {
			if rx.use < ry.use {
				return -1
			}
			return 1
		}
		if px, py := x.band.cfg.Priority, y.band.cfg.Priority; px != py {
			return py - px
		}
		return int(x.seq) - int(y.seq)
	})
	return out
}

// flowAheadLocked says, under FairShare, whether a request of flow must
// wait its turn even when nothing of its priority waits: a flow of less
// usage has a request waiting, or flow floods and a flow within its share
// has one waiting. A flooding flow of less usage is not ahead of one
// within its share.
func (c *Controller) flowAheadLocked(flow string, now time.Time) bool {
	if !c.cfg.FairShare || c.count == 0 {
		return false
	}
	flood := c.floodLimitLocked(now)
	mine, floods := c.usageLocked(flow, now), c.floodsBeyond(flow, flood, now)
	for _, b := range c.order {
		for _, f := range b.ring {
			switch other := c.floodsBeyond(f.id, flood, now); {
			case floods && !other:
				return true
			case floods == other && c.usageLocked(f.id, now) < mine:
				return true
			}
		}
	}
	return false
}

// sloMark is the least SLO seen in a priority since at, and the
// priority's arrivals from flows within their share, decaying, counted
// since since.
type sloMark struct {
	least     time.Duration
	at, since time.Time
	arrivals  decayed
}

// perSecond is the priority's protected arrivals a second lately: their
// decayed count over the time it spans, the decay's time constant once
// counting has gone on for long and less before, so that a priority
// whose requests began a second ago does not count as arriving at a
// fifth of its rate.
func (m sloMark) perSecond(now time.Time) float64 {
	span := max(now.Sub(m.since), minRateSpan).Seconds()
	return m.arrivals.now(now) / (shareDecay.Seconds() * -math.Expm1(-span/shareDecay.Seconds()))
}

// minRateSpan is the least time a rate is counted over.
const minRateSpan = time.Second

// sloWindow is how long a priority's SLO protects it after its last
// request.
const sloWindow = 30 * time.Second

func (c *Controller) noteSLOLocked(r *Request, now time.Time) {
	slo := r.SLO
	if slo <= 0 {
		slo = c.Target(r.Priority)
	}
	if slo <= 0 {
		return
	}
	m, ok := c.slos[r.Priority]
	if !ok && len(c.slos) >= maxPriorities {
		return
	}
	if fresh := !ok || now.Sub(m.at) > sloWindow; fresh {
		m.least, m.since, m.arrivals = slo, now, decayed{}
	} else if slo < m.least {
		m.least = slo
	}
	m.at = now
	// A flow that floods is not protected from itself: what it sends
	// beyond its share does not count in the room kept for the others.
	if !c.floodsBeyond(r.FlowID, c.floodLimitLocked(now), now) {
		m.arrivals.add(1, now)
	}
	c.slos[r.Priority] = m
}

// maxPriorities bounds the priorities whose SLOs are remembered.
const maxPriorities = 64

// Protection is what a request released ahead of more urgent work must
// leave room for (Gate.Decide): the tightest TTFT SLO (or band target) of
// the priorities it protects, and how many of their requests arrive a
// second lately (from flows within their share), so that the room kept
// is enough for those arriving while its own prefill runs, or, when it
// is Beyond its flow's share, while one of them could still wait for a
// place (Gate.Decide). The zero Protection protects nothing.
type Protection struct {
	SLO       time.Duration
	PerSecond float64
	Beyond    bool
}

// Protect is the Protection of a request of priority from flow: the
// priorities above it that had requests lately; when flow floods
// (share.go), its own too, and under FairShare every priority, as a
// flooding flow goes behind every flow within its share.
func (c *Controller) Protect(priority int, flow string) Protection {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if flow == "" {
		flow = DefaultFlowID
	}
	var p Protection
	from := priority + 1
	if c.floodsBeyond(flow, c.floodLimitLocked(now), now) {
		from, p.Beyond = priority, true
		if c.cfg.FairShare {
			from = math.MinInt
		}
	}
	for pr, m := range c.slos {
		if pr < from || now.Sub(m.at) > sloWindow {
			continue
		}
		if p.SLO == 0 || m.least < p.SLO {
			p.SLO = m.least
		}
		p.PerSecond += m.perSecond(now)
	}
	return p
}

// before orders x ahead of y in a queue.
func before(x, y *item, o Ordering) bool {
	if o == EDF {
		switch xz, yz := x.deadline.IsZero(), y.deadline.IsZero(); {
		case xz != yz:
			return yz
		case !xz && !x.deadline.Equal(y.deadline):
			return x.deadline.Before(y.deadline)
		}
	}
	return x.seq < y.seq
}

type orderedItem struct {
	*item
	ord Ordering
}

// items is a flow's queue, a heap in its band's ordering.
type items []orderedItem

func (q items) Len() int           { return len(q) }
func (q items) Less(i, j int) bool { return before(q[i].item, q[j].item, q[i].ord) }
func (q items) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i, j
}
func (q *items) Push(x any) {
	o := x.(orderedItem)
	o.index = len(*q)
	*q = append(*q, o)
}
func (q *items) Pop() any {
	old := *q
	o := old[len(old)-1]
	old[len(old)-1] = orderedItem{}
	*q = old[:len(old)-1]
	return o
}

func (q items) unwrap() []*item {
	out := make([]*item, len(q))
	for i, o := range q {
		out[i] = o.item
	}
	return out
}

// Target is the TTFT target of priority's band (zero: none).
func (c *Controller) Target(priority int) time.Duration {
	for _, b := range c.cfg.Bands {
		if b.Priority == priority {
			return b.TTFTTarget
		}
	}
	return c.cfg.DefaultBand.TTFTTarget
}
