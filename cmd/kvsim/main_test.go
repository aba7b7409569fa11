package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/loadgen"
)

func TestBadCommandLinesAreRefusedClearly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no command prints usage", nil, "usage: kvsim"},
		{"an unknown command is named", []string{"fly"}, `unknown command "fly"`},
		{"an unknown encoding is named", []string{"serve", "--encoding", "xml"}, `--encoding must be array, map or mixed, not "xml"`},
		{"an unknown event output is named", []string{"serve", "--events", "kafka"}, `--events must be nats, zmq, both or none, not "kafka"`},
		{"a fleet needs engines", []string{"demo", "--engines", "0"}, "must be positive"},
		{"a bad rate is named", []string{"bench", "--rates", "1,x"}, `--rates: "x" is not a positive number`},
		{"an unknown workload matches nothing", []string{"bench", "--workloads", "nope"}, `--workloads "nope" matches none`},
		{"a placement study needs groups", []string{"placement", "--groups", "0"}, "must be positive"},
		{"a placement study names an unknown policy", []string{"placement", "--seeds", "1", "--duration", "1s", "--policies", "nope"}, `"nope"`},
		{"an unknown front is named", []string{"bench", "--front", "nginx"}, `--front "nginx": gateway or proxy`},
		{"replicas are real time only", []string{"bench", "--virtual", "--replicas", "2"}, "2 EPP replicas is real time only"},
		{"a restart is real time only", []string{"bench", "--virtual", "--restart-at", "2s"}, "an EPP restart at 2s is real time only"},
		{"a P/D fleet is real time only", []string{"bench", "--pd", "--virtual"}, "--pd: a P/D fleet runs in real time only"},
		{"the P/D plan's workload is the one selected", []string{"bench", "--pd", "--workloads", "agent"}, `--workloads "agent" matches none`},
		{"the P/D topology fleet is real time only", []string{"bench", "--pd-topology", "--virtual"}, "--pd-topology: a P/D fleet runs in real time only"},
		{"one P/D workload at a time", []string{"bench", "--pd-topology", "--pd"}, "give --pd or --pd-topology, not both"},
		{"the P/D topology plan's workload is the one selected", []string{"bench", "--pd-topology", "--workloads", "pd"}, `--workloads "pd" matches none`},
		{"the upstream EPP on data-parallel pods is real time only", []string{"bench", "--dp", "--virtual", "--quick", "--policies", "upstream-epp", "--out", os.DevNull}, "upstream-epp runs the upstream binary, in real time only"},
		{"a policy that knows no ranks is refused data-parallel pods", []string{"bench", "--dp", "--virtual", "--quick", "--policies", "kvroute-predicted-latency", "--out", os.DevNull}, "on data-parallel engines: use"},
		{"the tenants' workload is real time only", []string{"bench", "--tenants", "--virtual"}, "--tenants: real time only"},
		{"the tenants' plan's workload is the one selected", []string{"bench", "--tenants", "--workloads", "agent"}, `--workloads "agent" matches none`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := run(context.Background(), tt.args)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("run(%q) = %v, want an error containing %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestServeRunsUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := run(ctx, []string{"serve", "--events", "none", "--engines", "2", "--gpu-blocks", "64"}); err != nil {
		t.Fatal(err)
	}
}

func TestSelectPlansFiltersAndOverridesRates(t *testing.T) {
	t.Parallel()
	got, err := selectPlans(loadgen.DefaultPlans(false), "unrelated,multi-turn", "3, 5")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Workload.Name != "multi-turn" || got[1].Workload.Name != "unrelated" {
		t.Fatalf("got %+v", got)
	}
	for _, p := range got {
		if len(p.Rates) != 2 || p.Rates[0] != 3 || p.Rates[1] != 5 {
			t.Errorf("%s rates = %v, want [3 5]", p.Workload.Name, p.Rates)
		}
	}
}

// predict-eval on one short pair writes a table with a row per method and
// evaluation, and the two linear rows that show how far the features go.
func TestPredictEvalWritesEveryRow(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "eval.md")
	if err := run(context.Background(), []string{"predict-eval", "-workloads", "unrelated", "-pairs", "1", "-duration", "2s", "-out", out}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| unrelated | — | prior only (no learning) |",
		"| unrelated | ewls | trained, learning on (prequential) |",
		"| unrelated | quantile-sgd | trained, then frozen |",
		"| unrelated | linear (least absolute relative error) | one linear model, fitted on the training trace, frozen |",
		"| unrelated | linear (least absolute relative error) | one linear model, fitted on the test trace itself (a bound) |",
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the table has no row %q:\n%s", want, b)
		}
	}
}
