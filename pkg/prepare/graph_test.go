package prepare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// keyProducer is a DataProducer whose work is a function; the graph tests
// compose real pipelines out of it.
type keyProducer struct {
	name     string
	produces map[string]any
	consumes map[string]any
	produce  func(ctx context.Context, cands []*datalayer.Candidate) error
}

var _ DataProducer = (*keyProducer)(nil)

func (p *keyProducer) TypedName() plugin.TypedName {
	return plugin.TypedName{Type: "test-producer", Name: p.name}
}
func (p *keyProducer) Produces() map[string]any { return p.produces }
func (p *keyProducer) Consumes() map[string]any { return p.consumes }
func (p *keyProducer) Produce(ctx context.Context, _ *request.Request, cands []*datalayer.Candidate) error {
	if p.produce == nil {
		return nil
	}
	return p.produce(ctx, cands)
}

// keyScorer only consumes, like a scorer.
type keyScorer struct {
	name     string
	consumes map[string]any
}

func (s *keyScorer) TypedName() plugin.TypedName {
	return plugin.TypedName{Type: "precise-prefix-cache-scorer", Name: s.name}
}
func (s *keyScorer) Consumes() map[string]any { return s.consumes }

// keyPublisher produces keys by means other than PrepareData (a data
// source, say): it is in the graph but not run.
type keyPublisher struct {
	name     string
	produces map[string]any
	consumes map[string]any
}

func (p *keyPublisher) TypedName() plugin.TypedName {
	return plugin.TypedName{Type: "test-source", Name: p.name}
}
func (p *keyPublisher) Produces() map[string]any { return p.produces }
func (p *keyPublisher) Consumes() map[string]any { return p.consumes }

func produces(keys ...string) map[string]any {
	m := map[string]any{}
	for _, k := range keys {
		m[k] = 0
	}
	return m
}

func TestBuildGraphRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		plugins []plugin.Plugin
		is      []error
		wants   []string
	}{
		{
			name:    "a consumed key nobody produces is named with its consumer and type",
			plugins: []plugin.Plugin{&keyScorer{name: "precise-scorer", consumes: map[string]any{"X": datalayer.PrefixCacheInfo{}}}},
			is:      []error{ErrMissingProducer},
			wants:   []string{`precise-scorer/precise-prefix-cache-scorer consumes "X" (type datalayer.PrefixCacheInfo) but nobody produces it`},
		},
		{
			name: "a type mismatch names both sides",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p", produces: map[string]any{"X": 1}},
				&keyScorer{name: "s", consumes: map[string]any{"X": int64(1)}},
			},
			is:    []error{ErrTypeMismatch},
			wants: []string{`s/precise-prefix-cache-scorer consumes "X" as int64 but p/test-producer produces it as int`},
		},
		{
			name: "maps of different element types mismatch without panicking",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p", produces: map[string]any{"X": map[string]int{"a": 1}}},
				&keyScorer{name: "s", consumes: map[string]any{"X": map[string]float64{}}},
			},
			is:    []error{ErrTypeMismatch},
			wants: []string{"map[string]float64", "map[string]int"},
		},
		{
			name: "a slice and a pointer to it mismatch",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p", produces: map[string]any{"X": []int{1}}},
				&keyScorer{name: "s", consumes: map[string]any{"X": &[]int{}}},
			},
			is:    []error{ErrTypeMismatch},
			wants: []string{"*[]int", "as []int"},
		},
		{
			name: "two producers of one key are both named",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p1", produces: produces("X")},
				&keyProducer{name: "p2", produces: produces("X")},
			},
			is:    []error{ErrDuplicateProducer},
			wants: []string{`"X" is produced by both p1/test-producer and p2/test-producer`},
		},
		{
			name: "a cycle of two producers is shown with its keys",
			plugins: []plugin.Plugin{
				&keyProducer{name: "a", produces: produces("A"), consumes: produces("B")},
				&keyProducer{name: "b", produces: produces("B"), consumes: produces("A")},
			},
			is:    []error{ErrDependencyCycle},
			wants: []string{`a/test-producer -("B")-> b/test-producer -("A")-> a/test-producer`},
		},
		{
			name: "a producer consuming its own key is a cycle",
			plugins: []plugin.Plugin{
				&keyProducer{name: "a", produces: produces("A"), consumes: produces("A")},
			},
			is:    []error{ErrDependencyCycle},
			wants: []string{`a/test-producer -("A")-> a/test-producer`},
		},
		{
			name: "a cycle through a producer that is not run is still a cycle",
			plugins: []plugin.Plugin{
				&keyProducer{name: "a", produces: produces("A"), consumes: produces("S")},
				&keyPublisher{name: "src", produces: produces("S"), consumes: produces("A")},
			},
			is:    []error{ErrDependencyCycle},
			wants: []string{"src/test-source"},
		},
		{
			name: "every problem is reported at once",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p", produces: map[string]any{"X": ""}},
				&keyScorer{name: "s", consumes: map[string]any{"X": 0, "Y": 0}},
			},
			is:    []error{ErrTypeMismatch, ErrMissingProducer},
			wants: []string{`consumes "X" as int`, `consumes "Y" (type int) but nobody produces it`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, err := BuildGraph(tt.plugins)
			if err == nil {
				t.Fatalf("built a graph: order %v", g.Order())
			}
			for _, target := range tt.is {
				if !errors.Is(err, target) {
					t.Errorf("error %q is not %v", err, target)
				}
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestBuildGraphAccepts(t *testing.T) {
	t.Parallel()
	m := map[string][]int{}
	tests := []struct {
		name    string
		plugins []plugin.Plugin
		order   []string
	}{
		{
			name: "non-comparable exemplars of the same type agree",
			plugins: []plugin.Plugin{
				&keyScorer{name: "s", consumes: map[string]any{"X": map[string][]int{"z": {1}}}},
				&keyProducer{name: "p", produces: map[string]any{"X": m}},
			},
			order: []string{"p"},
		},
		{
			name: "a plugin listed twice for two roles counts once",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p", produces: produces("X")},
				&keyProducer{name: "p", produces: produces("X")},
				&keyScorer{name: "s", consumes: produces("X")},
			},
			order: []string{"p"},
		},
		{
			name: "keys from a producer that is not run satisfy consumers",
			plugins: []plugin.Plugin{
				&keyProducer{name: "p", produces: produces("X"), consumes: produces("S")},
				&keyPublisher{name: "src", produces: produces("S")},
			},
			order: []string{"p"},
		},
		{
			name: "producers come after what they consume whatever the listing order",
			plugins: []plugin.Plugin{
				&keyProducer{name: "c", produces: produces("C"), consumes: produces("B")},
				&keyProducer{name: "b", produces: produces("B"), consumes: produces("A")},
				&keyProducer{name: "a", produces: produces("A")},
			},
			order: []string{"a", "b", "c"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, err := BuildGraph(tt.plugins)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, n := range g.Order() {
				got = append(got, n.Name)
			}
			if !slices.Equal(got, tt.order) {
				t.Fatalf("order = %v, want %v", got, tt.order)
			}
		})
	}
}

func testCandidates(n int) []*datalayer.Candidate {
	cands := make([]*datalayer.Candidate, n)
	for i := range cands {
		cands[i] = datalayer.NewCandidate(ep(fmt.Sprintf("e%d", i), fmt.Sprintf("10.0.0.%d:8000", i+1)), datalayer.Metrics{}, datalayer.StreamExact)
	}
	return cands
}

func getInt(c *datalayer.Candidate, key string) (int, bool) {
	v, ok := c.Get(key)
	if !ok {
		return 0, false
	}
	n, ok := v.(int)
	return n, ok
}

// derive returns a producer computing out = f(ins...) on every candidate.
func derive(name, out string, f func(in []int) int, ins ...string) *keyProducer {
	return &keyProducer{
		name: name, produces: produces(out), consumes: produces(ins...),
		produce: func(_ context.Context, cands []*datalayer.Candidate) error {
			for _, c := range cands {
				vals := make([]int, len(ins))
				for i, k := range ins {
					v, ok := getInt(c, k)
					if !ok {
						return fmt.Errorf("%s: input %q not there", name, k)
					}
					vals[i] = v
				}
				c.Put(out, f(vals))
			}
			return nil
		},
	}
}

func TestGraphRunsADiamondInDependencyOrder(t *testing.T) {
	t.Parallel()
	// top → (left, right) → bottom: bottom sees both sides, both sides see top.
	plugins := []plugin.Plugin{
		derive("bottom", "D", func(in []int) int { return in[0] * in[1] }, "B", "C"),
		derive("left", "B", func(in []int) int { return in[0] + 1 }, "A"),
		derive("right", "C", func(in []int) int { return in[0] + 2 }, "A"),
		&keyProducer{name: "top", produces: produces("A"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
			for i, c := range cands {
				c.Put("A", 10*i)
			}
			return nil
		}},
		&keyScorer{name: "s", consumes: produces("D")},
	}
	reg := prometheus.NewRegistry()
	g, err := BuildGraph(plugins, WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(3)
	if err := g.Run(t.Context(), 10*time.Second, &request.Request{ID: "r1"}, cands); err != nil {
		t.Fatal(err)
	}
	for i, c := range cands {
		a := 10 * i
		if got, _ := getInt(c, "D"); got != (a+1)*(a+2) {
			t.Errorf("candidate %d: D = %d, want %d", i, got, (a+1)*(a+2))
		}
	}
	if n := testutil.CollectAndCount(g.duration); n != 4 {
		t.Errorf("duration series = %d, want one per producer", n)
	}
	// A rebuild on the same registry (a configuration reload) shares the
	// metrics instead of failing to register them twice.
	g2, err := BuildGraph(plugins, WithRegisterer(reg))
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if g2.duration != g.duration {
		t.Error("the rebuilt graph does not share the registered metrics")
	}
}

func TestGraphRunsIndependentProducersInParallel(t *testing.T) {
	t.Parallel()
	// Each waits for the other to have started: run one after the other,
	// they would deadlock until the deadline and fail.
	aStarted, bStarted := make(chan struct{}), make(chan struct{})
	meet := func(mine, theirs chan struct{}, key string) func(ctx context.Context, cands []*datalayer.Candidate) error {
		return func(ctx context.Context, cands []*datalayer.Candidate) error {
			close(mine)
			select {
			case <-theirs:
			case <-ctx.Done():
				return ctx.Err()
			}
			for _, c := range cands {
				c.Put(key, 1)
			}
			return nil
		}
	}
	g, err := BuildGraph([]plugin.Plugin{
		&keyProducer{name: "a", produces: produces("A"), produce: meet(aStarted, bStarted, "A")},
		&keyProducer{name: "b", produces: produces("B"), produce: meet(bStarted, aStarted, "B")},
	})
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(2)
	if err := g.Run(t.Context(), 30*time.Second, &request.Request{}, cands); err != nil {
		t.Fatalf("independent producers did not overlap: %v", err)
	}
	for _, c := range cands {
		if _, ok := c.Get("A"); !ok {
			t.Fatal("A not published")
		}
		if _, ok := c.Get("B"); !ok {
			t.Fatal("B not published")
		}
	}
}

func TestGraphSlowProducerPublishesNothing(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	slowStarted, slowReturned := make(chan struct{}), make(chan struct{})
	// slow ignores its context, as a badly written producer would: it
	// writes some, blocks past the deadline, then writes more and returns.
	slow := &keyProducer{name: "slow", produces: produces("S"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		defer close(slowReturned)
		cands[0].Put("S", 1)
		close(slowStarted)
		<-release
		for _, c := range cands {
			c.Put("S", 2)
		}
		return nil
	}}
	fast := &keyProducer{name: "fast", produces: produces("F"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		for _, c := range cands {
			c.Put("F", 1)
		}
		return nil
	}}
	afterSlow := derive("after-slow", "T", func(in []int) int { return in[0] }, "S")
	reg := prometheus.NewRegistry()
	logs := &testkit.LogBuffer{}
	g, err := BuildGraph([]plugin.Plugin{slow, fast, afterSlow},
		WithRegisterer(reg), WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(2)
	// The deadline is the caller's: it ends the run once fast has published,
	// so the test does not depend on how quickly a loaded machine runs fast.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		<-slowStarted
		for ctx.Err() == nil {
			_, ok0 := cands[0].Get("F")
			_, ok1 := cands[1].Get("F")
			if ok0 && ok1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	err = g.Run(ctx, time.Minute, &request.Request{ID: "req-7"}, cands)
	if !errors.Is(err, ErrProducerTimeout) || !strings.Contains(err.Error(), "slow/test-producer") {
		t.Fatalf("Run error = %v, want slow's timeout", err)
	}
	close(release)
	<-slowReturned
	for i, c := range cands {
		if _, ok := c.Get("F"); !ok {
			t.Errorf("candidate %d: the fast producer's data is missing", i)
		}
		if v, ok := c.Get("S"); ok {
			t.Errorf("candidate %d: the timed-out producer published %v", i, v)
		}
		if v, ok := c.Get("T"); ok {
			t.Errorf("candidate %d: the producer after the timed-out one published %v", i, v)
		}
	}
	if got := testutil.ToFloat64(g.errors.WithLabelValues("slow/test-producer", "timeout")); got != 1 {
		t.Errorf("timeouts counted for slow = %v, want 1", got)
	}
	if got := testutil.ToFloat64(g.errors.WithLabelValues("fast/test-producer", "timeout")); got != 0 {
		t.Errorf("timeouts counted for fast = %v, want 0", got)
	}
	if l := logs.String(); !strings.Contains(l, "plugin=slow/test-producer") || !strings.Contains(l, "request=req-7") {
		t.Errorf("log does not name the slow producer and request: %s", l)
	}
}

func TestGraphFailingProducerDoesNotStopOthers(t *testing.T) {
	t.Parallel()
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			t.Parallel()
			testFailingProducerDoesNotStopOthers(t, inline)
		})
	}
}

// maybeInline is p, asking to run on Run's goroutine when inline is set.
func maybeInline(p *keyProducer, inline bool) plugin.Plugin {
	if inline {
		return inlineProducer{p}
	}
	return p
}

func testFailingProducerDoesNotStopOthers(t *testing.T, inline bool) {
	boom := errors.New("tokenizer unavailable")
	failing := &keyProducer{name: "failing", produces: produces("X"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		cands[0].Put("X", 1) // written before failing: must not be published
		return boom
	}}
	// Dependents of a failed producer still run, and see its data missing.
	var sawX sync.Map
	dependent := &keyProducer{name: "dependent", produces: produces("Y"), consumes: produces("X"),
		produce: func(_ context.Context, cands []*datalayer.Candidate) error {
			for _, c := range cands {
				_, ok := c.Get("X")
				sawX.Store(c.Name, ok)
				c.Put("Y", 1)
			}
			return nil
		}}
	sneaky := &keyProducer{name: "sneaky", produces: produces("Z"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		for _, c := range cands {
			c.Put("Z", 1)
			c.Put("undeclared", 1)
		}
		return nil
	}}
	g, err := BuildGraph([]plugin.Plugin{maybeInline(failing, inline), maybeInline(dependent, inline), maybeInline(sneaky, inline)},
		WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(2)
	err = g.Run(t.Context(), 10*time.Second, &request.Request{}, cands)
	if !errors.Is(err, boom) || !strings.Contains(err.Error(), "failing/test-producer") {
		t.Fatalf("Run error = %v, want failing's error", err)
	}
	for _, c := range cands {
		if _, ok := c.Get("X"); ok {
			t.Errorf("%s: the failed producer published X", c.Name)
		}
		if saw, _ := sawX.Load(c.Name); saw != false {
			t.Errorf("%s: the dependent saw X", c.Name)
		}
		if _, ok := c.Get("Y"); !ok {
			t.Errorf("%s: the dependent's Y is missing", c.Name)
		}
		if _, ok := c.Get("undeclared"); ok {
			t.Errorf("%s: an undeclared key was published", c.Name)
		}
	}
	if got := testutil.ToFloat64(g.errors.WithLabelValues("failing/test-producer", "error")); got != 1 {
		t.Errorf("errors counted = %v, want 1", got)
	}
}

func TestGraphRunHonoursTheCallersContext(t *testing.T) {
	t.Parallel()
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			t.Parallel()
			started := make(chan struct{})
			g, err := BuildGraph([]plugin.Plugin{maybeInline(&keyProducer{name: "waits", produces: produces("W"),
				produce: func(ctx context.Context, _ []*datalayer.Candidate) error {
					close(started)
					<-ctx.Done()
					return ctx.Err()
				}}, inline)}, WithLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			go func() { <-started; cancel() }()
			err = g.Run(ctx, time.Hour, &request.Request{}, testCandidates(1))
			if !errors.Is(err, ErrProducerTimeout) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Run error = %v, want a cancelled producer", err)
			}
		})
	}
}

