package loadgen

import (
	"errors"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
)

func TestTheTenantsWorkloadSendsEachTenantItsShareAsItsFlow(t *testing.T) {
	t.Parallel()
	w := TenantsPlan().Workload
	g := newGenerator(w, 7)
	counts := map[string]int{}
	classes := map[string]int{}
	const n = 7000
	for range n {
		c := g.next()
		h := c.headers()
		if h[headerFairnessID] != c.Tenant || c.Tenant == "" {
			t.Fatalf("conversation of tenant %q sends fairness id %q", c.Tenant, h[headerFairnessID])
		}
		if h["x-gateway-inference-objective"] != c.Objective || h["x-slo-ttft-ms"] == "" {
			t.Fatalf("headers %v lack the class's objective or SLO", h)
		}
		counts[c.Tenant]++
		classes[c.Objective]++
	}
	for name, want := range map[string]float64{"tenant-a": 1.0 / 7, "tenant-b": 1.0 / 7, "tenant-c": 1.0 / 7, "flooder": 4.0 / 7} {
		if got := float64(counts[name]) / n; math.Abs(got-want) > 0.02 {
			t.Errorf("tenant %s sent %.3f of the requests, want %.3f", name, got, want)
		}
	}
	if got := float64(classes["interactive"]) / n; math.Abs(got-0.6) > 0.02 {
		t.Errorf("interactive share %.3f, want 0.6", got)
	}
}

func TestTenantsResultCountsEachOutcomePerTenant(t *testing.T) {
	t.Parallel()
	w := TenantsPlan().Workload
	slo := 300 * time.Millisecond
	res := Result{Makespan: 2 * time.Second, Samples: []Sample{
		{Tenant: "tenant-a", Objective: "interactive", SLO: slo, TTFT: 100 * time.Millisecond, Status: 200},
		{Tenant: "tenant-a", Objective: "interactive", SLO: slo, TTFT: 400 * time.Millisecond, Status: 200},
		{Tenant: "tenant-a", Objective: "batch", SLO: 5 * slo, Status: 429, Shed: true},
		{Tenant: "flooder", Objective: "interactive", SLO: slo, Status: 503, Err: errors.New("status 503")},
		{Tenant: "flooder", Objective: "batch", SLO: 5 * slo, TTFT: time.Second, Cut: true},
		{Tenant: "flooder", Objective: "batch", SLO: 5 * slo, Status: 500, Err: errors.New("status 500")},
	}, Flow: map[string]flowCount{"flooder": {held: 3, outcomes: map[string]int{"Dispatched": 5, "RejectedSLO": 1}}}}
	r := tenantsResult(w, res)
	a, fl := r.Tenants[0], r.Flooder()
	if a.Sent != 3 || a.Met != 1 || a.Served != 2 || a.Shed != 1 || a.ByClass[0] != (ClassStats{"interactive", 2, 1}) || a.ByClass[1] != (ClassStats{"batch", 1, 0}) {
		t.Errorf("tenant-a: %+v", a)
	}
	if fl.Sent != 3 || fl.Met != 1 || fl.Refused != 1 || fl.Cut != 1 || fl.Errors != 1 || fl.Held != 3 || fl.Outcomes["RejectedSLO"] != 1 {
		t.Errorf("flooder: %+v", fl)
	}
	wb := r.WellBehaved()
	if wb.Sent != 3 || wb.Met != 1 {
		t.Errorf("well-behaved pooled: %+v", wb)
	}
	// Everyone's figures, pooled from copies, leave the parts' alone.
	all := wb
	all.add(fl)
	if all.ByClass[0] != (ClassStats{"interactive", 3, 1}) || wb.ByClass[0] != (ClassStats{"interactive", 2, 1}) || fl.Outcomes["Dispatched"] != 5 {
		t.Errorf("pooling everyone changed the parts: all %+v, well-behaved %+v, flooder %+v", all.ByClass, wb.ByClass, fl.Outcomes)
	}
	if g := r.Goodput(r.Flooder()); g != 0.5 {
		t.Errorf("flooder goodput %v, want 0.5 req/s", g)
	}
	pooled := &TenantsResult{}
	pooled.pool(r)
	pooled.pool(r)
	if got := pooled.Flooder(); got.Sent != 6 || got.Held != 6 || got.Outcomes["Dispatched"] != 10 || pooled.Goodput(got) != 0.5 {
		t.Errorf("two seeds pooled: %+v, goodput %v", got, pooled.Goodput(got))
	}
}

