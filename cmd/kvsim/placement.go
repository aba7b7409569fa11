package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/loadgen"
	"github.com/kvroute/kvroute/pkg/predict"
)

// placement runs the cache-capacity placement study in virtual time:
// prefix groups that fit the fleet's GPU caches only if each engine holds
// no more of them than its cache fits, on engine timing the predictor's
// prior and the scheduler replay were not written for (whole-prompt
// prefill, a prefill cost per token other than the prior's). Per policy
// and seed it prints the hit rate against the ideal (every group's first
// request cold, every other one hitting its group's system prompt), TTFT
// p50 and p90, requests and GPU blocks evicted per engine, and for the
// EPP's predictor its TTFT error and p90 coverage over the run, scored
// online as it learned.
func placement(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvsim placement", flag.ContinueOnError)
	var ff fleetFlags
	ff.register(fs, 4, 400)
	maxBatched := fs.Int("max-batched-tokens", 0, "the engines' step token budget (0: none, every prompt prefilled whole in one step)")
	groups := fs.Int("groups", 8, "prefix groups")
	system := fs.Int("system-tokens", 2560, "tokens of each group's system prompt")
	question := fs.Int("question-tokens", 64, "tokens of each request's own question")
	rate := fs.Float64("rate", 8, "requests per second")
	dur := fs.Duration("duration", 12*time.Second, "arrivals per run")
	slo := fs.Duration("slo", 250*time.Millisecond, "every request's TTFT SLO (0: none)")
	seeds := fs.Int("seeds", 9, "runs per policy, seeds 1 to this")
	policies := fs.String("policies", strings.Join([]string{loadgen.PolicyPredicted, loadgen.PolicyPrecise, loadgen.PolicyApprox}, ","), "policies to compare")
	fs.Lookup("prefill-per-token").DefValue = "80µs"
	if err := fs.Set("prefill-per-token", "80us"); err != nil {
		return err
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	fo, err := ff.options()
	if err != nil {
		return err
	}
	if *groups <= 0 || *system <= 0 || *question < 0 || !(*rate > 0) || *seeds <= 0 || *maxBatched < 0 {
		return fmt.Errorf("kvsim placement: --groups, --system-tokens, --rate and --seeds must be positive, --question-tokens and --max-batched-tokens not negative")
	}
	fo.Timing.MaxBatchedTokens = *maxBatched
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	w := loadgen.Workload{Name: "placement", Kind: loadgen.KindSharedPrefix, Groups: *groups,
		SystemTokens: *system, QuestionTokens: *question, SLO: *slo}
	fmt.Printf("%d engines of %d GPU blocks of %d tokens; %d groups of %d-token system prompts (%d blocks) + %d-token questions at %.3g req/s for %s; step budget %d, prefill %s/token\n",
		fo.Engines, fo.Pool.GPUBlocks, fo.Pool.BlockSize, *groups, *system, *system/fo.Pool.BlockSize, *question, *rate, *dur, *maxBatched, fo.Timing.PrefillPerToken)
	fmt.Println("| policy | seed | requests | hit rate | ideal | TTFT p50 | TTFT p90 | requests per engine | GPU blocks evicted per engine | predictor TTFT MAPE, p90 coverage |")
	fmt.Println("|---|---:|---:|---:|---:|---:|---:|---|---|---|")
	for _, pol := range strings.Split(*policies, ",") {
		for seed := 1; seed <= *seeds; seed++ {
			var trace []predict.Sample
			res, err := loadgen.RunVirtual(ctx, pol, fo, w, loadgen.RunOptions{
				Model: fo.Model, Rate: *rate, Duration: *dur, Drain: 5 * time.Second, MaxTokens: 32, Seed: uint64(seed),
				Record: func(s predict.Sample) { trace = append(trace, s) },
			})
			if err != nil {
				return err
			}
			sum := loadgen.Summarize(res.Samples, res.Makespan)
			per := make([]int, fo.Engines)
			for _, s := range res.Samples {
				if s.Engine >= 0 && s.Engine < len(per) {
					per[s.Engine]++
				}
			}
			acc := "—"
			if len(trace) > 0 {
				ev, err := predict.Evaluate(predict.Options{}, nil, trace, true)
				if err != nil {
					return err
				}
				acc = fmt.Sprintf("%.1f%%, %.1f%%", 100*ev.TTFT.MAPE, 100*ev.TTFT.Coverage)
			}
			// The ideal: one cold request per group, the rest hitting
			// its system prompt's full blocks.
			served := sum.Requests - sum.Errors - sum.Shed
			cached := max(served-*groups, 0) * (*system / fo.Pool.BlockSize * fo.Pool.BlockSize)
			ideal := 0.0
			if served > 0 {
				ideal = float64(cached) / float64(served*(*system+*question))
			}
			fmt.Printf("| %s | %d | %d | %.1f%% | %.1f%% | %s | %s | %v | %v | %s |\n", pol, seed, sum.Requests, 100*sum.HitRate, 100*ideal,
				ms(sum.TTFTp50), ms(sum.TTFTp90), per, res.Evicted, acc)
		}
	}
	return nil
}

// ms formats a duration in milliseconds, to a tenth.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