// BenchmarkGraphRun is one Run's own cost over 64 candidates: a diamond
// of three producers each putting one key per candidate, on goroutines of
// their own or all inline (the default configuration's kind), with the
// candidates made anew for each run as a request's are.
func BenchmarkGraphRun(b *testing.B) {
	for _, inline := range []bool{false, true} {
		b.Run(fmt.Sprintf("inline=%v", inline), func(b *testing.B) {
			top := &keyProducer{name: "top", produces: produces("A"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
				for _, c := range cands {
					c.Put("A", 1)
				}
				return nil
			}}
			g, err := BuildGraph([]plugin.Plugin{
				maybeInline(derive("left", "B", func(in []int) int { return in[0] + 1 }, "A"), inline),
				maybeInline(derive("right", "C", func(in []int) int { return in[0] + 2 }, "A"), inline),
				maybeInline(top, inline),
			})
			if err != nil {
				b.Fatal(err)
			}
			req := &request.Request{}
			base := testCandidates(64)
			slab := make([]datalayer.Candidate, len(base))
			cands := make([]*datalayer.Candidate, len(base))
			b.ReportAllocs()
			cpu := testkit.CPUTime()
			for b.Loop() {
				for i, c := range base {
					slab[i] = datalayer.Candidate{Endpoint: c.Endpoint, Metrics: c.Metrics, Stream: c.Stream}
					cands[i] = &slab[i]
				}
				if err := g.Run(context.Background(), time.Second, req, cands); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/request")
			b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/request")
		})
	}
}

func TestGraphPublishesOnlyDeclaredKeysHoweverManyAreStaged(t *testing.T) {
	t.Parallel()
	for _, inline := range []bool{false, true} {
		t.Run(fmt.Sprintf("inline=%v", inline), func(t *testing.T) {
			t.Parallel()
			testPublishesOnlyDeclaredKeys(t, inline)
		})
	}
}

func testPublishesOnlyDeclaredKeys(t *testing.T, inline bool) {
	// More keys than a candidate keeps inline, declared and not, from two
	// producers, the second reading the first's through its staging view.
	first := &keyProducer{name: "first", produces: produces("A", "B", "C", "D"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		for i, c := range cands {
			for k, key := range []string{"A", "B", "undeclared", "C", "D"} {
				c.Put(key, i*10+k)
			}
		}
		return nil
	}}
	second := derive("second", "E", func(in []int) int { return in[0] + in[1] }, "A", "D")
	// A third overwrites a key the first published, without declaring
	// it, and reorders its slice: neither reaches the request.
	third := &keyProducer{name: "third", produces: produces("F"), consumes: produces("A"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		for _, c := range cands {
			c.Put("A", -1)
			c.Put("F", 7)
			c.Put("F", 8)
		}
		slices.Reverse(cands)
		return nil
	}}
	g, err := BuildGraph([]plugin.Plugin{maybeInline(second, inline), maybeInline(first, inline), maybeInline(third, inline)})
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(5)
	order := slices.Clone(cands)
	if err := g.Run(context.Background(), time.Second, &request.Request{}, cands); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cands, order) {
		t.Error("a producer reordered the request's candidates")
	}
	for i, c := range cands {
		for key, want := range map[string]int{"A": i * 10, "B": i*10 + 1, "C": i*10 + 3, "D": i*10 + 4, "E": 2*i*10 + 4, "F": 8} {
			if got, ok := getInt(c, key); !ok || got != want {
				t.Errorf("candidate %d: %s = %d, %v; want %d", i, key, got, ok, want)
			}
		}
		if v, ok := c.Get("undeclared"); ok {
			t.Errorf("candidate %d: an undeclared key was published (%v)", i, v)
		}
	}
}

