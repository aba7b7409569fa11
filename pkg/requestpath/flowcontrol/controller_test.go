package flowcontrol_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// rig is a running controller whose releases the test opens: each check
// releases while slots remain, and records whom it released, in order.
type rig struct {
	c     *flowcontrol.Controller
	slots atomic.Int64
	mu    sync.Mutex
	order []string
	errs  sync.Map // name → error
	wg    sync.WaitGroup
}

func newRig(t *testing.T, cfg flowcontrol.Config) *rig {
	t.Helper()
	c, err := flowcontrol.New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return &rig{c: c}
}

func (r *rig) request(name, flow string, priority int) *flowcontrol.Request {
	return &flowcontrol.Request{FlowID: flow, Priority: priority, Bytes: 100, Check: func(time.Duration) flowcontrol.Verdict {
		if r.slots.Load() <= 0 {
			return flowcontrol.Verdict{}
		}
		r.slots.Add(-1)
		r.mu.Lock()
		r.order = append(r.order, name)
		r.mu.Unlock()
		return flowcontrol.Verdict{Release: true}
	}}
}

// start starts req's wait.
func (r *rig) start(ctx context.Context, name string, req *flowcontrol.Request) {
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		err := r.c.Wait(ctx, req)
		r.errs.Store(name, err)
		if err == nil {
			// Dispatched, as the director kicks after a dispatch.
			r.c.Kick()
		}
	}()
}

// enqueue starts req's wait and returns once it is queued.
func (r *rig) enqueue(t *testing.T, ctx context.Context, name string, req *flowcontrol.Request) {
	t.Helper()
	before := r.c.Len()
	r.start(ctx, name, req)
	testkit.WaitFor(t, name+" queued", func() error {
		if _, done := r.errs.Load(name); done {
			return nil
		}
		if n := r.c.Len(); n <= before {
			return fmt.Errorf("%d waiting, want more than %d", n, before)
		}
		return nil
	})
}

func (r *rig) release(t *testing.T, n int) {
	t.Helper()
	r.slots.Add(int64(n))
	r.c.Kick()
	r.wg.Wait()
}

func (r *rig) err(name string) error {
	v, ok := r.errs.Load(name)
	if !ok {
		return errors.New("still waiting")
	}
	if v == nil {
		return nil
	}
	return v.(error)
}

func TestReleaseOrder(t *testing.T) {
	t.Parallel()
	type arrival struct {
		name, flow string
		priority   int
		slo        time.Duration
	}
	for _, tc := range []struct {
		name     string
		band     flowcontrol.Band
		arrivals []arrival
		want     []string
	}{
		{"higher priority bands are served first, each in arrival order", flowcontrol.Band{},
			[]arrival{{"low1", "a", 0, 0}, {"high1", "a", 10, 0}, {"low2", "b", 0, 0}, {"high2", "b", 10, 0}, {"mid", "a", 5, 0}},
			[]string{"high1", "high2", "mid", "low1", "low2"}},
		{"global-strict with FCFS serves by arrival across flows", flowcontrol.Band{},
			[]arrival{{"a1", "a", 0, 0}, {"a2", "a", 0, 0}, {"a3", "a", 0, 0}, {"b1", "b", 0, 0}, {"c1", "c", 0, 0}},
			[]string{"a1", "a2", "a3", "b1", "c1"}},
		{"round-robin gives each flow its turn", flowcontrol.Band{Fairness: flowcontrol.RoundRobin},
			[]arrival{{"a1", "a", 0, 0}, {"a2", "a", 0, 0}, {"a3", "a", 0, 0}, {"b1", "b", 0, 0}, {"b2", "b", 0, 0}, {"c1", "c", 0, 0}},
			[]string{"a1", "b1", "c1", "a2", "b2", "a3"}},
		{"global-strict with EDF serves the earliest deadline across flows", flowcontrol.Band{Ordering: flowcontrol.EDF},
			[]arrival{{"a-late", "a", 0, time.Hour}, {"b-none", "b", 0, 0}, {"a-soon", "a", 0, time.Second}, {"c-mid", "c", 0, time.Minute}},
			[]string{"a-soon", "c-mid", "a-late", "b-none"}},
		{"round-robin with EDF takes each flow's earliest deadline in turn", flowcontrol.Band{Ordering: flowcontrol.EDF, Fairness: flowcontrol.RoundRobin},
			[]arrival{{"a-late", "a", 0, time.Hour}, {"a-soon", "a", 0, time.Second}, {"b-mid", "b", 0, time.Minute}},
			[]string{"a-soon", "b-mid", "a-late"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, flowcontrol.Config{DefaultBand: tc.band})
			for _, a := range tc.arrivals {
				req := r.request(a.name, a.flow, a.priority)
				req.SLO = a.slo
				r.enqueue(t, context.Background(), a.name, req)
			}
			r.release(t, len(tc.arrivals))
			if fmt.Sprint(r.order) != fmt.Sprint(tc.want) {
				t.Fatalf("released %v, want %v", r.order, tc.want)
			}
			for _, a := range tc.arrivals {
				if err := r.err(a.name); err != nil {
					t.Errorf("%s: %v", a.name, err)
				}
			}
			if n := r.c.Len(); n != 0 {
				t.Errorf("%d still waiting", n)
			}
		})
	}
}

