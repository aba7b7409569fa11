package loadgen

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestARankPickKeepsEachGroupOnItsRank runs the data-parallel policies in
// virtual time on two pods of four ranks each, with more groups of prompts
// than a rank can hold: naming the rank must find the cache nearly as well
// as one rank per pod does (within 15% on this tight a cache, three
// groups a rank: 0.87 against 0.96 on this seed; the benchmark's plans
// hold it to 5%), and far better than vLLM's balancing.
func TestARankPickKeepsEachGroupOnItsRank(t *testing.T) {
	t.Parallel()
	fo := tinyFleet()
	fo.Engines, fo.DataParallel, fo.Pool.GPUBlocks = 2, 4, 192
	w := Workload{Name: "groups", Kind: KindSharedPrefix, Groups: 8, SystemTokens: 1024, QuestionTokens: 16}
	o := RunOptions{Model: fo.Model, Rate: 40, Duration: 6 * time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 3}
	hit := map[string]float64{}
	for _, pol := range DPPolicies {
		ff := dpFleet(pol, fo)
		if err := checkDPPolicy(pol, ff); err != nil && pol != PolicyDPRankPerPod {
			t.Fatal(err)
		}
		res, err := RunVirtual(context.Background(), pol, ff, w, o)
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		s := Summarize(res.Samples, res.Makespan)
		if s.Requests < 200 || s.Errors > 0 {
			t.Fatalf("%s: %d requests, %d errors", pol, s.Requests, s.Errors)
		}
		hit[pol] = s.HitRate
		t.Logf("%-16s hit %.2f  TTFT p90 %v", pol, s.HitRate, s.TTFTp90)
	}
	if r, per, v := hit[PolicyDPRankPick], hit[PolicyDPRankPerPod], hit[PolicyDPVLLMBalance]; r < 0.85*per || r < v+0.15 {
		t.Errorf("hit rates: rank pick %.2f, one rank per pod %.2f, vLLM's balancing %.2f", r, per, v)
	}
	if err := checkDPPolicy(PolicyPredicted, fo); err == nil {
		t.Error("a policy that knows no ranks ran on data-parallel engines")
	}
}

func TestTheDPReportListsEveryPointAndItsChecks(t *testing.T) {
	t.Parallel()
	var pts []Point
	for _, rate := range []float64{10, 20} {
		pts = append(pts,
			Point{Workload: "dp", Policy: PolicyDPVLLMBalance, Rate: rate, Summary: Summary{HitRate: 0.3, TTFTp90: 200 * time.Millisecond}},
			Point{Workload: "dp", Policy: PolicyDPRankPick, Rate: rate, Summary: Summary{HitRate: 0.9, TTFTp90: 20 * time.Millisecond}},
			Point{Workload: "dp", Policy: PolicyDPRankPerPod, Rate: rate, Summary: Summary{HitRate: 0.93, TTFTp90: 19 * time.Millisecond}})
	}
	checks := DPChecks(pts)
	if len(checks) != 2 || checks[0].Outcome != Pass || checks[1].Outcome != Pass {
		t.Fatalf("checks: %+v", checks)
	}
	pts[4].HitRate = 0.8 // rank pick at 20 req/s, below 0.95 × 0.93
	if c := DPChecks(pts); c[0].Outcome != Fail {
		t.Fatalf("a hit rate 14%% below one rank per pod's passed: %+v", c[0])
	}
	path := filepath.Join(t.TempDir(), "routing-benchmark.md")
	if err := WriteDPReport(path, BenchOptions{Plans: DPPlans(), Seed: 1}, pts, "test", time.Second); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| 20 | **dp-rank-pick** |", "| 10 | dp-vllm-balance |", "| 20 | dp-rank-per-pod |", "**fail**"} {
		if !strings.Contains(string(md), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

// TestTheDPReportComparesTheRankPickWithTheUpstreamEPP: with the upstream
// EPP's points, the report describes it among the policies, lists its
// rows and checks the rank pick's TTFT against it.
func TestTheDPReportComparesTheRankPickWithTheUpstreamEPP(t *testing.T) {
	t.Parallel()
	pts := []Point{
		{Workload: "dp", Policy: PolicyDPVLLMBalance, Rate: 10, Summary: Summary{HitRate: 0.3, TTFTp90: 200 * time.Millisecond}},
		{Workload: "dp", Policy: PolicyDPRankPick, Rate: 10, Summary: Summary{HitRate: 0.9, TTFTp90: 20 * time.Millisecond}},
		{Workload: "dp", Policy: PolicyUpstreamEPP, Rate: 10, Summary: Summary{HitRate: 0.4, TTFTp90: 15 * time.Millisecond}},
	}
	checks := DPChecks(pts)
	if len(checks) != 2 || checks[1].Outcome != Fail || !strings.Contains(checks[1].Claim, PolicyUpstreamEPP) {
		t.Fatalf("a rank pick slower than the upstream EPP's passed or went unchecked: %+v", checks)
	}
	path := filepath.Join(t.TempDir(), "routing-benchmark.md")
	o := BenchOptions{Plans: DPPlans(), Seed: 1, Policies: DPRealTimePolicies}
	if err := WriteDPReport(path, o, pts, "test", time.Second); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| upstream-epp | left to vLLM's API server", "| 10 | upstream-epp |", "not in this table"} {
		if got := strings.Contains(string(md), want); got != (want != "not in this table") {
			t.Errorf("the report has %q: %v", want, got)
		}
	}
	if err := checkDPPolicy(PolicyKvrouteUpstreamConfig, FleetOptions{Engines: 2, DataParallel: 4}); err == nil {
		t.Error("kvroute on upstream's file, which knows no ranks, ran on data-parallel engines")
	}
}
