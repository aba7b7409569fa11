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

// TestGatewayPoliciesServeEveryRequest runs each policy that goes through
// the gateway (the upstream binary twice, kvroute on its file) on a tiny
// shared-prefix workload: every request is served, from an engine's
// cache more often than not, and the upstream EPP's output and report land
// in the run's folder.
func TestGatewayPoliciesServeEveryRequest(t *testing.T) {
	requireUpstream(t)
	out := t.TempDir()
	fo := tinyFleet()
	fo.OutDir = out
	w := Workload{Name: "tiny", Kind: KindSharedPrefix, Groups: 2, SystemTokens: 512, QuestionTokens: 16}
	for _, pol := range GatewayPolicies {
		t.Run(pol, func(t *testing.T) {
			ctx := context.Background()
			env, err := StartEnv(ctx, pol, fo, 9)
			if err != nil {
				t.Fatal(err)
			}
			ro := RunOptions{Model: fo.Model, Rate: 20, Duration: 1500 * time.Millisecond, Drain: 10 * time.Second, MaxTokens: 2, Seed: 9}
			res := env.Run(ctx, w, ro)
			if pol == PolicyUpstreamEPP {
				// A restarted EPP serves the next run through the same gateway.
				if err := env.RestartEPP(ctx); err != nil {
					t.Fatal(err)
				}
				if err := env.ring.waitHealthy(ctx); err != nil {
					t.Fatal(err)
				}
				ro.Seed++
				again := env.Run(ctx, w, ro)
				res.Samples = append(res.Samples, again.Samples...)
			} else if pol == PolicyKvrouteUpstreamConfig && env.RestartEPP(ctx) == nil {
				t.Errorf("RestartEPP of %s, which runs no EPP process, did not fail", pol)
			}
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
			report, err := os.ReadFile(filepath.Join(out, pol+".report.txt"))
			if err != nil {
				t.Fatal(err)
			}
			if pol != PolicyKvrouteUpstreamConfig {
				if !strings.Contains(string(report), upstreamepp.Version) {
					t.Errorf("report names no version:\n%s", report)
				}
				if log, err := os.ReadFile(filepath.Join(out, pol+".log")); err != nil || !strings.Contains(string(log), "=== start 1") {
					t.Errorf("the upstream EPP's log %s: %v", filepath.Join(out, pol+".log"), err)
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