func TestARequestWithNothingAheadThatMayGoIsNotQueued(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{})
	r.slots.Store(1)
	if err := r.c.Wait(context.Background(), r.request("x", "", 0)); err != nil {
		t.Fatal(err)
	}
	// A lower priority one must not pass a higher one that waits.
	r.enqueue(t, context.Background(), "high", r.request("high", "", 5))
	r.slots.Store(0)
	r.enqueue(t, context.Background(), "low", r.request("low", "", 1))
	r.release(t, 2)
	if fmt.Sprint(r.order) != "[x high low]" {
		t.Fatalf("released %v", r.order)
	}
}

func TestTTLExpiryEvictsTheRequest(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{DefaultTTL: 20 * time.Millisecond})
	err := r.c.Wait(context.Background(), r.request("x", "", 0))
	if !errors.Is(err, flowcontrol.ErrTTLExpired) || flowcontrol.StatusOf(err) != http.StatusServiceUnavailable {
		t.Fatalf("got %v (status %d), want the TTL's expiry, 503", err, flowcontrol.StatusOf(err))
	}
	if n := r.c.Len(); n != 0 {
		t.Fatalf("%d still waiting", n)
	}
	// A request's own TTL overrides the default.
	req := r.request("y", "", 0)
	req.TTL = 5 * time.Millisecond
	if err := r.c.Wait(context.Background(), req); !errors.Is(err, flowcontrol.ErrTTLExpired) {
		t.Fatalf("got %v", err)
	}
}

func TestACancelledClientLeavesItsQueueAtOnce(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	r.enqueue(t, ctx, "gone", r.request("gone", "a", 0))
	r.enqueue(t, context.Background(), "stays", r.request("stays", "a", 0))
	cancel()
	testkit.WaitFor(t, "the cancelled request out", func() error {
		if err := r.err("gone"); !errors.Is(err, flowcontrol.ErrCancelled) {
			return fmt.Errorf("gone: %v", err)
		}
		if n := r.c.Len(); n != 1 {
			return fmt.Errorf("%d waiting, want 1", n)
		}
		return nil
	})
	r.release(t, 2)
	if fmt.Sprint(r.order) != "[stays]" {
		t.Fatalf("released %v", r.order)
	}
}

