package loadgen

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

func tinyFleet() FleetOptions {
	return FleetOptions{
		Engines: 3, Model: "sim-model",
		Pool:   blockpool.Config{BlockSize: 16, GPUBlocks: 256},
		Timing: sim.Timing{PrefillPerToken: 20 * time.Microsecond, LoadPerToken: 2 * time.Microsecond, DecodeStep: 2 * time.Millisecond, MaxSeqs: 4},
		Mixed:  true,
	}
}

func TestBenchRunsEveryPolicyOnATinyWorkload(t *testing.T) {
	pts, err := Bench(context.Background(), BenchOptions{
		Plans: []Plan{{
			Workload: Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 3, SystemTokens: 256, QuestionTokens: 32},
			Rates:    []float64{20},
		}},
		Fleet: tinyFleet(), Duration: time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 1,
		Progress: os.Stderr,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != len(AllPolicies) {
		t.Fatalf("got %d points, want %d", len(pts), len(AllPolicies))
	}
	for _, p := range pts {
		if p.Requests == 0 || p.Errors > 0 {
			t.Errorf("%s: %d requests, %d errors", p.Policy, p.Requests, p.Errors)
		}
	}
}

func TestTheDemoComparesAndFindsTheIndexExact(t *testing.T) {
	var out strings.Builder
	err := Demo(context.Background(), DemoOptions{
		Fleet:    tinyFleet(),
		Workload: Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 3, SystemTokens: 128, QuestionTokens: 16},
		Rate:     20, Duration: time.Second, Out: &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	text := out.String()
	for _, want := range []string{"random ", "kvroute ", "TTFT p90"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	var agree, total int
	i := strings.Index(text, "true caches: ")
	if i < 0 {
		t.Fatalf("no index check in output:\n%s", text)
	}
	if _, err := fmt.Sscanf(text[i+len("true caches: "):], "%d/%d", &agree, &total); err != nil || total == 0 || agree != total {
		t.Errorf("index check %d/%d (%v):\n%s", agree, total, err, text)
	}
}

func TestMultiTurnConversationsHitTheirHistory(t *testing.T) {
	pts, err := Bench(context.Background(), BenchOptions{
		Plans: []Plan{{
			Workload: Workload{Name: "chat", Kind: KindMultiTurn, Groups: 2, SystemTokens: 64, QuestionTokens: 32, Turns: 3},
			Rates:    []float64{15},
		}},
		Policies: []string{PolicyPrecise, PolicyRoundRobin},
		Fleet:    tinyFleet(), Duration: time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	if pts[0].Errors > 0 || pts[0].HitRate < 0.5 || pts[0].HitRate <= pts[1].HitRate {
		t.Errorf("precise: %d errors, hit rate %.2f against round-robin's %.2f; want no errors, > 0.5 and above round-robin's",
			pts[0].Errors, pts[0].HitRate, pts[1].HitRate)
	}
}

// A policy that picks in the client sends its requests through the
// gateway and the EPP, as kvroute's policies do, and each lands on the
// engine it chose: round-robin fills the engines in turn, where the EPP's
// own profile would follow the prompts' shared prefixes.
func TestAClientRoutedPolicyPaysTheSameHopAndKeepsItsPick(t *testing.T) {
	ctx := context.Background()
	env, err := StartEnv(ctx, PolicyRoundRobin, tinyFleet(), 5)
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 256, QuestionTokens: 16,
		Classes: []Class{{Objective: "batch", Priority: -1, SLO: time.Second, Share: 1}}}
	res := env.Run(ctx, w, RunOptions{Model: "sim-model", Rate: 30, Duration: time.Second, Drain: 5 * time.Second, MaxTokens: 2, Seed: 5})
	served := 0
	for _, s := range res.Samples {
		if s.Err != nil || s.Shed || s.Cut {
			t.Fatalf("a request failed: %+v", s)
		}
		if s.Replica != "epp-0" {
			t.Fatalf("a request passed ext_proc host %q, want epp-0", s.Replica)
		}
		served++
	}
	if served < 10 {
		t.Fatalf("only %d requests served", served)
	}
	lo, hi := int64(1<<62), int64(0)
	for _, r := range env.Fleet.Cores() {
		n := r.Stats().Requests
		lo, hi = min(lo, n), max(hi, n)
	}
	if hi-lo > 1 {
		t.Errorf("engines served %d to %d requests; round-robin through the EPP gives each its turn", lo, hi)
	}
	// The EPP's ext_proc server counts a stream once it ends, and the
	// gateway a request, which can be just after the client has read the
	// whole answer.
	reg := env.EPP.Registry()
	testkit.WaitFor(t, "every stream to end", func() error {
		if seen := testkit.Value(t, reg, "kvroute_extproc_active_streams"); seen != 0 {
			return fmt.Errorf("kvroute_extproc_active_streams is %v, want 0", seen)
		}
		if got := testkit.Value(t, env.Gateway.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeServed); int(got) != served {
			return fmt.Errorf("the gateway counted %v served of the %d the client saw served", got, served)
		}
		return nil
	})
	if got := testkit.Value(t, reg, "kvroute_extproc_streams_total"); int(got) != served {
		t.Errorf("the EPP's ext_proc server had %v streams for the %d requests served", got, served)
	}
}

// The proxy front stays available: the same run through the EPP's
// standalone proxy, no gateway.
func TestTheProxyFrontRoutesWithoutAGateway(t *testing.T) {
	ctx := context.Background()
	env, err := StartEnvShaped(ctx, PolicyPrecise, tinyFleet(), 5, Shape{Front: FrontProxy})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 256, QuestionTokens: 16}
	res := env.Run(ctx, w, RunOptions{Model: "sim-model", Rate: 20, Duration: time.Second, Drain: 5 * time.Second, MaxTokens: 2, Seed: 5})
	if env.Gateway != nil {
		t.Fatal("the proxy front started a gateway")
	}
	s := Summarize(res.Samples, res.Makespan)
	if s.Requests < 5 || s.Errors > 0 {
		t.Fatalf("%d requests, %d errors", s.Requests, s.Errors)
	}
	testkit.WaitFor(t, "the proxy to count every request", func() error {
		if got := testkit.Value(t, env.EPP.Registry(), "kvroute_proxy_requests_total"); int(got) != s.Requests {
			return fmt.Errorf("the proxy answered %v of %d requests", got, s.Requests)
		}
		return nil
	})
}

// With two and three replicas behind the gateway, each its own EPP fed
// by NATS, every replica picks a share of a run's requests and every
// request is served (at a rate three EPPs under the race detector carry
// on a loaded machine).
func TestEveryReplicaBehindTheGatewayPicks(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			ctx := context.Background()
			env, err := StartEnvShaped(ctx, PolicyPrecise, tinyFleet(), 9, Shape{Replicas: n})
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 256, QuestionTokens: 16}
			res := env.Run(ctx, w, RunOptions{Model: "sim-model", Rate: 12, Duration: 2 * time.Second, Drain: 5 * time.Second, MaxTokens: 2, Seed: 9})
			by, served := map[string]int{}, 0
			for _, s := range res.Samples {
				if s.Err != nil {
					t.Fatalf("a request failed: %v", s.Err)
				}
				if !s.Cut {
					by[s.Replica]++
					served++
				}
			}
			if len(by) != n {
				t.Fatalf("requests by replica %v, want all %d", by, n)
			}
			// Round-robin gives each its turn; a replica a slow health
			// check took out for a while gets fewer, but still its share.
			for name, k := range by {
				if 2*n*k < served {
					t.Errorf("replica %s picked %d of %d requests", name, k, served)
				}
			}
		})
	}
}

