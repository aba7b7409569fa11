package loadgen

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
)

// TestThePredictorsAccuracyIsReportedForPoliciesThatRunIt runs a policy
// with the latency predictor and one without in virtual time: the first
// reports its TTFT accuracy over the responses it served, the second none.
func TestThePredictorsAccuracyIsReportedForPoliciesThatRunIt(t *testing.T) {
	t.Parallel()
	fo := tinyFleet()
	w := Workload{Name: "groups", Kind: KindSharedPrefix, Groups: 4, SystemTokens: 512, QuestionTokens: 16}
	o := RunOptions{Model: fo.Model, Rate: 40, Duration: 2 * time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 5}
	res, err := RunVirtual(context.Background(), PolicyPredicted, fo, w, o)
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(res.Samples, res.Makespan)
	a := res.Predictor
	if a == nil {
		t.Fatal("the predicted-latency policy reported no predictor accuracy")
	}
	// Every served response was picked first and compared once.
	if a.N != s.Requests || a.Quantiles != s.Requests {
		t.Errorf("predictor compared %d (%d against the quantile) responses, the run served %d", a.N, a.Quantiles, s.Requests)
	}
	if !(a.MAPE > 0) || a.Coverage <= 0 || a.Coverage > 1 {
		t.Errorf("accuracy %+v: want a positive MAPE and a coverage in (0, 1]", *a)
	}
	res, err = RunVirtual(context.Background(), PolicyPrecise, fo, w, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.Predictor != nil {
		t.Errorf("kvroute-precise runs no predictor, yet reported %+v", *res.Predictor)
	}
	var b strings.Builder
	WritePredictorTable(&b, []Point{{Workload: "groups", Policy: PolicyPredicted, Rate: 40, Predictor: a}})
	if !strings.Contains(b.String(), "| groups | 40.0 | "+PolicyPredicted+" |") {
		t.Errorf("the predictor table lacks the run:\n%s", b.String())
	}
}

// TestAFamilyReachesTheVirtualFleetsEngines runs the same traffic on
// engines of a family that publishes no KV events for its first seconds,
// counted on the run's virtual clock: kvroute's index hears every engine
// once a silence shorter than the run ends, and none when it outlasts it.
func TestAFamilyReachesTheVirtualFleetsEngines(t *testing.T) {
	t.Parallel()
	w := Workload{Name: "groups", Kind: KindSharedPrefix, Groups: 6, SystemTokens: 1024, QuestionTokens: 16}
	o := RunOptions{Model: "sim-model", Rate: 40, Duration: 3 * time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 3}
	for family, heard := range map[string]bool{"vllm": true, "no-chunk,silent=1s": true, "fifo,silent=1h": false} {
		fo := tinyFleet()
		var err error
		if fo.Family, err = sim.ParseFamily(family); err != nil {
			t.Fatal(err)
		}
		v, err := newVirtualRun(PolicyPrecise, fo, o.Seed, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := v.run(context.Background(), w, o)
		if err != nil {
			v.close()
			t.Fatal(err)
		}
		if s := Summarize(res.Samples, res.Makespan); s.Requests < 100 || s.Errors > 0 {
			t.Errorf("%s: %d requests, %d errors", family, s.Requests, s.Errors)
		}
		for _, r := range v.replicas {
			cfg := r.Engine().Config()
			if cfg.Family != fo.Family {
				t.Errorf("%s: engine %s runs family %v", family, cfg.Pod, cfg.Family)
			}
			if _, _, ok := v.eppSrv.Index().StreamPosition(events.Stream{Endpoint: cfg.Address}); ok != heard {
				t.Errorf("%s: the index heard engine %s: %v, want %v", family, cfg.Pod, ok, heard)
			}
		}
		v.close()
	}
}

// TestTheCachePressurePlansDemandWhatTheyClaim checks the cache-pressure
// workloads against the benchmark's fleet (4 engines, 16-token blocks):
// many customers with long contexts, whose demand on the GPU cache is
// between 0.7× and 1.5× the fleet's, one with a CPU tier that holds the
// excess, and the ring's two beyond the default ladder's 0.75×.
func TestTheCachePressurePlansDemandWhatTheyClaim(t *testing.T) {
	t.Parallel()
	const engines, bs = 4, 16
	found := 0
	for _, p := range DefaultPlans(false) {
		if !strings.HasPrefix(p.Workload.Name, "cache-pressure") {
			continue
		}
		found++
		w := p.Workload
		demand := float64(w.Groups*w.SystemTokens/bs) / float64(engines*p.GPUBlocks)
		if w.Groups < 16 || w.SystemTokens < 4096 || demand < 0.7 || demand > 1.5 {
			t.Errorf("%s: %d customers of %d tokens, demand %.2f× the GPU cache", w.Name, w.Groups, w.SystemTokens, demand)
		}
		if p.CPUBlocks > 0 && float64(w.Groups*w.SystemTokens/bs) > float64(engines*(p.GPUBlocks+p.CPUBlocks)) {
			t.Errorf("%s: the CPU tier does not hold what the GPU cache cannot", w.Name)
		}
		if len(p.Rates) == 0 {
			t.Errorf("%s: no rates", w.Name)
		}
	}
	if found != 4 {
		t.Errorf("found %d cache-pressure plans, want cache-pressure, cache-pressure-cpu, cache-pressure-1x and cache-pressure-1.5x", found)
	}
	var b strings.Builder
	b.WriteString(demandNotes(BenchOptions{Plans: DefaultPlans(false), Fleet: FleetOptions{Engines: engines, Pool: tinyFleet().Pool}}))
	for _, want := range []string{
		"cache-pressure's demand on the KV cache: 24 contexts × 256 blocks",
		"cache-pressure-1x's demand on the KV cache: 32 contexts × 256 blocks (4096 tokens of 16) = 8192 blocks, 1.00×",
		"cache-pressure-1.5x's demand on the KV cache: 48 contexts × 256 blocks (4096 tokens of 16) = 12288 blocks, 1.50×",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report's demand notes do not state %q:\n%s", want, b.String())
		}
	}
}