// The flowControl section the tenants' policies add starts kvroute's EPP
// with round-robin fairness, on the default profile and on upstream's
// chart file alike.
func TestTheFairFlowControlSectionLoadsAsRoundRobin(t *testing.T) {
	t.Parallel()
	for _, text := range []string{PredictedConfig, upstreamepp.ConfigApprox} {
		e, err := epp.New(epp.Options{Pool: "p", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
			ConfigText: withFairFlowControl(text), Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		fc := e.FlowControl()
		e.Close()
		if fc == nil || fc.Config().DefaultBand.Fairness != flowcontrol.RoundRobin {
			t.Fatalf("flow control %+v, want round-robin in every band", fc)
		}
	}
}

// The report's capacity is what a policy served to the end, cut requests
// not included, and the well-behaved tenants' offered rate their share of
// the point's rate.
func TestTheTenantsReportStatesTheMeasuredCapacity(t *testing.T) {
	t.Parallel()
	pt := func(policy string, rate float64, served, cut int) Point {
		return Point{Workload: "tenants", Policy: policy, Rate: rate, Tenants: &TenantsResult{Makespan: 10 * time.Second, Tenants: []TenantStats{
			{Tenant: "tenant-a", Sent: 30, Served: served / 2},
			{Tenant: "flooder", Flooder: true, Sent: 90, Served: served - served/2, Cut: cut},
		}}}
	}
	var b strings.Builder
	writeTenantsCapacity(&b, []Point{pt("a", 28, 200, 0), pt("b", 56, 100, 400)})
	want := "at most 20.0 requests served a second (a at 28 req/s, over its runs' makespans), the decode steps sharing the engines with the prefills. The well-behaved tenants' offered rate against it: 7.0 req/s (35%) at 28, 14.0 req/s (70%) at 56."
	if !strings.Contains(b.String(), want) {
		t.Errorf("got %q, want it to say %q", b.String(), want)
	}
}

// The alone plan keeps the well-behaved tenants at the rates they send
// beside the flooder, and the report sets what they get alone beside what
// they get with it.
func TestTheWellBehavedTenantsAloneSendWhatTheySendBesideTheFlooder(t *testing.T) {
	t.Parallel()
	p := TenantsAlonePlan()
	for _, tn := range p.Workload.Tenants {
		if tn.Flooder {
			t.Fatalf("the alone plan keeps the flooder: %+v", p.Workload.Tenants)
		}
	}
	if want := []float64{6, 12, 18, 24}; !slices.Equal(p.Rates, want) {
		t.Errorf("rates %v, want %v", p.Rates, want)
	}
	// Rates off the ladder (--rates) too: 3/7 of each, to a thousandth.
	if got, want := TenantsAloneRates([]float64{56, 10}), []float64{24, 4.286}; !slices.Equal(got, want) {
		t.Errorf("TenantsAloneRates = %v, want %v", got, want)
	}
	stats := func(name string, flooder bool, sent, met int) TenantStats {
		return TenantStats{Tenant: name, Flooder: flooder, Sent: sent, Met: met, Served: met}
	}
	with := Point{Workload: "tenants", Policy: PolicyFlowControl, Rate: 56, Tenants: &TenantsResult{Tenants: []TenantStats{
		stats("tenant-a", false, 300, 240), stats("flooder", true, 400, 100)}}}
	alone := Point{Workload: "tenants-alone", Policy: PolicyFlowControl, Rate: 24, Tenants: &TenantsResult{Tenants: []TenantStats{stats("tenant-a", false, 300, 270)}}}
	var b strings.Builder
	writeTenantsAlone(&b, []Point{with}, []Point{alone})
	if !strings.Contains(b.String(), "| 24 | kvroute-flow-control | 90.0% |") || !strings.Contains(b.String(), "56: 80.0%") {
		t.Errorf("the alone table:\n%s", b.String())
	}
}