// A bypass share reaches the engines through the second gateway,
// round-robin, passing no EPP: what the engines served is what the two
// gateways sent them.
func TestABypassShareReachesTheEnginesPastTheEPP(t *testing.T) {
	ctx := context.Background()
	env, err := StartEnvShaped(ctx, PolicyPrecise, tinyFleet(), 11, Shape{Bypass: 0.3})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 256, QuestionTokens: 16}
	res := env.Run(ctx, w, RunOptions{Model: "sim-model", Rate: 40, Duration: 2 * time.Second, Drain: 5 * time.Second, MaxTokens: 2, Seed: 11})
	var bypassed, through int
	for _, s := range res.Samples {
		switch {
		case s.Err != nil:
			t.Fatalf("a request failed: %v", s.Err)
		case s.Bypass:
			bypassed++
			if s.Replica != "" {
				t.Errorf("a bypassing request passed EPP %q", s.Replica)
			}
		default:
			through++
		}
	}
	if bypassed == 0 || through == 0 {
		t.Fatalf("%d bypassed, %d through the EPP: want both", bypassed, through)
	}
	testkit.WaitFor(t, "the gateways to count their requests", func() error {
		if got := testkit.Value(t, env.Bypass.Registry(), "kvroute_gateway_requests_total", "outcome", gateway.OutcomeServed); int(got) != bypassed {
			return fmt.Errorf("the bypass gateway counted %v served, the client sent it %d", got, bypassed)
		}
		return nil
	})
	if got := testkit.Value(t, env.EPP.Registry(), "kvroute_picks_total"); int(got) != through {
		t.Errorf("the EPP picked %v times for the %d requests sent through it", got, through)
	}
	var total int64
	for _, c := range env.Fleet.Cores() {
		total += c.Stats().Requests
	}
	if int(total) != bypassed+through {
		t.Errorf("the engines served %d requests, the gateways sent %d", total, bypassed+through)
	}
}