func ep(name, addr string) *datalayer.Endpoint {
	return &datalayer.Endpoint{Name: name, Address: addr, Pod: name, Model: "m"}
}

// inlineProducer is a keyProducer that asks to run on Run's goroutine.
type inlineProducer struct{ *keyProducer }

func (inlineProducer) ProducesInline() bool { return true }

// runOnce builds a graph of plugins and runs it once over n candidates.
func runOnce(t *testing.T, plugins []plugin.Plugin, n int) []*datalayer.Candidate {
	t.Helper()
	g, err := BuildGraph(plugins)
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(n)
	if err := g.Run(t.Context(), 10*time.Second, &request.Request{ID: "r1"}, cands); err != nil {
		t.Fatal(err)
	}
	return cands
}

// onRunsGoroutine reports whether the caller has Graph.Run on its stack.
func onRunsGoroutine() bool {
	pcs := make([]uintptr, 64)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(1, pcs)])
	for {
		f, more := frames.Next()
		if strings.HasSuffix(f.Function, "prepare.(*Graph).Run") {
			return true
		}
		if !more {
			return false
		}
	}
}

func TestGraphRunsInlineProducersOnTheCallersGoroutineInDependencyOrder(t *testing.T) {
	t.Parallel()
	// inline top → goroutine middle → inline bottom: each sees the one before.
	var topInline, middleInline, bottomInline atomic.Bool
	top := &keyProducer{name: "top", produces: produces("A"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		topInline.Store(onRunsGoroutine())
		for i, c := range cands {
			c.Put("A", i+1)
		}
		return nil
	}}
	middle := derive("middle", "B", func(in []int) int { middleInline.Store(onRunsGoroutine()); return in[0] * 10 }, "A")
	bottom := derive("bottom", "C", func(in []int) int { bottomInline.Store(onRunsGoroutine()); return in[0] + 1 }, "B")
	cands := runOnce(t, []plugin.Plugin{inlineProducer{bottom}, middle, inlineProducer{top}, &keyScorer{name: "s", consumes: produces("C")}}, 3)
	for i, c := range cands {
		if got, _ := getInt(c, "C"); got != (i+1)*10+1 {
			t.Errorf("candidate %d: C = %d, want %d", i, got, (i+1)*10+1)
		}
	}
	if !topInline.Load() || !bottomInline.Load() || middleInline.Load() {
		t.Errorf("on Run's goroutine: top %v, middle %v, bottom %v; want true, false, true",
			topInline.Load(), middleInline.Load(), bottomInline.Load())
	}
}