func TestLimitsAndDisplacement(t *testing.T) {
	t.Parallel()
	t.Run("a full band refuses with 429 and displaces nothing of its own priority", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, flowcontrol.Config{Bands: []flowcontrol.Band{{Priority: 0, MaxRequests: 2}}})
		r.enqueue(t, context.Background(), "a", r.request("a", "", 0))
		r.enqueue(t, context.Background(), "b", r.request("b", "", 0))
		err := r.c.Wait(context.Background(), r.request("c", "", 0))
		if !errors.Is(err, flowcontrol.ErrQueueAtCapacity) || flowcontrol.StatusOf(err) != http.StatusTooManyRequests {
			t.Fatalf("got %v (status %d), want capacity, 429", err, flowcontrol.StatusOf(err))
		}
		r.release(t, 2)
	})
	t.Run("a band's byte limit counts the bodies waiting", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, flowcontrol.Config{DefaultBand: flowcontrol.Band{MaxBytes: 250}})
		r.enqueue(t, context.Background(), "a", r.request("a", "", 0))
		r.enqueue(t, context.Background(), "b", r.request("b", "", 0))
		if err := r.c.Wait(context.Background(), r.request("c", "", 0)); !errors.Is(err, flowcontrol.ErrQueueAtCapacity) {
			t.Fatalf("got %v", err)
		}
		r.release(t, 2)
	})
	t.Run("when the controller is full a higher priority displaces the lowest, newest from the largest flow first", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, flowcontrol.Config{MaxRequests: 4})
		r.enqueue(t, context.Background(), "mid", r.request("mid", "m", 5))
		r.enqueue(t, context.Background(), "low-a1", r.request("low-a1", "a", 0))
		r.enqueue(t, context.Background(), "low-a2", r.request("low-a2", "a", 0))
		r.enqueue(t, context.Background(), "low-b1", r.request("low-b1", "b", 0))
		r.start(context.Background(), "high", r.request("high", "h", 10))
		testkit.WaitFor(t, "low-a2 displaced", func() error {
			if err := r.err("low-a2"); !errors.Is(err, flowcontrol.ErrDisplaced) {
				return fmt.Errorf("low-a2: %v", err)
			}
			return nil
		})
		if flowcontrol.StatusOf(flowcontrol.ErrDisplaced) != http.StatusTooManyRequests {
			t.Error("a displaced request is not answered 429")
		}
		// The lowest band cannot displace itself.
		if err := r.c.Wait(context.Background(), r.request("low-c", "c", 0)); !errors.Is(err, flowcontrol.ErrQueueAtCapacity) {
			t.Fatalf("low-c: %v", err)
		}
		r.release(t, 4)
		if fmt.Sprint(r.order) != "[high mid low-a1 low-b1]" {
			t.Fatalf("released %v", r.order)
		}
	})
	t.Run("the global byte limit displaces as many as it takes, or none", func(t *testing.T) {
		t.Parallel()
		r := newRig(t, flowcontrol.Config{MaxBytes: 300})
		r.enqueue(t, context.Background(), "low1", r.request("low1", "", 0))
		r.enqueue(t, context.Background(), "low2", r.request("low2", "", 0))
		big := r.request("big", "", 10)
		big.Bytes = 400
		if err := r.c.Wait(context.Background(), big); !errors.Is(err, flowcontrol.ErrQueueAtCapacity) {
			t.Fatalf("big: %v", err)
		}
		if n := r.c.Len(); n != 2 {
			t.Fatalf("%d waiting after a refusal that could not make room, want 2", n)
		}
		two := r.request("two", "", 10)
		two.Bytes = 250
		r.start(context.Background(), "two", two)
		testkit.WaitFor(t, "both low displaced", func() error {
			for _, n := range []string{"low1", "low2"} {
				if err := r.err(n); !errors.Is(err, flowcontrol.ErrDisplaced) {
					return fmt.Errorf("%s: %v", n, err)
				}
			}
			return nil
		})
		r.release(t, 1)
	})
}

