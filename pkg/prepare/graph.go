package prepare

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
)

// Errors from BuildGraph, for errors.Is; the messages name the plugins and
// keys involved.
var (
	ErrMissingProducer   = errors.New("data key has no producer")
	ErrDuplicateProducer = errors.New("data key has several producers")
	ErrTypeMismatch      = errors.New("data key type mismatch")
	ErrDependencyCycle   = errors.New("data dependency cycle")
)

// ErrProducerTimeout marks a producer that had not returned when the
// PrepareData deadline passed; nothing it produced was published.
var ErrProducerTimeout = errors.New("data producer missed the deadline")

// Graph is the checked data-dependency graph of a set of plugins, and the
// executor that runs its DataProducers for each request.
type Graph struct {
	// nodes are the DataProducers in a topological order: each after all the
	// producers of the keys it consumes.
	nodes  []*graphNode
	logger *slog.Logger
	reg    prometheus.Registerer

	duration *prometheus.HistogramVec
	errors   *prometheus.CounterVec
	// failLog bounds the failure lines: requests decide how often
	// producers fail (a flood of them times them out).
	failLog *rate.Limiter

	// allInline: every producer runs on Run's goroutine (runInline).
	allInline bool
}

type graphNode struct {
	p    DataProducer
	name string
	// deps index Graph.nodes; all are earlier in the order.
	deps     []int
	produces []string
	// inline: the producer runs on the caller's goroutine (InlineProducer).
	inline bool

	duration prometheus.Observer
	timeouts prometheus.Counter
	failures prometheus.Counter
}

// GraphOption configures BuildGraph.
type GraphOption func(*Graph)

// WithRegisterer registers the executor's metrics with reg. A graph
// rebuilt later (on a configuration reload) with the same reg shares the
// metrics already registered.
func WithRegisterer(reg prometheus.Registerer) GraphOption {
	return func(g *Graph) { g.reg = reg }
}

// WithLogger sets where producer failures are logged (slog.Default
// otherwise).
func WithLogger(l *slog.Logger) GraphOption {
	return func(g *Graph) {
		if l != nil {
			g.logger = l
		}
	}
}