func TestGraphInlineProducerPastTheDeadlinePublishesNothing(t *testing.T) {
	t.Parallel()
	slow := &keyProducer{name: "slow", produces: produces("A"), produce: func(ctx context.Context, cands []*datalayer.Candidate) error {
		for _, c := range cands {
			c.Put("A", 1)
		}
		<-ctx.Done() // still running at the deadline, then returning nil
		return nil
	}}
	g, err := BuildGraph([]plugin.Plugin{inlineProducer{slow}, &keyScorer{name: "s", consumes: produces("A")}})
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(2)
	err = g.Run(t.Context(), 10*time.Millisecond, &request.Request{ID: "r1"}, cands)
	if !errors.Is(err, ErrProducerTimeout) {
		t.Errorf("Run = %v, want ErrProducerTimeout", err)
	}
	for i, c := range cands {
		if _, ok := c.Get("A"); ok {
			t.Errorf("candidate %d has A from a producer that missed its deadline", i)
		}
	}
}

func TestGraphReusedStagingCarriesNothingIntoTheNextRun(t *testing.T) {
	t.Parallel()
	var put atomic.Bool
	put.Store(true)
	p := &keyProducer{name: "p", produces: produces("A"), produce: func(_ context.Context, cands []*datalayer.Candidate) error {
		if put.Load() {
			for _, c := range cands {
				c.Put("A", 1)
			}
		}
		return nil
	}}
	g, err := BuildGraph([]plugin.Plugin{inlineProducer{p}, &keyScorer{name: "s", consumes: produces("A")}})
	if err != nil {
		t.Fatal(err)
	}
	for run := range 20 {
		put.Store(run%2 == 0)
		cands := testCandidates(4)
		if err := g.Run(t.Context(), 10*time.Second, &request.Request{ID: "r"}, cands); err != nil {
			t.Fatal(err)
		}
		for i, c := range cands {
			if _, ok := c.Get("A"); ok != (run%2 == 0) {
				t.Fatalf("run %d, candidate %d: has A %v, want %v", run, i, ok, run%2 == 0)
			}
		}
	}
}
