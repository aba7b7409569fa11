package director_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// recorder is a ResponseObserver that keeps what it heard.
type recorder struct {
	mu   sync.Mutex
	seen []*request.Response
	reqs []*request.Request
}

func (r *recorder) TypedName() plugin.TypedName { return plugin.TypedName{Type: "recorder", Name: "r"} }
func (r *recorder) ObserveResponse(_ context.Context, req *request.Request, resp *request.Response) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen, r.reqs = append(r.seen, resp), append(r.reqs, req)
}

// randomScheduler picks at random.
func randomScheduler(t testing.TB) *scheduling.Scheduler {
	t.Helper()
	l, err := config.NewInTreeRegistry().Load([]byte("plugins:\n- type: random-picker\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduling.New(l.SchedulerOptions())
	if err != nil {
		t.Fatal(err)
	}
	return sched
}

// newDirector is a director over two endpoints with a random picker (no
// producers: nothing here needs the index), timed by a clock the test
// moves.
func newDirector(t testing.TB, objs *datalayer.Objectives, obs ...plugin.ResponseObserver) (*director.Director, *datalayer.Datastore, *time.Time) {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000", Model: "m"})
	for _, n := range []string{"a", "b"} {
		// Fresh and idle, so that a sheddable request is not shed; the
		// scheduler judges freshness by the wall clock.
		ds.SetMetrics(n, datalayer.Metrics{UpdateTime: time.Now().Add(time.Hour)})
	}
	sched := randomScheduler(t)
	now := time.Unix(1000, 0)
	d, err := director.New(director.Options{Datastore: ds, Scheduler: sched, InFlight: ds, Outliers: ds, Objectives: objs, PluginObservers: obs,
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return d, ds, &now
}

func TestARequestsObjectiveAndSLOHeadersSetItsPriorityAndSLO(t *testing.T) {
	t.Parallel()
	objs := datalayer.NewObjectives(nil)
	objs.Set(datalayer.Objective{Name: "batch", Priority: -2, TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond})
	d, _, _ := newDirector(t, objs)
	tests := []struct {
		name     string
		headers  map[string]string
		priority int
		slo      request.SLO
		status   int
	}{
		{"no objective and no header: priority 0 and no SLO", nil, 0, request.SLO{}, 0},
		{"an unknown objective means priority 0", map[string]string{"x-gateway-inference-objective": "nope"}, 0, request.SLO{}, 0},
		{"a known objective gives its priority and default SLOs", map[string]string{"x-gateway-inference-objective": "batch"},
			-2, request.SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond}, 0},
		{"a header overrides the objective's default", map[string]string{"x-gateway-inference-objective": "batch", "x-slo-ttft-ms": "250.5"},
			-2, request.SLO{TTFT: 250500 * time.Microsecond, TPOT: 100 * time.Millisecond}, 0},
		{"headers alone set SLOs", map[string]string{"x-slo-ttft-ms": "300", "x-slo-tpot-ms": " 20 "},
			0, request.SLO{TTFT: 300 * time.Millisecond, TPOT: 20 * time.Millisecond}, 0},
		{"a header that is not a number is refused", map[string]string{"x-slo-ttft-ms": "soon"}, 0, request.SLO{}, http.StatusBadRequest},
		{"a header that is not positive is refused", map[string]string{"x-slo-tpot-ms": "-5"}, 0, request.SLO{}, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := d.HandleRequest(context.Background(), &director.Input{
				Path: "/v1/completions", Headers: tt.headers, Body: []byte(`{"model":"m","prompt":"hello"}`),
			})
			if tt.status != 0 {
				if director.StatusOf(err) != tt.status {
					t.Fatalf("err = %v, want status %d", err, tt.status)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Request.Priority != tt.priority || p.Request.SLO != tt.slo {
				t.Errorf("priority %d, SLO %+v; want %d, %+v", p.Request.Priority, p.Request.SLO, tt.priority, tt.slo)
			}
		})
	}
}

// inFlightNow is f's requests in flight, without the engine work replayed
// over them and the recent prefill work, which outlasts them (both are
// checked in package datalayer).
func inFlightNow(f datalayer.InFlight) datalayer.InFlight {
	f.Ahead, f.ReplayedAt = enginesched.Ahead{}, 0
	f.RecentPrefill, f.RecentPrefillAt = 0, 0
	f.RecentEnds, f.RecentEndsAt = 0, 0
	f.Ended = [datalayer.EndedKept]int64{}
	f.StepStart = 0
	return f
}

func TestAPickIsInFlightUntilItsResponseEndsAndObserversHearOfIt(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d, ds, now := newDirector(t, nil, rec)
	ids := make([]uint32, 64)
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":` + jsonIDs(ids) + `,"stream":true,"max_tokens":9}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	name := p.Result.Targets()[0].Name
	if got := inFlightNow(ds.InFlight(name)); got != (datalayer.InFlight{Prefilling: 1, PrefillTokens: 64, OldestPrefill: now.UnixNano()}) {
		t.Fatalf("after the pick: %+v, want one request prefilling its 64 tokens", got)
	}
	start := *now
	*now = start.Add(40 * time.Millisecond)
	d.HandleFirstByte(p)
	if got := inFlightNow(ds.InFlight(name)); got != (datalayer.InFlight{Decoding: 1, DecodeTokens: 64}) {
		t.Fatalf("after the first byte: %+v, want one request decoding", got)
	}
	d.HandleResponse(p, director.Served{
		Endpoint: p.Targets[0], Status: 200, Streamed: true,
		FirstByte: start.Add(40 * time.Millisecond), End: start.Add(120 * time.Millisecond),
		Usage: openai.Usage{PromptTokens: 64, CompletionTokens: 9},
	})
	if got := inFlightNow(ds.InFlight(name)); got != (datalayer.InFlight{}) {
		t.Errorf("after the end: %+v, want nothing in flight", got)
	}
	if f := ds.InFlight(name); f.RecentEnds != 1 || f.RecentEndsAt != start.Add(120*time.Millisecond).UnixNano() ||
		f.Ended != [datalayer.EndedKept]int64{start.Add(120 * time.Millisecond).UnixNano()} {
		t.Errorf("recent ends %v at %v, ended %v; want the one response, at its end", f.RecentEnds, f.RecentEndsAt, f.Ended)
	}
	if len(rec.seen) != 1 {
		t.Fatalf("observers heard %d responses, want 1", len(rec.seen))
	}
	r := rec.seen[0]
	ttft, ok1 := r.TTFT()
	tpot, ok2 := r.TPOT()
	if !ok1 || ttft != 40*time.Millisecond || !ok2 || tpot != 10*time.Millisecond {
		t.Errorf("TTFT %v (%v), TPOT %v (%v); want 40ms and 10ms", ttft, ok1, tpot, ok2)
	}
	if r.Picked == nil || rec.reqs[0].MaxTokens != 9 {
		t.Errorf("the observer got no picked candidate or lost the request's max_tokens: %+v", rec.reqs[0])
	}
}

func TestAResponseThatEndsBeforeItsFirstByteLeavesNothingInFlight(t *testing.T) {
	t.Parallel()
	d, ds, _ := newDirector(t, nil)
	p, err := d.HandleRequest(context.Background(), &director.Input{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":"x"}`)})
	if err != nil {
		t.Fatal(err)
	}
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 499})
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 499})
	for _, n := range []string{"a", "b"} {
		if got := inFlightNow(ds.InFlight(n)); got != (datalayer.InFlight{}) {
			t.Errorf("%s: %+v in flight", n, got)
		}
	}
	var e *director.Error
	_, err = d.HandleRequest(context.Background(), &director.Input{Path: "/v1/completions", Body: []byte(`{`)})
	if !errors.As(err, &e) || e.Status != http.StatusBadRequest {
		t.Errorf("a broken body: %v", err)
	}
}

func jsonIDs(ids []uint32) string {
	b := []byte{'['}
	for i := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '1')
	}
	return string(append(b, ']'))
}