// BuildGraph checks the data dependencies of plugins and orders their
// DataProducers. Every key a Consumer (scorers and filters included)
// consumes must be produced by exactly one Producer, with the same type as
// the consumer's exemplar, and the producers must not depend on each other
// in a cycle. All problems are reported together.
//
// A plugin listed more than once (one instance serving several extension
// points) is counted once; plugins are told apart by their TypedName.
func BuildGraph(plugins []plugin.Plugin, opts ...GraphOption) (*Graph, error) {
	g := &Graph{
		logger:  slog.Default(),
		failLog: rate.NewLimiter(rate.Every(time.Second), 5),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_prepare_data_duration_seconds",
			Help:    "Time each PrepareData producer took for one request.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}, []string{"plugin"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prepare_data_errors_total",
			Help: "PrepareData producer failures, by plugin and reason (timeout, error).",
		}, []string{"plugin", "reason"}),
	}
	for _, o := range opts {
		o(g)
	}

	var uniq []plugin.Plugin
	seen := map[string]bool{}
	for _, p := range plugins {
		if p == nil {
			continue
		}
		n := p.TypedName().String()
		if !seen[n] {
			seen[n] = true
			uniq = append(uniq, p)
		}
	}

	type production struct {
		by  plugin.Plugin
		typ reflect.Type
	}
	var errs []error
	producers := map[string]production{}
	for _, p := range uniq {
		pr, ok := p.(plugin.Producer)
		if !ok {
			continue
		}
		for _, key := range sortedKeys(pr.Produces()) {
			if prev, dup := producers[key]; dup {
				errs = append(errs, fmt.Errorf("%w: %q is produced by both %s and %s",
					ErrDuplicateProducer, key, prev.by.TypedName(), p.TypedName()))
				continue
			}
			producers[key] = production{by: p, typ: reflect.TypeOf(pr.Produces()[key])}
		}
	}
	for _, p := range uniq {
		c, ok := p.(plugin.Consumer)
		if !ok {
			continue
		}
		consumes := c.Consumes()
		for _, key := range sortedKeys(consumes) {
			want := reflect.TypeOf(consumes[key])
			prod, ok := producers[key]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%w: %s consumes %q (type %s) but nobody produces it",
					ErrMissingProducer, p.TypedName(), key, typeName(want)))
			case prod.typ != want:
				errs = append(errs, fmt.Errorf("%w: %s consumes %q as %s but %s produces it as %s",
					ErrTypeMismatch, p.TypedName(), key, typeName(want), prod.by.TypedName(), typeName(prod.typ)))
			}
		}
	}

	// Order every producer, not only the DataProducers, so that a cycle
	// through a producer that publishes by other means is still caught.
	index := map[string]int{}
	var all []plugin.Plugin
	for _, p := range uniq {
		if _, ok := p.(plugin.Producer); ok {
			index[p.TypedName().String()] = len(all)
			all = append(all, p)
		}
	}
	depsOf := func(i int) []int {
		c, ok := all[i].(plugin.Consumer)
		if !ok {
			return nil
		}
		var deps []int
		for _, key := range sortedKeys(c.Consumes()) {
			if prod, ok := producers[key]; ok {
				if j := index[prod.by.TypedName().String()]; !slices.Contains(deps, j) {
					deps = append(deps, j)
				}
			}
		}
		return deps
	}
	order, cycle := topoOrder(len(all), depsOf)
	if cycle != nil {
		errs = append(errs, fmt.Errorf("%w: %s", ErrDependencyCycle, describeCycle(all, cycle, edgeKeys(all))))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}

	if g.reg != nil {
		var err error
		if g.duration, err = RegisterOrReuse(g.reg, g.duration); err != nil {
			return nil, err
		}
		if g.errors, err = RegisterOrReuse(g.reg, g.errors); err != nil {
			return nil, err
		}
	}

	pos := map[int]int{}
	for _, i := range order {
		dp, ok := all[i].(DataProducer)
		if !ok {
			continue
		}
		name := dp.TypedName().String()
		n := &graphNode{
			p:        dp,
			name:     name,
			produces: sortedKeys(dp.Produces()),
			inline:   isInline(dp),
			duration: g.duration.WithLabelValues(name),
			timeouts: g.errors.WithLabelValues(name, "timeout"),
			failures: g.errors.WithLabelValues(name, "error"),
		}
		for _, d := range depsOf(i) {
			// Producers that are not DataProducers have no place in the
			// run; what they publish is there before it starts.
			if k, ok := pos[d]; ok {
				n.deps = append(n.deps, k)
			}
		}
		pos[i] = len(g.nodes)
		g.nodes = append(g.nodes, n)
		g.allInline = len(g.nodes) == 1 && n.inline || g.allInline && n.inline
	}
	return g, nil
}

// RegisterOrReuse registers c with reg, or returns the collector of the same
// description already registered there (a producer rebuilt on a
// configuration reload keeps its series).
func RegisterOrReuse[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register data producer metrics: %w", err)
}

// edgeKeys returns, for a consumer→producer edge, the keys carrying it.
func edgeKeys(all []plugin.Plugin) func(from, to int) []string {
	return func(from, to int) []string {
		c, ok := all[from].(plugin.Consumer)
		p, ok2 := all[to].(plugin.Producer)
		if !ok || !ok2 {
			return nil
		}
		var keys []string
		for _, key := range sortedKeys(c.Consumes()) {
			if _, prod := p.Produces()[key]; prod {
				keys = append(keys, key)
			}
		}
		return keys
	}
}

// topoOrder orders n nodes so that each comes after its deps, or returns one
// cycle (as node indexes, first repeated at the end) when there is none.
func topoOrder(n int, deps func(int) []int) (order, cycle []int) {
	const (
		white = iota
		grey
		black
	)
	color := make([]int, n)
	var stack []int
	var visit func(int) bool
	visit = func(i int) bool {
		color[i] = grey
		stack = append(stack, i)
		for _, d := range deps(i) {
			switch color[d] {
			case grey:
				at := slices.Index(stack, d)
				cycle = append(slices.Clone(stack[at:]), d)
				return false
			case white:
				if !visit(d) {
					return false
				}
			}
		}
		stack = stack[:len(stack)-1]
		color[i] = black
		order = append(order, i)
		return true
	}
	for i := range n {
		if color[i] == white && !visit(i) {
			return nil, cycle
		}
	}
	return order, nil
}

