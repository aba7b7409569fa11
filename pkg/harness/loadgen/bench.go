package loadgen

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/kvroute/kvroute/pkg/sim"
)

// Plan is one workload and the request rates it runs at.
type Plan struct {
	Workload Workload
	Rates    []float64
	// GPUBlocks, when set, overrides the fleet's GPU cache per engine for
	// this workload, whose working set needs a cache of another size.
	GPUBlocks int
	// Speeds, when set, makes this workload's fleet heterogeneous
	// (sim.FleetConfig.Speeds).
	Speeds []float64
	// CPUBlocks, when set, gives every engine a CPU tier of that many
	// blocks for this workload.
	CPUBlocks int
	// Engines, when set, overrides the fleet's size; Roles and Transfer
	// make it a P/D fleet (FleetOptions.Roles).
	Engines  int
	Roles    []string
	Transfer sim.Transfer
	// DataParallel, when above 1, makes each engine a data-parallel one
	// of that many ranks (FleetOptions.DataParallel).
	DataParallel int
	// Places, when set, puts the P/D fleet's engines on hosts and racks
	// (sim.FleetConfig.Places); the EPP reads their topology from its
	// endpoints file.
	Places []sim.Place
}

// BenchOptions shape a routing benchmark: every plan's workload at each of
// its rates under each policy, each run in a fresh environment.
type BenchOptions struct {
	Plans    []Plan
	Policies []string
	Fleet    FleetOptions
	// Duration of arrivals and Drain allowed after, per run.
	Duration, Drain time.Duration
	// MinRequests lengthens the arrivals of a run at a low rate until
	// about that many requests arrive: a p90 read from a few dozen
	// requests is their third or fourth longest, and says little.
	MinRequests int
	MaxTokens   int
	ThinkTime   time.Duration
	Seed        uint64
	// Seeds, when above 1, runs each point that many times, with seeds
	// Seed, Seed+1, …, and keeps the run with the median TTFT p90: one
	// run's p90 moves by a fifth or more with its seed where a few slow
	// requests decide it, and the median of a few runs by much less.
	Seeds int
	// Virtual runs every policy in virtual time (RunVirtual) rather than
	// in real time through HTTP, NATS and a served EPP.
	Virtual bool
	// Shape is how every run's traffic reaches the engines: the gateway
	// and its EPP replicas, a share bypassing them, a restart. A shape
	// other than the default one is real time only.
	Shape Shape
	// Progress, when set, gets a line per run.
	Progress io.Writer
}

// Point is one run's outcome.
type Point struct {
	Workload string
	Policy   string
	Rate     float64
	Summary
	// Predictor is the EPP's latency predictor's TTFT accuracy in the
	// run, for a policy with one.
	Predictor *PredictorAccuracy `json:",omitempty"`
	// Restart is what the run's EPP restart did (Shape.RestartAt).
	Restart *Restart `json:",omitempty"`
	// PD is a P/D run's splits, prefill busy share and TPOT.
	PD *PDResult `json:",omitempty"`
	// Tenants is a multi-tenant point's figures per tenant, pooled over
	// its seeds.
	Tenants *TenantsResult `json:",omitempty"`
}

// Bench runs the benchmark. Every policy sees the same arrivals and
// prompts at a given rate (the same seed).
func Bench(ctx context.Context, o BenchOptions) ([]Point, error) {
	if len(o.Policies) == 0 {
		o.Policies = AllPolicies
	}
	if o.Virtual && o.Shape.RealTimeOnly() {
		return nil, fmt.Errorf("loadgen: %s is real time only: virtual time has no ext_proc, gateway or second EPP", o.Shape)
	}
	var out []Point
	for _, p := range o.Plans {
		for _, rate := range p.Rates {
			for _, pol := range o.Policies {
				runs := make([]Point, 0, max(o.Seeds, 1))
				for k := range max(o.Seeds, 1) {
					one := o
					one.Seed = o.Seed + uint64(k)
					pt, err := benchOne(ctx, one, p, pol, rate)
					if err != nil {
						return out, err
					}
					runs = append(runs, pt)
					if o.Progress != nil {
						pred := ""
						if a := pt.Predictor; a != nil {
							pred = fmt.Sprintf("  predicted TTFT: MAPE %.1f%%, p90 coverage %.1f%%", 100*a.MAPE, 100*a.Coverage)
						}
						fmt.Fprintf(o.Progress, "%-13s %-25s %5.1f req/s  seed %-4d TTFT p50 %7s p90 %7s p99 %7s  hit %5.1f%%  SLO %5.1f%%  goodput %5.1f/s  (%d req, %d shed, %d err, %d cut)%s\n",
							p.Workload.Name, pol, rate, one.Seed, ms(pt.TTFTp50), ms(pt.TTFTp90), ms(pt.TTFTp99), 100*pt.HitRate,
							100*pt.SLOAttainment, pt.Goodput, pt.Requests, pt.Shed, pt.Errors, pt.Cut, pred)
						if pt.PD != nil {
							fmt.Fprintf(o.Progress, "%-13s %s\n", "", pt.PD)
						}
						if r := pt.Restart; r != nil {
							fmt.Fprintf(o.Progress, "%-13s restart: stopped %s at %s, %s ready at %s; steady hit rate %.1f%%; %s\n",
								"", r.Old, r.StopAt.Round(time.Millisecond), r.New, r.ReadyAt.Round(time.Millisecond), 100*r.Steady, r.Verdict())
						}
					}
				}
				med := MedianRun(runs)
				if med.Tenants != nil {
					// Per-tenant counts pool every seed's run.
					pooled := &TenantsResult{}
					for _, r := range runs {
						pooled.pool(r.Tenants)
					}
					med.Tenants = pooled
				}
				out = append(out, withPDSeeds(med, runs, o.Seed))
			}
		}
	}
	return out, nil
}