// idleProducer publishes nothing; inline says whether it runs on the
// request's goroutine.
type idleProducer struct{ inline bool }

func (p *idleProducer) TypedName() plugin.TypedName {
	return plugin.TypedName{Type: "idle-producer", Name: "p"}
}

var _ prepare.DataProducer = (*idleProducer)(nil)

func (p *idleProducer) Produces() map[string]any { return map[string]any{"Idle": 0} }
func (p *idleProducer) Consumes() map[string]any { return nil }
func (p *idleProducer) Produce(context.Context, *request.Request, []*datalayer.Candidate) error {
	return nil
}
func (p *idleProducer) ProducesInline() bool { return p.inline }

func TestAPickSaysWhetherItsRequestCanOutliveItsResponse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		graph    []plugin.Plugin
		wantHeld bool
	}{
		{"no producers", nil, false},
		{"a producer on the request's goroutine", []plugin.Plugin{&idleProducer{inline: true}}, false},
		{"a producer on a goroutine of its own", []plugin.Plugin{&idleProducer{inline: false}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, ds, _ := newDirector(t, nil)
			var g *prepare.Graph
			if tt.graph != nil {
				var err error
				if g, err = prepare.BuildGraph(tt.graph); err != nil {
					t.Fatal(err)
				}
			}
			d, err := director.New(director.Options{Datastore: ds, Scheduler: randomScheduler(t), InFlight: ds, PrepareData: g})
			if err != nil {
				t.Fatal(err)
			}
			// Two buffers: one the ids fit in, one they outgrow.
			for _, capacity := range []int{8, 2} {
				buf := make([]uint32, 0, capacity)
				in := &director.Input{Path: "/v1/completions", Headers: map[string]string{},
					Body: []byte(`{"model":"m","prompt":[1,2,3]}`), IDBuf: buf}
				p, err := d.HandleRequest(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				if got := p.HeldAfterResponse(); got != tt.wantHeld {
					t.Errorf("HeldAfterResponse() = %v, want %v", got, tt.wantHeld)
				}
				ids := p.Request.TokenIDs
				if len(ids) != 3 || cap(in.IDBuf) < 3 || &in.IDBuf[:1][0] != &ids[0] {
					t.Errorf("buffer of %d: the ids %v are not in the memory IDBuf hands back (cap %d)", capacity, ids, cap(in.IDBuf))
				}
				if fits := &ids[0] == &buf[:1][0]; fits != (capacity >= 3) {
					t.Errorf("buffer of %d: ids read into it: %v", capacity, fits)
				}
				d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200})
			}
		})
	}
}

