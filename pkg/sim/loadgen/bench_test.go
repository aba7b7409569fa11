package loadgen

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
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
