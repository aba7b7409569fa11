package loadgen

import (
	"context"
	"fmt"
	"io"
	"time"
)

// DemoOptions shape the newcomer's demo.
type DemoOptions struct {
	Fleet    FleetOptions
	Workload Workload
	Rate     float64
	Duration time.Duration
	// Serve keeps kvroute's environment serving after the comparison,
	// until ctx is done.
	Serve bool
	Out   io.Writer
}

// Demo runs the workload through kvroute's EPP (behind the gateway, fed
// the fleet's KV events over an embedded NATS server) and then through
// random routing on a fresh fleet, prints both side by side, and checks
// the EPP's index against the engines' true caches.
func Demo(ctx context.Context, o DemoOptions) error {
	out := o.Out
	run := RunOptions{Model: o.Fleet.Model, Rate: o.Rate, Duration: o.Duration, Drain: 10 * time.Second, MaxTokens: 16, Seed: 7}
	fmt.Fprintf(out, "fleet: %d simulated vLLM engines, block size %d, %d GPU blocks each; workload: %d groups sharing %d-token system prompts, %d-token questions, %.0f req/s for %s\n\n",
		o.Fleet.Engines, o.Fleet.Pool.BlockSize, o.Fleet.Pool.GPUBlocks, o.Workload.Groups, o.Workload.SystemTokens,
		o.Workload.QuestionTokens, o.Rate, o.Duration)

	rnd, err := StartEnv(ctx, PolicyRandom, o.Fleet, 7)
	if err != nil {
		return err
	}
	fmt.Fprintln(out, "random routing ...")
	rres := rnd.Run(ctx, o.Workload, run)
	if err := rnd.Close(); err != nil {
		return err
	}

	kv, err := StartEnv(ctx, DefaultPolicy, o.Fleet, 7)
	if err != nil {
		return err
	}
	defer kv.Close()
	fmt.Fprintf(out, "kvroute (gateway on %s, EPP ext_proc on %s, NATS at %s) ...\n", kv.Gateway.URL(), kv.EPP.ExtProcAddr(), kv.EPP.NATSURL())
	kres := kv.Run(ctx, o.Workload, run)

	r, k := Summarize(rres.Samples, rres.Makespan), Summarize(kres.Samples, kres.Makespan)
	fmt.Fprintf(out, "\n%-10s %9s %9s %9s %10s %8s\n", "routing", "requests", "TTFT p50", "TTFT p90", "cache hit", "errors")
	for _, row := range []struct {
		name string
		s    Summary
	}{{"random", r}, {"kvroute", k}} {
		fmt.Fprintf(out, "%-10s %9d %9s %9s %9.1f%% %8d\n", row.name, row.s.Requests, ms(row.s.TTFTp50), ms(row.s.TTFTp90), 100*row.s.HitRate, row.s.Errors)
	}
	fmt.Fprintf(out, "kvroute's TTFT p90 (its default profile, %s) is %s than random's\n", DefaultPolicy, Compare(k.TTFTp90, r.TTFTp90))

	// Events still in flight would make the check race them.
	time.Sleep(200 * time.Millisecond)
	c, err := kv.CheckIndex(ctx, SamplePrompts(o.Workload, run.Seed, 48))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "index vs engines' true caches: %d/%d (prompt, endpoint) answers exact", c.Agree, c.Total)
	if c.FirstMiss != "" {
		fmt.Fprintf(out, " (first difference: %s)", c.FirstMiss)
	}
	fmt.Fprintln(out)
	if !o.Serve {
		return nil
	}
	fmt.Fprintf(out, "\nserving until interrupted; try:\n  curl -s %s/v1/completions -H 'Content-Type: application/json' -d '{\"model\":%q,\"prompt\":\"hello kvroute hello kvroute\",\"max_tokens\":8}'\n",
		kv.Gateway.URL(), o.Fleet.Model)
	fmt.Fprintf(out, "EPP metrics: http://%s/metrics   /debug/prefix: http://%s/debug/prefix   engines:", kv.EPP.HTTPAddr(), kv.EPP.DebugAddr())
	for _, s := range kv.Fleet.Servers {
		fmt.Fprintf(out, " http://%s", s.Addr())
	}
	fmt.Fprintln(out)
	<-ctx.Done()
	return nil
}

// Compare says how a compares with b, the way a reader wants it: "2.3×
// lower" when a is below b, "1.2× higher" when above, "no different" when
// equal (or either is unknown).
func Compare(a, b time.Duration) string {
	switch {
	case a <= 0 || b <= 0 || a == b:
		return "no different"
	case a < b:
		return fmt.Sprintf("%.1f× lower", float64(b)/float64(a))
	}
	return fmt.Sprintf("%.1f× higher", float64(a)/float64(b))
}