// lastPicker is a scheduler of the test's own: it picks the last
// candidate, or fails with err.
type lastPicker struct{ err error }

func (s lastPicker) Schedule(_ context.Context, _ *request.Request, cands []*datalayer.Candidate) (*framework.Result, error) {
	if s.err != nil {
		return nil, s.err
	}
	var picked []*datalayer.Candidate
	if len(cands) > 0 && cands[0].Endpoint.Model != "nobody" {
		picked = cands[len(cands)-1:]
	}
	return &framework.Result{PrimaryProfile: "p", Profiles: map[string]*framework.ProfileResult{"p": {Picked: picked}}}, nil
}

func TestADirectorAssembledFromOtherPartsAnswersAsItsSchedulerSays(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		sched  lastPicker
		model  string
		status int
	}{
		{"its pick is the request's target", lastPicker{}, "m", 0},
		{"a shed request is refused with 429", lastPicker{fmt.Errorf("admitter: %w", scheduling.ErrShed)}, "m", http.StatusTooManyRequests},
		{"no candidate left is 503", lastPicker{fmt.Errorf("filters: %w", scheduling.ErrNoCandidates)}, "m", http.StatusServiceUnavailable},
		{"another failure is 500", lastPicker{errors.New("broken")}, "m", http.StatusInternalServerError},
		{"a result that picks nobody is 503", lastPicker{}, "nobody", http.StatusServiceUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ds := datalayer.NewDatastore(nil)
			ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: tt.model})
			ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000", Model: tt.model})
			d, err := director.New(director.Options{Datastore: ds, Scheduler: tt.sched, InFlight: ds})
			if err != nil {
				t.Fatal(err)
			}
			p, err := d.HandleRequest(context.Background(), &director.Input{
				Path: "/v1/completions", Body: []byte(`{"model":"` + tt.model + `","prompt":[1,2,3,4]}`),
			})
			if tt.status != 0 {
				if got := director.StatusOf(err); got != tt.status {
					t.Fatalf("err = %v (status %d), want status %d", err, got, tt.status)
				}
				for _, n := range []string{"a", "b"} {
					if got := inFlightNow(ds.InFlight(n)); got != (datalayer.InFlight{}) {
						t.Errorf("%s: %+v in flight after a refusal", n, got)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Targets) != 1 || p.Targets[0] != "10.0.0.2:8000" {
				t.Errorf("targets %v, want the scheduler's pick, 10.0.0.2:8000", p.Targets)
			}
			if got := inFlightNow(ds.InFlight("b")); got.Prefilling != 1 || got.PrefillTokens != 4 {
				t.Errorf("b's in-flight work %+v, want the request's 4 tokens prefilling", got)
			}
			d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200})
			if got := inFlightNow(ds.InFlight("b")); got != (datalayer.InFlight{}) {
				t.Errorf("after the response: %+v in flight", got)
			}
		})
	}
}