func TestStoppingRefusesEveryWaitingRequest(t *testing.T) {
	t.Parallel()
	c, err := flowcontrol.New(flowcontrol.Config{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	errc := make(chan error, 1)
	go func() {
		errc <- c.Wait(context.Background(), &flowcontrol.Request{Check: func(time.Duration) flowcontrol.Verdict { return flowcontrol.Verdict{} }})
	}()
	testkit.WaitFor(t, "queued", func() error {
		if c.Len() != 1 {
			return errors.New("not queued")
		}
		return nil
	})
	cancel()
	<-done
	if err := <-errc; !errors.Is(err, flowcontrol.ErrStopped) {
		t.Fatalf("got %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, cfg := range []flowcontrol.Config{
		{MaxBytes: -1},
		{Bands: []flowcontrol.Band{{Priority: 1}, {Priority: 1}}},
		{DefaultBand: flowcontrol.Band{MaxRequests: -1}},
	} {
		if _, err := flowcontrol.New(cfg, nil, nil); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}

// A request whose client leaves while its check runs on the release loop
// returns only once the check has: the check uses the caller's memory.
func TestAWaiterOutlivesItsRunningCheck(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{})
	entered, proceed := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(proceed) }) }
	// Registered after the rig's: runs first, so that a failing test
	// does not leave the release loop stuck in the check.
	t.Cleanup(release)
	var calls, finished atomic.Int32
	req := &flowcontrol.Request{Check: func(time.Duration) flowcontrol.Verdict {
		if calls.Add(1) == 1 {
			return flowcontrol.Verdict{} // the arrival's own check: wait
		}
		close(entered)
		<-proceed
		finished.Store(1)
		return flowcontrol.Verdict{}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan error, 1)
	go func() { returned <- r.c.Wait(ctx, req) }()
	<-entered
	cancel()
	select {
	case err := <-returned:
		t.Fatalf("returned (%v) while its check still ran", err)
	case <-time.After(50 * time.Millisecond):
	}
	release()
	if err := <-returned; !errors.Is(err, flowcontrol.ErrCancelled) {
		t.Fatalf("got %v", err)
	}
	if finished.Load() != 1 {
		t.Fatal("returned before its check")
	}
}

func TestFairShareServesFlowsByWhatTheyWereReleasedAcrossBands(t *testing.T) {
	t.Parallel()
	type arrival struct {
		name, flow string
		priority   int
		cost       float64
	}
	for _, tc := range []struct {
		name     string
		arrivals []arrival
		want     []string
	}{
		{"a flow served lately waits behind the others' requests of any priority",
			[]arrival{{"x1", "x", 10, 0}, {"x2", "x", 10, 0}, {"a-batch", "a", 0, 0}, {"b-int", "b", 10, 0}},
			[]string{"x1", "b-int", "a-batch", "x2"}},
		{"a flow that floods waits behind the flows within their share, of any priority",
			[]arrival{{"f1", "flood", 10, 0}, {"f2", "flood", 10, 0}, {"f3", "flood", 10, 0}, {"a-batch", "a", 0, 0}, {"b-int", "b", 10, 0}},
			[]string{"b-int", "a-batch", "f1", "f2", "f3"}},
		{"within a flow the highest priority goes first",
			[]arrival{{"a-low", "a", 0, 0}, {"a-high", "a", 10, 0}, {"a-mid", "a", 5, 0}},
			[]string{"a-high", "a-mid", "a-low"}},
		{"shares are of work: a flow of long prompts gets fewer turns",
			[]arrival{{"long1", "l", 0, 4096}, {"long2", "l", 0, 4096}, {"s1", "s", 0, 1024}, {"s2", "s", 0, 1024}, {"s3", "s", 0, 1024}, {"s4", "s", 0, 1024}, {"s5", "s", 0, 1024}},
			[]string{"long1", "s1", "s2", "s3", "s4", "long2", "s5"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, flowcontrol.Config{FairShare: true})
			for _, a := range tc.arrivals {
				req := r.request(a.name, a.flow, a.priority)
				req.Cost = a.cost
				r.enqueue(t, context.Background(), a.name, req)
			}
			r.release(t, len(tc.arrivals))
			if fmt.Sprint(r.order) != fmt.Sprint(tc.want) {
				t.Fatalf("released %v, want %v", r.order, tc.want)
			}
		})
	}
}

