package director_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// loadPredictor stands in for the latency producer with a rule the test
// can read: 10s of prefill alone, and 10s more per request the EPP has in
// flight on the endpoint (its in-flight accounting, as the real producer
// reads it). Seconds, so that a refusal's timer, which runs on the wall
// clock, cannot fire however slow the machine.
type loadPredictor struct{}

func (loadPredictor) AllInline() bool { return true }

func (loadPredictor) Run(_ context.Context, _ time.Duration, _ *request.Request, cands []*datalayer.Candidate) error {
	for _, c := range cands {
		ahead := c.InFlight.Prefilling + c.InFlight.Decoding
		c.Put(datalayer.LatencyPredictionInfoKey, &datalayer.LatencyPredictionInfo{
			TTFTValid: true, TTFT: float64(10000 * (1 + ahead)), TTFTAlone: 10000})
	}
	return nil
}

// flowDirector is a director over one endpoint, with flow control when
// cfg is set.
func flowDirector(t testing.TB, cfg *flowcontrol.Config) (*director.Director, *flowcontrol.Controller) {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	ds.SetMetrics("a", datalayer.Metrics{UpdateTime: time.Now().Add(time.Hour)})
	// A clock that stands still: a request's wait adds nothing to its
	// predicted TTFT, however slow the machine.
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	o := director.Options{Datastore: ds, Scheduler: randomScheduler(t), InFlight: ds, PrepareData: loadPredictor{},
		FlowGate: flowcontrol.Gate{ByPrediction: true}, Now: clock}
	var fc *flowcontrol.Controller
	if cfg != nil {
		var err error
		if fc, err = flowcontrol.New(*cfg, clock, nil); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { fc.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		o.FlowControl = fc
	}
	d, err := director.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return d, fc
}

func sloRequest(slo string) *director.Input {
	h := map[string]string{flowcontrol.HeaderFairnessID: "tenant"}
	if slo != "" {
		h[director.HeaderSLOTTFT] = slo
	}
	return &director.Input{Path: "/v1/completions", Headers: h, Body: []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":4}`)}
}

// Requests go while the endpoint is predicted to serve them within their
// SLO (or, without one, within the band's target), wait while it is not,
// are released when a response ends and the prediction comes back under
// their SLO, and are refused at once when even an idle endpoint could not
// meet it.
func TestFlowControlReleasesByPrediction(t *testing.T) {
	t.Parallel()
	d, fc := flowDirector(t, &flowcontrol.Config{DefaultBand: flowcontrol.Band{TTFTTarget: 15 * time.Second}})
	ctx := context.Background()

	first, err := d.HandleRequest(ctx, sloRequest("")) // 10s predicted, target 15s
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.HandleRequest(ctx, sloRequest("25000")); err != nil { // 20s predicted
		t.Fatal(err)
	}
	// 30s predicted, over the band's target: it waits, until its
	// client goes away.
	cctx, leave := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := d.HandleRequest(cctx, sloRequest("")); errc <- err }()
	testkit.WaitFor(t, "the request over the target queued", func() error {
		if n := fc.Len(); n != 1 {
			return fmt.Errorf("%d waiting", n)
		}
		return nil
	})
	leave()
	if err := <-errc; !errors.Is(err, flowcontrol.ErrCancelled) {
		t.Fatalf("a queued request whose client left: %v", err)
	}

	_, err = d.HandleRequest(ctx, sloRequest("5000"))
	if !errors.Is(err, flowcontrol.ErrSLOUnreachable) || director.StatusOf(err) != http.StatusServiceUnavailable {
		t.Fatalf("an SLO under the prefill alone: %v (status %d), want an early 503", err, director.StatusOf(err))
	}

	type result struct {
		p   *director.Pick
		err error
	}
	waiting := make(chan result, 1)
	go func() {
		p, err := d.HandleRequest(ctx, sloRequest("25000")) // 30s predicted: waits
		waiting <- result{p, err}
	}()
	testkit.WaitFor(t, "the third request queued", func() error {
		if n := fc.Len(); n != 1 {
			return fmt.Errorf("%d waiting", n)
		}
		return nil
	})
	fc.Kick()
	select {
	case r := <-waiting:
		t.Fatalf("released with nothing changed: %+v", r)
	default:
	}
	d.HandleResponse(first, director.Served{Endpoint: first.Targets[0], Status: 200, End: time.Unix(1000, 0)})
	r := <-waiting
	if r.err != nil {
		t.Fatal(r.err)
	}
	if fc.Len() != 0 {
		t.Fatal("still queued after its release")
	}
}

// The director's request path with flow control on and nothing waiting
// (the common case: each request checked and sent at once), against the
// same director without it, in the same run: the two alternate in blocks
// of 64 requests, so that a machine shared with other work slows both
// alike.
func BenchmarkFlowControlOverhead(b *testing.B) {
	plain, _ := flowDirector(b, nil)
	gated, _ := flowDirector(b, &flowcontrol.Config{})
	block := func(d *director.Director, n int) time.Duration {
		start := time.Now()
		for range n {
			p, err := d.HandleRequest(context.Background(), sloRequest(""))
			if err != nil {
				b.Fatal(err)
			}
			d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200, End: p.Start})
		}
		return time.Since(start)
	}
	block(plain, 256) // warm both before either is timed
	block(gated, 256)
	b.ResetTimer()
	var base, with time.Duration
	for done := 0; done < b.N; done += 64 {
		n := min(64, b.N-done)
		base += block(plain, n)
		with += block(gated, n)
	}
	b.ReportMetric(float64(base.Nanoseconds())/float64(b.N), "plain-ns/req")
	b.ReportMetric(float64(with.Nanoseconds())/float64(b.N), "flowcontrol-ns/req")
	b.ReportMetric(float64(with)/float64(base), "ratio")
}