// withPDSeeds gives med, the median of runs (seeds from seed on), every
// seed's P/D figures: throughput is compared seed by seed, since each
// seed's arrivals differ and the median run's seed differs between
// policies.
func withPDSeeds(med Point, runs []Point, seed uint64) Point {
	if med.PD == nil {
		return med
	}
	pd := *med.PD
	pd.SeedOutputTPS, pd.SeedOutputTokens, pd.SeedRuns = nil, nil, nil
	for k, r := range runs {
		pd.SeedOutputTPS = append(pd.SeedOutputTPS, r.OutputTPS)
		pd.SeedOutputTokens = append(pd.SeedOutputTokens, r.OutputTokens)
		if r.PD != nil {
			pd.SeedRuns = append(pd.SeedRuns, PDSeed{Seed: seed + uint64(k), TTFTp90: r.TTFTp90, TransferMean: r.PD.TransferMean, SplitRatio: r.PD.SplitRatio})
		}
	}
	med.PD = &pd
	return med
}

// MedianRun is the run of runs (one point's, under different seeds) with
// the median TTFT p90, the lower of the two middle ones for an even count:
// every figure of the point then comes from one real run.
func MedianRun(runs []Point) Point {
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b Point) int { return cmp.Compare(a.TTFTp90, b.TTFTp90) })
	return sorted[(len(sorted)-1)/2]
}

func benchOne(ctx context.Context, o BenchOptions, p Plan, policy string, rate float64) (Point, error) {
	w, fleet := p.Workload, o.Fleet
	if p.GPUBlocks > 0 {
		fleet.Pool.GPUBlocks = p.GPUBlocks
	}
	if len(p.Speeds) > 0 {
		fleet.Speeds = p.Speeds
	}
	if p.CPUBlocks > 0 {
		fleet.Pool.CPUBlocks = p.CPUBlocks
	}
	if p.Engines > 0 {
		fleet.Engines = p.Engines
	}
	if p.DataParallel > 1 {
		fleet.DataParallel = p.DataParallel
	}
	if isDP(policy) || fleet.DataParallel > 1 {
		if err := checkDPPolicy(policy, fleet); err != nil {
			return Point{}, err
		}
		fleet = dpFleet(policy, fleet)
	}
	fleet.Objectives = w.Classes
	if len(p.Roles) > 0 {
		if o.Virtual {
			return Point{}, fmt.Errorf("loadgen: %s: a P/D fleet runs in real time only", w.Name)
		}
		fleet.Roles, fleet.Transfer, fleet.Places = p.Roles, p.Transfer, p.Places
	}
	ro := RunOptions{
		Model: o.Fleet.Model, Rate: rate, Duration: o.runDuration(rate), Drain: o.Drain,
		MaxTokens: o.MaxTokens, ThinkTime: o.ThinkTime, Seed: o.Seed,
	}
	if o.Virtual {
		res, err := RunVirtual(ctx, policy, fleet, w, ro)
		if err != nil {
			return Point{}, fmt.Errorf("loadgen: %s at %.1f req/s: %w", policy, rate, err)
		}
		return Point{Workload: w.Name, Policy: policy, Rate: rate, Summary: Summarize(res.Samples, res.Makespan), Predictor: res.Predictor}, nil
	}
	env, err := StartEnvShaped(ctx, policy, fleet, o.Seed, o.Shape)
	if err != nil {
		return Point{}, fmt.Errorf("loadgen: %s at %.1f req/s: %w", policy, rate, err)
	}
	res := env.Run(ctx, w, ro)
	if err := env.Close(); err != nil {
		return Point{}, fmt.Errorf("loadgen: %s at %.1f req/s: %w", policy, rate, err)
	}
	return Point{Workload: w.Name, Policy: policy, Rate: rate, Summary: Summarize(res.Samples, res.Makespan), Predictor: res.Predictor, Restart: res.Restart, PD: res.PD,
		Tenants: tenantsResult(w, res)}, nil
}

// runDuration is how long arrivals run at rate: Duration, or longer for
// MinRequests to arrive.
func (o BenchOptions) runDuration(rate float64) time.Duration {
	d := o.Duration
	if o.MinRequests > 0 && rate > 0 {
		d = max(d, time.Duration(float64(o.MinRequests)/rate*float64(time.Second)).Round(time.Second))
	}
	return d
}

// ms formats a duration in milliseconds for tables.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.0fms", float64(d)/float64(time.Millisecond))
}
