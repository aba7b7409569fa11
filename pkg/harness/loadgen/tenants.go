package loadgen

import (
	"context"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
)

// headerFairnessID names a request's flow, as upstream's EPP and kvroute's
// read it.
const headerFairnessID = flowcontrol.HeaderFairnessID

// Tenant is one client of a multi-tenant workload: its name is its flow
// (x-gateway-inference-fairness-id), Share its part of the arrivals.
type Tenant struct {
	Name  string
	Share float64
	// Flooder marks the tenant that sends past its fair share.
	Flooder bool
}

// tenant draws a tenant by share.
func (g *generator) tenant() string {
	total := 0.0
	for _, t := range g.w.Tenants {
		total += t.Share
	}
	x := g.rng.Float64() * total
	for _, t := range g.w.Tenants {
		if x < t.Share {
			return t.Name
		}
		x -= t.Share
	}
	return g.w.Tenants[len(g.w.Tenants)-1].Name
}

// The flow-control policies: kvroute's default profile with and without
// flow control, and the upstream EPP's binary with its flow control on
// (its flow control off is PolicyUpstreamEPPApprox).
const (
	// PolicyFlowControl is kvroute's default profile with flow control as
	// the chart turns it on for a pool with objectives
	// (--flow-control-when-objectives), no flowControl section: per
	// band, one global-strict FCFS order over every flow.
	PolicyFlowControl = "kvroute-flow-control"
	// PolicyFlowControlFair is the same with the multi-tenant operator's
	// flowControl section (FairFlowControl): round-robin across flows in
	// every band.
	PolicyFlowControlFair = "kvroute-flow-control-fair"
	// PolicyUpstreamFlowControl is the upstream EPP's binary with the
	// configuration its Helm chart deploys, its flowControl feature gate
	// on and the same flowControl section.
	PolicyUpstreamFlowControl = "upstream-epp-flow-control"
)

// FlowControlPolicies are kvroute's policies with flow control on; the
// benchmark runs them when asked (--policies, --tenants).
var FlowControlPolicies = []string{PolicyFlowControl, PolicyFlowControlFair}

// TenantsPolicies are the policies the multi-tenant workload compares:
// kvroute with flow control (the chart's, and with round-robin fairness),
// kvroute without it (its default profile sheds sheddable requests no
// endpoint is predicted to serve in time: shedding alone), and the
// upstream EPP with its flow control on and off.
var TenantsPolicies = []string{PolicyFlowControl, PolicyFlowControlFair, PolicyPredicted, PolicyUpstreamFlowControl, PolicyUpstreamEPPApprox}

// FairFlowControl is the flowControl section a multi-tenant operator
// writes: every band serves its flows round-robin. Upstream resolves a
// policy reference to a plugin instance, so the policy is declared.
const FairFlowControl = `featureGates:
- flowControl
flowControl:
  defaultPriorityBand:
    fairnessPolicyRef: round-robin-fairness-policy
`

// withFairFlowControl is a configuration with FairFlowControl added: the
// round-robin policy among its plugins, the section after them.
func withFairFlowControl(text string) string {
	text = strings.Replace(text, "\nplugins:\n", "\nplugins:\n- type: round-robin-fairness-policy\n", 1)
	return strings.TrimRight(text, "\n") + "\n" + FairFlowControl
}

// flowControlled says whether kvroute's EPP runs flow control for policy
// as the chart turns it on: for a pool with objectives.
func flowControlled(policy string) bool { return policy == PolicyFlowControl }

// TenantsPlan is the multi-tenant workload, defined before it was
// measured. Four tenants, each a flow: tenant-a, tenant-b and tenant-c
// with one share each, and flooder with four, so that it sends four times
// what each other tenant sends (4/7 of the arrivals) where its fair share
// is a quarter. Every tenant mixes mixed-slo's two classes:
// 60% interactive (priority 0, TTFT SLO 300ms) and 40% batch (priority
// -1, sheddable, TTFT SLO 1.5s), named by x-gateway-inference-objective.
// Prompts are 2048 tokens that share nothing (no routing wins by the
// cache: the fleet's prefill is what the tenants share), 32 output
// tokens, on 4 engines of full speed with 2048 GPU blocks each, room for
// every running sequence. A 2048-token prefill costs an engine about
// 110ms (50µs a token plus 2µs a token per 1024 of context), so the fleet
// prefills about 36 such prompts a second with nothing else in its steps,
// fewer with decodes beside them: the runs serve at most about 26 a
// second. Rates are the total: 14, 28, 42 and 56 req/s, the well-behaved
// tenants 2, 4, 6 and 8 req/s each (6 to 24 together) and the flooder 8
// to 32: from about half the fleet's measured capacity to twice it, the
// well-behaved tenants' own demand from a quarter of it to nearly all.
func TenantsPlan() Plan {
	return Plan{
		Workload: Workload{Name: "tenants", Kind: KindUnrelated, SystemTokens: 1920, QuestionTokens: 128,
			Classes: []Class{
				{Objective: "interactive", Priority: 0, SLO: 300 * time.Millisecond, Share: 0.6},
				{Objective: "batch", Priority: -1, SLO: 1500 * time.Millisecond, Share: 0.4},
			},
			Tenants: []Tenant{
				{Name: "tenant-a", Share: 1}, {Name: "tenant-b", Share: 1}, {Name: "tenant-c", Share: 1},
				{Name: "flooder", Share: 4, Flooder: true},
			}},
		GPUBlocks: 2048,
		Rates:     []float64{14, 28, 42, 56},
	}
}