// An EPP restart in the middle of a run: the old replica's requests in
// flight are the only ones lost, the new replica picks once ready, and
// the run reports when it was back at steady state. The run is long enough
// for a replica that takes seconds to catch up on a loaded machine, and
// its rate low enough for the replica left alone to carry it under the
// race detector.
func TestAnEPPRestartMidRunIsMeasured(t *testing.T) {
	ctx := context.Background()
	env, err := StartEnvShaped(ctx, PolicyPrecise, tinyFleet(), 13, Shape{Replicas: 2, RestartAt: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer env.Close()
	w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 256, QuestionTokens: 16}
	res := env.Run(ctx, w, RunOptions{Model: "sim-model", Rate: 12, Duration: 8 * time.Second, Drain: 5 * time.Second, MaxTokens: 2, Seed: 13})
	r := res.Restart
	if r == nil {
		t.Fatal("no restart reported")
	}
	t.Logf("stopped %s at %s, %s ready at %s, steady hit rate %.2f, %d new picks, %s", r.Old, r.StopAt, r.New, r.ReadyAt, r.Steady, r.NewPicks, r.Verdict())
	if r.Old != "epp-0" || r.New == "" || r.ReadyAt <= r.StopAt || r.StopAt < 1500*time.Millisecond {
		t.Errorf("restart %+v: want epp-0 stopped at 1.5s or after, its successor ready later", r)
	}
	if r.NewPicks == 0 || r.Steady <= 0 || len(r.Timeline) < 4 {
		t.Errorf("restart %+v: want picks by the new replica, a steady hit rate and a timeline", r)
	}
	failed := 0
	for _, s := range res.Samples {
		if s.Err != nil {
			failed++
			if s.Start >= r.StopAt {
				t.Errorf("a request that started after the stop failed: %v", s.Err)
			}
		}
	}
	g := env.Gateway.Registry()
	lost := testkit.Value(t, g, "kvroute_gateway_requests_total", "outcome", gateway.OutcomeCut) +
		testkit.Value(t, g, "kvroute_gateway_requests_total", "outcome", gateway.OutcomeExtProcError)
	if float64(failed) != lost {
		t.Errorf("%d requests failed; the gateway counted %v lost with their streams", failed, lost)
	}
}

// With Seeds, a point is the run of the median TTFT p90 among its seeds'
// runs, each as a run with that seed alone would be.
func TestSeedsKeepThePointsMedianRun(t *testing.T) {
	o := BenchOptions{
		Plans: []Plan{{
			Workload: Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 3, SystemTokens: 256, QuestionTokens: 32},
			Rates:    []float64{150},
		}},
		Policies: []string{PolicyRandom},
		Fleet:    tinyFleet(), Duration: 2 * time.Second, Drain: 5 * time.Second, MaxTokens: 16, Seed: 6,
		Virtual: true,
	}
	var alone []Point
	for k := range 3 {
		one := o
		one.Seed += uint64(k)
		pts, err := Bench(context.Background(), one)
		if err != nil {
			t.Fatal(err)
		}
		alone = append(alone, pts[0])
	}
	if alone[0].TTFTp90 == alone[1].TTFTp90 && alone[1].TTFTp90 == alone[2].TTFTp90 {
		t.Fatalf("the three seeds' runs have one TTFT p90 (%v): the test cannot tell them apart", alone[0].TTFTp90)
	}
	o.Seeds = 3
	pts, err := Bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if len(pts) != 1 {
		t.Fatalf("got %d points, want 1", len(pts))
	}
	if want := MedianRun(alone); pts[0] != want {
		t.Errorf("point %+v, want the median run %+v", pts[0], want)
	}
	p90s := []time.Duration{alone[0].TTFTp90, alone[1].TTFTp90, alone[2].TTFTp90}
	if m := MedianRun(alone); m == alone[0] || m == alone[2] {
		t.Fatalf("the median of %v is the first or last seed's: the test cannot tell it from the first or last run", p90s)
	}
	slices.Sort(p90s)
	if pts[0].TTFTp90 != p90s[1] {
		t.Errorf("TTFT p90 %v, want the middle of %v", pts[0].TTFTp90, p90s)
	}
}