func describeCycle(all []plugin.Plugin, cycle []int, keys func(from, to int) []string) string {
	var b strings.Builder
	for k, i := range cycle {
		if k > 0 {
			fmt.Fprintf(&b, " -(%s)-> ", quoteAll(keys(cycle[k-1], i)))
		}
		b.WriteString(all[i].TypedName().String())
	}
	b.WriteString(" (each consumes what the next produces)")
	return b.String()
}

func quoteAll(keys []string) string {
	q := make([]string, len(keys))
	for i, k := range keys {
		q[i] = fmt.Sprintf("%q", k)
	}
	return strings.Join(q, ",")
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmp.Compare)
	return keys
}

func typeName(t reflect.Type) string {
	if t == nil {
		return "nil"
	}
	return t.String()
}

// AllInline reports whether every producer runs on Run's goroutine, so
// that nothing Run started still uses the request or its candidates once
// it has returned. A nil Graph has no producers.
func (g *Graph) AllInline() bool { return g == nil || len(g.nodes) == 0 || g.allInline }

// Produces reports whether one of the graph's producers publishes key.
func (g *Graph) Produces(key string) bool {
	for _, n := range g.nodes {
		if slices.Contains(n.produces, key) {
			return true
		}
	}
	return false
}

// Order returns the DataProducers in the order their dependencies impose.
func (g *Graph) Order() []plugin.TypedName {
	out := make([]plugin.TypedName, len(g.nodes))
	for i, n := range g.nodes {
		out[i] = n.p.TypedName()
	}
	return out
}

// Run runs the DataProducers for one request within timeout: each starts as
// soon as the producers it depends on have finished, so independent ones run
// in parallel. A producer works on its own staging copy of the candidates,
// and what it Puts there under the keys it declares is published to cands
// only if it returns before the deadline without error: one that misses the
// deadline publishes nothing, even if it keeps running after Run returns,
// and one that fails publishes nothing either. A failure is logged under the
// producer's name and does not stop the others (its dependents run without
// its data). Run returns when every producer has finished or the deadline
// has passed, with the producers' errors joined. An InlineProducer runs on
// the caller's goroutine, so Run returns no sooner than it does. A nil
// Graph runs nothing.
func (g *Graph) Run(ctx context.Context, timeout time.Duration, req *request.Request, cands []*datalayer.Candidate) error {
	if g == nil || len(g.nodes) == 0 {
		return nil
	}
	if g.allInline {
		dc := newDeadlineCtx(ctx, timeout)
		defer dc.release()
		return g.runInline(dc, req, cands)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	// Each producer stages its writes in its own views of the candidates,
	// and all the views of a run come from one slab: a request has tens of
	// candidates, so this replaces an allocation per candidate per producer
	// with one per run. A producer on its own goroutine that misses the
	// deadline may still write into its views after Run returns, so the
	// slab is never reused.
	nc := len(cands)
	for _, c := range cands {
		// Producers on goroutines of their own read c while others commit
		// into it, and may still read it after Run returns.
		c.MarkShared()
	}
	slab, views := make([]datalayer.Candidate, len(g.nodes)*nc), make([]*datalayer.Candidate, len(g.nodes)*nc)
	for k := range slab {
		c, v := cands[k%nc], &slab[k]
		c.StageInto(v)
		views[k] = v
	}
	runs := make([]producerRun, len(g.nodes))
	for i := range runs {
		runs[i].done = make(chan struct{})
	}
	// The capacity is cut so that a producer appending to its slice cannot
	// write over the next producer's views.
	staged := func(i int) []*datalayer.Candidate { return views[i*nc : (i+1)*nc : (i+1)*nc] }
	for i, n := range g.nodes {
		if !n.inline {
			go g.runNode(ctx, n, runs, i, req, cands, staged(i))
		}
	}
	// Inline producers run here, in dependency order, while the others run
	// on their own goroutines; each still waits for the producers it
	// depends on, or the deadline.
	for i, n := range g.nodes {
		if n.inline {
			g.runNode(ctx, n, runs, i, req, cands, staged(i))
		}
	}
	for i := range runs {
		select {
		case <-runs[i].done:
		case <-ctx.Done():
			// Close every run that has not committed, so that nothing lands
			// in cands after Run returns.
			for k := range runs[i:] {
				runs[i+k].close(context.Cause(ctx))
			}
		}
	}
	var errs []error
	for i := range runs {
		if err := runs[i].result(); err != nil {
			errs = append(errs, g.failed(ctx, g.nodes[i], req, err))
		}
	}
	return errors.Join(errs...)
}

// runInline is Run when every producer runs on the caller's goroutine: one
// after another in dependency order, each writing into the candidates
// themselves, its writes held back (Candidate.Stage) until it returns in
// time without error, and dropped otherwise. Nothing else touches the
// candidates meanwhile, so no view of them is needed; a copy of the
// slice still keeps a producer from reordering the request's.
func (g *Graph) runInline(ctx *deadlineCtx, req *request.Request, cands []*datalayer.Candidate) error {
	ptrs := candsPool.Get().(*[]*datalayer.Candidate)
	defer func() {
		clear(*ptrs)
		candsPool.Put(ptrs)
	}()
	var errs []error
	for _, n := range g.nodes {
		*ptrs = append((*ptrs)[:0], cands...)
		if err := g.produceInline(ctx, n, req, cands, *ptrs); err != nil {
			errs = append(errs, g.failed(ctx, n, req, err))
		}
	}
	return errors.Join(errs...)
}

// candsPool holds runInline's copies of the candidate slice.
var candsPool = sync.Pool{New: func() any { return new([]*datalayer.Candidate) }}

// produceInline runs one producer of runInline over view, a copy of cands.
func (g *Graph) produceInline(ctx *deadlineCtx, n *graphNode, req *request.Request, cands, view []*datalayer.Candidate) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ErrProducerTimeout, ctx.cause())
	}
	for _, c := range cands {
		c.Stage()
	}
	start := time.Now()
	err := n.p.Produce(ctx, req, view)
	n.duration.Observe(time.Since(start).Seconds())
	if ctx.Err() != nil {
		if err == nil {
			err = ctx.cause()
		}
		err = fmt.Errorf("%w: %w", ErrProducerTimeout, err)
	}
	for _, c := range cands {
		if err == nil {
			c.CommitStaged(n.produces)
		} else {
			c.DiscardStaged()
		}
	}
	return err
}