// TenantsAlonePlan is TenantsPlan's well-behaved tenants alone, at the
// rates they send there (TenantsAloneRates): the attainment they get on
// the fleet with no flooder at all is the most any flow control could
// give them beside one.
func TenantsAlonePlan() Plan {
	p := TenantsPlan()
	p.Workload.Name = "tenants-alone"
	p.Rates = aloneRates(p.Workload.Tenants, p.Rates)
	p.Workload.Tenants = slices.DeleteFunc(p.Workload.Tenants, func(t Tenant) bool { return t.Flooder })
	return p
}

// TenantsAloneRates are the rates TenantsPlan's well-behaved tenants send
// at the total rates given: 3/7 of each, to a thousandth.
func TenantsAloneRates(rates []float64) []float64 {
	return aloneRates(TenantsPlan().Workload.Tenants, rates)
}

// aloneRates are the rates tenants other than the flooder send at the
// total rates given.
func aloneRates(tenants []Tenant, rates []float64) []float64 {
	var all, kept float64
	for _, t := range tenants {
		all += t.Share
		if !t.Flooder {
			kept += t.Share
		}
	}
	out := make([]float64, len(rates))
	for i, r := range rates {
		out[i] = math.Round(r*kept/all*1000) / 1000
	}
	return out
}

// TenantStats is what one tenant's requests got.
type TenantStats struct {
	Tenant  string
	Flooder bool `json:",omitempty"`
	// Sent is every request the tenant sent; Met those served whose TTFT
	// met their SLO; Served those answered 200; Shed those refused with
	// 429; Refused those refused with 503 (flow control's SLO or TTL
	// refusals); Cut those the run's end stopped; Errors the rest.
	Sent, Met, Served, Shed, Refused, Cut, Errors int
	// ByClass is Sent and Met per objective.
	ByClass []ClassStats
	// Held is the requests the EPP's flow controller held 5ms or more
	// before dispatching them, Outcomes its outcomes by name, from its
	// own metrics (inference_extension_flow_control_request_queue_duration_seconds);
	// both empty where no flow controller ran.
	Held     int            `json:",omitempty"`
	Outcomes map[string]int `json:",omitempty"`
}

// ClassStats is one objective's requests of a tenant.
type ClassStats struct {
	Objective string
	Sent, Met int
}

// TenantsResult is a multi-tenant run's (or a point's seeds' pooled)
// figures per tenant.
type TenantsResult struct {
	Tenants []TenantStats
	// Makespan is the runs' traffic time, summed over pooled seeds:
	// goodput is Met over it.
	Makespan time.Duration
	// Seeds is how many runs are pooled.
	Seeds int
	// FlowControl says whether the EPP's flow controller reported.
	FlowControl bool `json:",omitempty"`
}

// Attainment is met over sent: a shed, refused or cut request missed.
func (s TenantStats) Attainment() float64 {
	if s.Sent == 0 {
		return 0
	}
	return float64(s.Met) / float64(s.Sent)
}

// WellBehaved pools every tenant but the flooder.
func (r *TenantsResult) WellBehaved() TenantStats {
	out := TenantStats{Tenant: "well-behaved"}
	for _, t := range r.Tenants {
		if !t.Flooder {
			out.add(t)
		}
	}
	return out
}

// Flooder is the flooding tenant's figures.
func (r *TenantsResult) Flooder() TenantStats {
	for _, t := range r.Tenants {
		if t.Flooder {
			return t
		}
	}
	return TenantStats{}
}

// Goodput is requests within their SLO per second, of s, over the result's makespan.
func (r *TenantsResult) Goodput(s TenantStats) float64 {
	if r.Makespan <= 0 {
		return 0
	}
	return float64(s.Met) / r.Makespan.Seconds()
}

// add adds o's counts to s. A TenantStats copied by value shares its
// ByClass and Outcomes with the original: s gets its own before they
// change, so that the original keeps its counts.
func (s *TenantStats) add(o TenantStats) {
	s.ByClass = slices.Clone(s.ByClass)
	s.Outcomes = maps.Clone(s.Outcomes)
	s.Sent += o.Sent
	s.Met += o.Met
	s.Served += o.Served
	s.Shed += o.Shed
	s.Refused += o.Refused
	s.Cut += o.Cut
	s.Errors += o.Errors
	s.Held += o.Held
	for _, c := range o.ByClass {
		i := slices.IndexFunc(s.ByClass, func(x ClassStats) bool { return x.Objective == c.Objective })
		if i < 0 {
			s.ByClass = append(s.ByClass, ClassStats{Objective: c.Objective})
			i = len(s.ByClass) - 1
		}
		s.ByClass[i].Sent += c.Sent
		s.ByClass[i].Met += c.Met
	}
	for k, v := range o.Outcomes {
		if s.Outcomes == nil {
			s.Outcomes = map[string]int{}
		}
		s.Outcomes[k] += v
	}
}

