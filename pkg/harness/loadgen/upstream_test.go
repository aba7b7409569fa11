package loadgen

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
)

// requireUpstream fails under make test (KVROUTE_NO_SKIPS) or CI, and
// skips elsewhere, when the upstream EPP or envtest's binaries are not
// built.
func requireUpstream(t *testing.T) {
	t.Helper()
	_, errB := upstreamepp.Binary()
	_, errA := upstreamepp.Assets()
	if err := errors.Join(errB, errA); err != nil {
		if os.Getenv("KVROUTE_NO_SKIPS") != "" || os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// TestPoliciesOnPodsServeEveryRequest runs each policy on pod addresses
// (the upstream binary with either configuration, two replicas of it
// behind the gateway for the first; kvroute on the same file) on a tiny
// shared-prefix workload: every request is served, from an engine's cache
// more often than not, and the upstream EPP's output and report land in
// the run's folder.
func TestPoliciesOnPodsServeEveryRequest(t *testing.T) {
	requireUpstream(t)
	out := t.TempDir()
	fo := tinyFleet()
	fo.OutDir = out
	w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 512, QuestionTokens: 16}
	for _, pol := range UpstreamPolicies {
		t.Run(pol, func(t *testing.T) {
			ctx := context.Background()
			shape := Shape{}
			if pol == PolicyUpstreamEPP {
				shape.Replicas = 2
			}
			env, err := StartEnvShaped(ctx, pol, fo, 9, shape)
			if err != nil {
				t.Fatal(err)
			}
			res := env.Run(ctx, w, RunOptions{Model: fo.Model, Rate: 20, Duration: 1500 * time.Millisecond, Drain: 10 * time.Second, MaxTokens: 2, Seed: 9})
			report := env.Report()
			if err := env.Close(); err != nil {
				t.Fatal(err)
			}
			s := Summarize(res.Samples, res.Makespan)
			if s.Requests < 10 || s.Errors > 0 || s.Cut > 0 || s.Shed > 0 {
				t.Fatalf("%d requests, %d errors, %d cut, %d shed; first error: %v", s.Requests, s.Errors, s.Cut, s.Shed, firstErr(res.Samples))
			}
			// Two 512-token prefixes over three engines: most prompts
			// find theirs cached wherever a prefix-aware EPP sends them.
			if s.HitRate < 0.5 {
				t.Errorf("hit rate %.2f; a prefix-aware EPP keeps two groups' prefixes cached", s.HitRate)
			}
			if !upstreamBinary(pol) {
				if report != "" {
					t.Errorf("kvroute's replica reported as the upstream binary:\n%s", report)
				}
				return
			}
			if !strings.Contains(report, upstreamepp.Version) {
				t.Errorf("report names no version:\n%s", report)
			}
			for _, f := range []string{pol + "-epp-0.log", pol + "-epp-0.report.txt", pol + "-epp-0.metrics"} {
				if _, err := os.Stat(filepath.Join(out, f)); err != nil {
					t.Errorf("the upstream EPP left no %s: %v", f, err)
				}
			}
		})
	}
}

func firstErr(samples []Sample) error {
	for _, s := range samples {
		if s.Err != nil {
			return s.Err
		}
	}
	return nil
}

// TestTheUpstreamEPPPicksDataParallelPodsAndVLLMTheRank runs the upstream
// binary on two pods of two ranks each: it discovers each pod as one
// endpoint, serves every request, and names no rank, so that each pod's
// own balancing places every request on one of its ranks.
func TestTheUpstreamEPPPicksDataParallelPodsAndVLLMTheRank(t *testing.T) {
	requireUpstream(t)
	fo := tinyFleet()
	fo.Engines, fo.DataParallel, fo.OutDir = 2, 2, t.TempDir()
	if err := checkDPPolicy(PolicyUpstreamEPP, fo); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	env, err := StartEnv(ctx, PolicyUpstreamEPP, dpFleet(PolicyUpstreamEPP, fo), 5)
	if err != nil {
		t.Fatal(err)
	}
	w := Workload{Name: "tiny-dp", Kind: KindSharedPrefix, Groups: 4, SystemTokens: 256, QuestionTokens: 16}
	res := env.Run(ctx, w, RunOptions{Model: fo.Model, Rate: 30, Duration: 1500 * time.Millisecond, Drain: 10 * time.Second, MaxTokens: 4, Seed: 5})
	var served, pinned [][]int
	for _, s := range env.Fleet.Servers {
		sv, pn := s.RankServed()
		served, pinned = append(served, sv), append(pinned, pn)
	}
	if err := env.Close(); err != nil {
		t.Fatal(err)
	}
	s := Summarize(res.Samples, res.Makespan)
	if s.Requests < 20 || s.Errors > 0 || s.Cut > 0 {
		t.Fatalf("%d requests, %d errors, %d cut; first error: %v", s.Requests, s.Errors, s.Cut, firstErr(res.Samples))
	}
	if len(served) != 2 {
		t.Fatalf("%d API servers; the fleet has two pods", len(served))
	}
	total := 0
	for pod := range served {
		for rank, n := range served[pod] {
			total += n
			if pinned[pod][rank] > 0 {
				t.Errorf("pod %d rank %d: %d requests named their rank; the upstream EPP names none", pod, rank, pinned[pod][rank])
			}
		}
	}
	if total != s.Requests {
		t.Errorf("the ranks served %d requests of %d", total, s.Requests)
	}
}