func TestMedianRunTakesTheLowerMiddleOfAnEvenCount(t *testing.T) {
	runs := []Point{{Rate: 1}, {Rate: 2}, {Rate: 3}, {Rate: 4}}
	for i, p90 := range []time.Duration{40, 10, 30, 20} {
		runs[i].TTFTp90 = p90
	}
	if got := MedianRun(runs); got.Rate != 4 {
		t.Errorf("median run %+v, want the one with p90 20 (rate 4)", got)
	}
	if runs[0].TTFTp90 != 40 {
		t.Errorf("MedianRun reordered its argument: %v", runs)
	}
}

// The report names the make target only when the command is the one the
// target runs.
func TestTheReportNamesItsMakeTargetOnlyWhenThatRan(t *testing.T) {
	o := BenchOptions{
		Plans: []Plan{{
			Workload: Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 256, QuestionTokens: 16},
			Rates:    []float64{50},
		}},
		Policies: []string{PolicyRandom},
		Fleet:    tinyFleet(), Duration: time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 3,
		Virtual: true,
	}
	pts, err := Bench(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ command, want, not string }{
		{"go run ./cmd/kvsim bench --virtual --seeds 25", "`go run ./cmd/kvsim bench --virtual --seeds 25` (`make bench-routing-virtual`) in", ""},
		{"go run ./cmd/kvsim bench --virtual -workloads tiny", "`go run ./cmd/kvsim bench --virtual -workloads tiny` in", "make bench-routing"},
	} {
		path := t.TempDir() + "/routing-benchmark.md"
		if err := WriteReport(path, o, pts, tc.command, time.Second); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		head, _, _ := strings.Cut(string(b), "\n\nFleet:")
		if !strings.Contains(head, tc.want) {
			t.Errorf("report opens %q, want it to contain %q", head, tc.want)
		}
		if tc.not != "" && strings.Contains(head, tc.not) {
			t.Errorf("report opens %q, naming %q for another command", head, tc.not)
		}
	}
}