// Under fair share the flow due first may be one whose only request is
// held (batch work the engines have no room for without delaying more
// urgent work): a more urgent request of another flow within its share
// still goes, and the requests of a flow that floods wait, of whatever
// priority.
func TestAHeldRequestHoldsBackTheLessUrgent(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{FairShare: true})
	// b floods: it sends six requests where a and c send one each.
	r.slots.Store(4)
	for range 4 {
		if err := r.c.Wait(context.Background(), r.request("b0", "b", 10)); err != nil {
			t.Fatal(err)
		}
	}
	var heldChecks, floodChecks atomic.Int64
	held := &flowcontrol.Request{FlowID: "a", Priority: 0, Check: func(time.Duration) flowcontrol.Verdict {
		heldChecks.Add(1)
		return flowcontrol.Verdict{}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.enqueue(t, ctx, "a-batch", held)
	for _, x := range []struct {
		name     string
		priority int
	}{{"b-low", 0}, {"b-int", 10}} {
		req := r.request(x.name, "b", x.priority)
		check := req.Check
		req.Check = func(w time.Duration) flowcontrol.Verdict { floodChecks.Add(1); return check(w) }
		r.enqueue(t, context.Background(), x.name, req)
	}
	r.enqueue(t, context.Background(), "c-int", r.request("c-int", "c", 10))
	r.slots.Store(3)
	r.c.Kick()
	testkit.WaitFor(t, "c-int released", func() error { return r.err("c-int") })
	// Cycles after it check a-batch again; b's requests, of a flow that
	// floods, are never tried while a-batch is held, not even b-int of a
	// priority above it.
	seen := heldChecks.Load()
	testkit.WaitFor(t, "two more cycles", func() error {
		r.c.Kick()
		if n := heldChecks.Load(); n < seen+2 {
			return fmt.Errorf("a-batch checked %d times, want %d", n, seen+2)
		}
		return nil
	})
	if n := floodChecks.Load(); n != 0 {
		t.Errorf("b's requests checked %d times while a-batch was held, want none", n)
	}
	if err := r.err("a-batch"); err == nil {
		t.Errorf("a-batch released by a check that holds")
	}
	cancel()
	r.c.Kick()
	r.wg.Wait()
	for _, name := range []string{"b-int", "b-low"} {
		if err := r.err(name); err != nil {
			t.Errorf("%s after a-batch left: %v", name, err)
		}
	}
	if got, want := fmt.Sprint(r.order[len(r.order)-2:]), "[b-int b-low]"; got != want {
		t.Errorf("released last %s, want %s", got, want)
	}
}

func TestProtectIsTheTightestSLOAbove(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{FairShare: true})
	r.slots.Store(3)
	for _, x := range []struct {
		priority int
		slo      time.Duration
	}{{10, 300 * time.Millisecond}, {10, time.Second}, {0, 1500 * time.Millisecond}} {
		req := r.request("x", "", x.priority)
		req.SLO = x.slo
		if err := r.c.Wait(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	for p, want := range map[int]time.Duration{-1: 300 * time.Millisecond, 0: 300 * time.Millisecond, 10: 0} {
		if got := r.c.Protect(p, "").SLO; got != want {
			t.Errorf("Protect(%d) = %v, want %v", p, got, want)
		}
	}
	// The protected arrivals a second: three above -1, two above 0, all
	// within the first second, so counted over a second (what a 5s decay
	// keeps of a second's arrivals, 1-e^-0.2 of them, scaled back up).
	perSecond := 1 / (5 * -math.Expm1(-0.2))
	for _, x := range []struct {
		priority int
		want     float64
	}{{-1, 3 * perSecond}, {0, 2 * perSecond}, {10, 0}} {
		if got := r.c.Protect(x.priority, "").PerSecond; math.Abs(got-x.want) > 0.01 {
			t.Errorf("Protect(%d): %v arrivals a second, want %.3f", x.priority, got, x.want)
		}
	}
}

// A flow that sends more than half again the others' average lately
// leaves room for requests of its own priority too: the others'.
func TestAFlowThatFloodsProtectsItsOwnBand(t *testing.T) {
	t.Parallel()
	r := newRig(t, flowcontrol.Config{FairShare: true})
	r.slots.Store(5)
	send := func(flow string) {
		req := r.request(flow, flow, 10)
		req.SLO, req.Cost = 300*time.Millisecond, 2048
		if err := r.c.Wait(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	send("flood")
	if got := r.c.Protect(10, "flood").SLO; got != 0 {
		t.Errorf("a lone flow protects %v, want nothing: it has no one to leave room for", got)
	}
	send("flood")
	send("flood")
	send("flood")
	send("calm")
	if got := r.c.Protect(10, "flood").SLO; got != 300*time.Millisecond {
		t.Errorf("the flow that floods protects %v, want its band's 300ms", got)
	}
	if got := r.c.Protect(10, "calm").SLO; got != 0 {
		t.Errorf("the flow within its share protects %v, want nothing above it", got)
	}
}

// Under fair share a flow that floods leaves room for the requests of
// every priority of the flows within their share, as it goes behind
// them all; under upstream's strict bands only for those of its priority
// and above.
func TestAFlowThatFloodsProtectsEveryBandUnderFairShare(t *testing.T) {
	t.Parallel()
	protect := map[bool]flowcontrol.Protection{}
	for _, fair := range []bool{true, false} {
		r := newRig(t, flowcontrol.Config{FairShare: fair})
		r.slots.Store(6)
		send := func(flow string, priority int, slo time.Duration) {
			req := r.request(flow, flow, priority)
			req.SLO, req.Cost = slo, 2048
			if err := r.c.Wait(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		}
		for range 5 {
			send("flood", 10, 300*time.Millisecond)
		}
		send("calm", 0, 1500*time.Millisecond)
		protect[fair] = r.c.Protect(10, "flood")
		if got := protect[fair].SLO; got != 300*time.Millisecond {
			t.Errorf("fair share %v: the flow that floods protects an SLO of %v, want its band's 300ms", fair, got)
		}
	}
	// Both count the flood's own requests, sent while it was alone;
	// only fair share counts calm's, of a lower band.
	if fair, strict := protect[true].PerSecond, protect[false].PerSecond; !(fair > strict && strict > 0) {
		t.Errorf("arrivals a second protected by the flow that floods: %v under fair share, %v under strict bands; want more under fair share", fair, strict)
	}
}