// heldDirector is a director over one endpoint whose load (loadPredictor)
// holds every request after the first in flow control until a response
// ends, on a clock the test moves (nanoseconds since the epoch), telling
// observers each response.
func heldDirector(t *testing.T, observers ...plugin.ResponseObserver) (*director.Director, *flowcontrol.Controller, *atomic.Int64, context.Context) {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "m"})
	clock := &atomic.Int64{}
	clock.Store(time.Unix(1000, 0).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	fc, err := flowcontrol.New(flowcontrol.Config{DefaultBand: flowcontrol.Band{TTFTTarget: 15 * time.Second}}, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	d, err := director.New(director.Options{Datastore: ds, Scheduler: randomScheduler(t), InFlight: ds, PrepareData: loadPredictor{},
		FlowControl: fc, FlowGate: flowcontrol.Gate{ByPrediction: true}, PluginObservers: observers, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	return d, fc, clock, ctx
}

// A request held in flow control is scheduled, and its latency learned,
// from its release: the time it queued is the EPP's, and a predictor that
// counted it as the endpoint's would predict every endpoint slower the
// longer requests wait, and hold them longer still.
func TestAHeldRequestIsTimedFromItsRelease(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	d, fc, clock, ctx := heldDirector(t, rec)
	now := func() time.Time { return time.Unix(0, clock.Load()) }

	first, err := d.HandleRequest(ctx, sloRequest("")) // 10s predicted: goes at once
	if err != nil {
		t.Fatal(err)
	}
	if !first.Released.IsZero() {
		t.Fatalf("a request that went at once has a release time %v", first.Released)
	}
	picks := make(chan *director.Pick, 1)
	go func() {
		p, err := d.HandleRequest(ctx, sloRequest("")) // 20s predicted: held
		if err != nil {
			t.Error(err)
		}
		picks <- p
	}()
	testkit.WaitFor(t, "the second request held", func() error {
		if n := fc.Len(); n != 1 {
			return fmt.Errorf("%d waiting", n)
		}
		return nil
	})
	clock.Add(int64(5 * time.Second))
	release := now()
	d.HandleResponse(first, director.Served{Endpoint: first.Targets[0], Status: 200, Streamed: true, FirstByte: release, End: release})
	second := <-picks
	if second == nil {
		t.FailNow()
	}
	if !second.Released.Equal(release) || !second.Request.Arrival.Equal(release) {
		t.Fatalf("released at %v, scheduled as arriving at %v; want both %v (it arrived at %v)",
			second.Released, second.Request.Arrival, release, second.Start)
	}
	clock.Add(int64(2 * time.Second))
	d.HandleResponse(second, director.Served{Endpoint: second.Targets[0], Status: 200, Streamed: true, FirstByte: now(), End: now()})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.seen) != 2 {
		t.Fatalf("%d responses observed, want 2", len(rec.seen))
	}
	if ttft, _ := rec.seen[1].TTFT(); ttft != 2*time.Second {
		t.Errorf("the held request's TTFT as learned: %v, want 2s (from its release, not its arrival 7s before)", ttft)
	}
	if ttft, _ := rec.seen[0].TTFT(); ttft != 5*time.Second {
		t.Errorf("the first request's TTFT as learned: %v, want 5s", ttft)
	}
}

// A release is checked against the dispatches before it: when a response
// frees room for one request, two waiting requests are not both released
// on the room it freed.
func TestReleasesSeeTheDispatchesBeforeThem(t *testing.T) {
	t.Parallel()
	d, fc, clock, ctx := heldDirector(t)
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	first, err := d.HandleRequest(ctx, sloRequest("")) // 10s predicted: goes
	if err != nil {
		t.Fatal(err)
	}
	picks := make(chan *director.Pick, 2)
	for range 2 {
		go func() {
			p, err := d.HandleRequest(ctx, sloRequest("")) // 20s predicted: held
			if err != nil {
				t.Error(err)
			}
			picks <- p
		}()
	}
	testkit.WaitFor(t, "two requests held", func() error {
		if n := fc.Len(); n != 2 {
			return fmt.Errorf("%d waiting", n)
		}
		return nil
	})
	// Both have waited, so each check reads the load anew.
	clock.Add(int64(time.Millisecond))
	d.HandleResponse(first, director.Served{Endpoint: first.Targets[0], Status: 200, End: now()})
	second := <-picks
	// Its dispatch kicked the controller, which checked the other
	// against it; a kick more changes nothing.
	fc.Kick()
	testkit.WaitFor(t, "the other request checked against the released one's dispatch", func() error {
		select {
		case p := <-picks:
			t.Fatalf("both released on the room one response freed: %v and %v", second.Targets, p.Targets)
		default:
		}
		if n := fc.Len(); n != 1 {
			return fmt.Errorf("%d waiting after one release, want 1", n)
		}
		return nil
	})
	d.HandleResponse(second, director.Served{Endpoint: second.Targets[0], Status: 200, End: now()})
	third := <-picks
	d.HandleResponse(third, director.Served{Endpoint: third.Targets[0], Status: 200, End: now()})
}