func TestADirectorNeedsEachOfItsRequiredParts(t *testing.T) {
	t.Parallel()
	ds := datalayer.NewDatastore(nil)
	for _, tt := range []struct {
		name string
		o    director.Options
	}{
		{"no datastore", director.Options{Scheduler: lastPicker{}, InFlight: ds}},
		{"no scheduler", director.Options{Datastore: ds, InFlight: ds}},
		{"no in-flight accounting", director.Options{Datastore: ds, Scheduler: lastPicker{}}},
	} {
		if _, err := director.New(tt.o); err == nil {
			t.Errorf("%s: New succeeded", tt.name)
		}
	}
}

// splitPicker is a scheduler of the test's own that splits every request:
// decode on the last candidate, prefill on the first, encode on both.
type splitPicker struct{}

func (splitPicker) Schedule(_ context.Context, _ *request.Request, cands []*datalayer.Candidate) (*framework.Result, error) {
	return &framework.Result{
		PrimaryProfile: "decode", PrefillProfile: "prefill", EncodeProfile: "encode",
		Decision: framework.EncodePrefillDecode,
		Profiles: map[string]*framework.ProfileResult{
			"decode":  {Picked: cands[len(cands)-1:]},
			"prefill": {Picked: cands[:1]},
			"encode":  {Picked: cands},
		},
	}, nil
}

func TestASplitPickNamesTheDecodeTargetAndThePodsThatPrefillAndEncode(t *testing.T) {
	t.Parallel()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	ds.Upsert(&datalayer.Endpoint{Name: "b", Address: "10.0.0.2:8000", Model: "m"})
	d, err := director.New(director.Options{Datastore: ds, Scheduler: splitPicker{}, InFlight: ds})
	if err != nil {
		t.Fatal(err)
	}
	p, err := d.HandleRequest(context.Background(), &director.Input{
		Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":[1,2,3,4]}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Targets) != 1 || p.Targets[0] != "10.0.0.2:8000" || p.Prefill != "10.0.0.1:8000" ||
		len(p.Encoders) != 2 || p.Encoders[0] != "10.0.0.1:8000" || p.Encoders[1] != "10.0.0.2:8000" {
		t.Errorf("targets %v, prefill %q, encoders %v; want decode on b, prefill on a, encode on both", p.Targets, p.Prefill, p.Encoders)
	}
	d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200})
}