// failed counts and logs a producer's failure, and returns it named.
func (g *Graph) failed(ctx context.Context, n *graphNode, req *request.Request, err error) error {
	if errors.Is(err, ErrProducerTimeout) {
		n.timeouts.Inc()
	} else {
		n.failures.Inc()
	}
	if g.failLog.Allow() {
		g.logger.LogAttrs(ctx, slog.LevelWarn, "data producer failed",
			slog.String("plugin", n.name), slog.String("request", req.ID), slog.Any("error", err))
	}
	return fmt.Errorf("%s: %w", n.name, err)
}

// producerRun is one producer's state within one Run. mu orders the
// producer's commit against Run giving up on it at the deadline: whichever
// comes first wins, and the other does nothing.
type producerRun struct {
	mu     sync.Mutex
	closed bool
	err    error
	done   chan struct{}
}

// finish records the producer's outcome and, unless Run has given up on it,
// publishes its work with commit. It reports whether it committed.
func (r *producerRun) finish(err error, commit func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.err = err
	if err == nil {
		commit()
	}
	close(r.done)
}

// close gives up on the producer at the deadline; cause says why the run's
// context ended.
func (r *producerRun) close(cause error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.err = fmt.Errorf("%w: %w", ErrProducerTimeout, cause)
	close(r.done)
}

func (r *producerRun) result() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func isInline(dp DataProducer) bool {
	ip, ok := dp.(InlineProducer)
	return ok && ip.ProducesInline()
}

func (g *Graph) runNode(ctx context.Context, n *graphNode, runs []producerRun, i int, req *request.Request, cands, staged []*datalayer.Candidate) {
	for _, d := range n.deps {
		select {
		case <-runs[d].done:
		case <-ctx.Done():
		}
	}
	if ctx.Err() != nil {
		runs[i].close(context.Cause(ctx))
		return
	}
	start := time.Now()
	err := n.p.Produce(ctx, req, staged)
	n.duration.Observe(time.Since(start).Seconds())
	if ctx.Err() != nil {
		// Returned, but too late: what it produced may be partial, and an
		// error it returned is most likely the deadline itself.
		if err == nil {
			err = context.Cause(ctx)
		}
		err = fmt.Errorf("%w: %w", ErrProducerTimeout, err)
	}
	runs[i].finish(err, func() {
		for k, c := range cands {
			c.Commit(staged[k], n.produces)
		}
	})
}