// pool adds another seed's run of the same point.
func (r *TenantsResult) pool(o *TenantsResult) {
	for _, t := range o.Tenants {
		i := slices.IndexFunc(r.Tenants, func(x TenantStats) bool { return x.Tenant == t.Tenant })
		if i < 0 {
			r.Tenants = append(r.Tenants, TenantStats{Tenant: t.Tenant, Flooder: t.Flooder})
			i = len(r.Tenants) - 1
		}
		r.Tenants[i].add(t)
	}
	r.Makespan += o.Makespan
	r.Seeds += o.Seeds
	r.FlowControl = r.FlowControl || o.FlowControl
}

// tenantsResult condenses a run of w per tenant, with the flow
// controller's counts per flow where one reported.
func tenantsResult(w Workload, res Result) *TenantsResult {
	if len(w.Tenants) == 0 {
		return nil
	}
	r := &TenantsResult{Makespan: res.Makespan, Seeds: 1, FlowControl: res.Flow != nil}
	for _, t := range w.Tenants {
		st := TenantStats{Tenant: t.Name, Flooder: t.Flooder}
		for _, c := range w.Classes {
			st.ByClass = append(st.ByClass, ClassStats{Objective: c.Objective})
		}
		if f, ok := res.Flow[t.Name]; ok {
			st.Held, st.Outcomes = f.held, f.outcomes
		}
		r.Tenants = append(r.Tenants, st)
	}
	for _, s := range res.Samples {
		i := slices.IndexFunc(r.Tenants, func(x TenantStats) bool { return x.Tenant == s.Tenant })
		if i < 0 {
			continue
		}
		st := &r.Tenants[i]
		st.Sent++
		met := false
		switch {
		case s.Cut:
			// In time only if its first token came before the cut.
			st.Cut++
			met = s.TTFT <= s.SLO
		case s.Status == 429:
			st.Shed++
		case s.Status == 503:
			st.Refused++
		case s.Err != nil:
			st.Errors++
		default:
			st.Served++
			met = s.SLO <= 0 || s.TTFT <= s.SLO
		}
		if met {
			st.Met++
		}
		if j := slices.IndexFunc(st.ByClass, func(c ClassStats) bool { return c.Objective == s.Objective }); j >= 0 {
			st.ByClass[j].Sent++
			if met {
				st.ByClass[j].Met++
			}
		}
	}
	return r
}

// flowCount is one flow's counts from a flow controller's metrics.
type flowCount struct {
	held     int
	outcomes map[string]int
}

// metricQueueDuration is the flow controller's wait histogram, by
// fairness_id, priority and outcome, in kvroute and upstream alike.
const metricQueueDuration = "inference_extension_flow_control_request_queue_duration_seconds"

// heldAfter is the wait past which a dispatched request counts as held.
const heldAfter = 0.005

// flowCounts reads every replica's flow-controller metrics, by flow; nil
// when none has any.
func (env *Env) flowCounts(ctx context.Context) map[string]flowCount {
	var out map[string]flowCount
	add := func(fams []*dto.MetricFamily) {
		for _, f := range fams {
			if f.GetName() != metricQueueDuration {
				continue
			}
			for _, m := range f.GetMetric() {
				h := m.GetHistogram()
				if h == nil {
					continue
				}
				if out == nil {
					out = map[string]flowCount{}
				}
				flow, outcome := label(m, "fairness_id"), label(m, "outcome")
				fc := out[flow]
				if fc.outcomes == nil {
					fc.outcomes = map[string]int{}
				}
				n := int(h.GetSampleCount())
				fc.outcomes[outcome] += n
				if outcome == flowcontrol.OutcomeDispatched {
					quick := 0
					for _, b := range h.GetBucket() {
						if b.GetUpperBound() <= heldAfter {
							quick = int(b.GetCumulativeCount())
						}
					}
					fc.held += n - quick
				}
				out[flow] = fc
			}
		}
	}
	for _, r := range env.Replicas() {
		switch r := r.(type) {
		case *kvroute:
			if fams, err := r.e.Registry().Gather(); err == nil {
				add(fams)
			}
		case *upstreamReplica:
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			m, err := r.e.Metrics(ctx)
			cancel()
			if err == nil {
				fams := make([]*dto.MetricFamily, 0, len(m))
				for _, f := range m {
					fams = append(fams, f)
				}
				add(fams)
			}
		}
	}
	return out
}

// clusterObjectives are w's classes as the pool's InferenceObjectives.
func clusterObjectives(classes []Class) []upstreamepp.Objective {
	var out []upstreamepp.Objective
	for _, c := range classes {
		out = append(out, upstreamepp.Objective{Name: c.Objective, Priority: c.Priority})
	}
	return out
}