func TestASplitWithoutAPrefillPodIsRefusedWith503SayingWhy(t *testing.T) {
	t.Parallel()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "d", Address: "10.0.0.1:8000", Model: "m", Labels: map[string]string{datalayer.RoleLabel: "decode"}})
	l, err := config.NewInTreeRegistry().Load([]byte(`
plugins:
- type: decode-filter
- type: prefill-filter
- type: always-disagg-pd-decider
- {type: disagg-profile-handler, parameters: {deciders: {prefill: always-disagg-pd-decider}, fallback: refuse}}
schedulingProfiles:
- {name: decode, plugins: [{pluginRef: decode-filter}]}
- {name: prefill, plugins: [{pluginRef: prefill-filter}]}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	sched, err := scheduling.New(l.SchedulerOptions())
	if err != nil {
		t.Fatal(err)
	}
	d, err := director.New(director.Options{Datastore: ds, Scheduler: sched, InFlight: ds})
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.HandleRequest(context.Background(), &director.Input{Path: "/v1/completions", Body: []byte(`{"model":"m","prompt":[1,2,3,4]}`)})
	if director.StatusOf(err) != http.StatusServiceUnavailable || !strings.Contains(err.Error(), "no prefill pod is ready") {
		t.Fatalf("err = %v (status %d), want 503 saying no prefill pod is ready", err, director.StatusOf(err))
	}
	if got := inFlightNow(ds.InFlight("d")); got != (datalayer.InFlight{}) {
		t.Errorf("%+v in flight on the decode pod after the refusal", got)
	}
}

// countingTokenizer tokenizes every request as one token and counts calls.
type countingTokenizer struct{ calls atomic.Int64 }

func (c *countingTokenizer) Tokenize(context.Context, *request.Request) ([]uint32, error) {
	c.calls.Add(1)
	return []uint32{1}, nil
}

func TestAPreviousResponseIsRoutedApproximatelyAndCounted(t *testing.T) {
	t.Parallel()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	ds.SetMetrics("a", datalayer.Metrics{UpdateTime: time.Now().Add(time.Hour)})
	reg := prometheus.NewRegistry()
	tok := &countingTokenizer{}
	d, err := director.New(director.Options{Datastore: ds, Scheduler: randomScheduler(t), InFlight: ds,
		Metrics: director.NewMetrics(reg), Tokenizer: tok})
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []string{
		`{"model":"m","previous_response_id":"resp_1","input":"and then?"}`,
		`{"model":"m","input":"a conversation of its own"}`,
	} {
		if _, err := d.HandleRequest(context.Background(), &director.Input{Path: "/v1/responses", Headers: map[string]string{}, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := tok.calls.Load(); n != 1 {
		t.Fatalf("tokenized %d requests; want only the one whose prompt is known in full", n)
	}
	want := `
# HELP kvroute_inexact_prefix_requests_total Requests whose prompt the model server completes from state the EPP cannot see (a Responses request's previous_response_id), by API and reason; they were routed with approximate prefix answers.
# TYPE kvroute_inexact_prefix_requests_total counter
kvroute_inexact_prefix_requests_total{api="responses",reason="previous_response_id"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_inexact_prefix_requests_total"); err != nil {
		t.Fatal(err)
	}
}

func TestARequestThatNamesNoModelGoesToThePoolsModel(t *testing.T) {
	t.Parallel()
	d, _, _ := newDirector(t, nil)
	for _, tc := range []struct{ path, body string }{
		{"/inference/v1/generate", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":4}}`},
		{"/v1/embeddings", `{"input":"some text"}`},
	} {
		p, err := d.HandleRequest(context.Background(), &director.Input{Path: tc.path, Headers: map[string]string{}, Body: []byte(tc.body)})
		if err != nil || p.Request.Model != "m" {
			t.Fatalf("%s: %v; want it routed as model m", tc.path, err)
		}
	}
}
