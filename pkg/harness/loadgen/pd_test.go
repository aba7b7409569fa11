package loadgen

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// tinyPDFleet is one prefill and two decode engines, fast.
func tinyPDFleet() FleetOptions {
	return FleetOptions{
		Engines: 3, Model: "sim-model",
		Pool:     blockpool.Config{BlockSize: 16, GPUBlocks: 512},
		Timing:   sim.Timing{PrefillPerToken: 20 * time.Microsecond, DecodeStep: 2 * time.Millisecond, MaxSeqs: 4},
		Roles:    []string{sim.RolePrefill, sim.RoleDecode, sim.RoleDecode},
		Transfer: PDTransfer,
	}
}

// decisions are the EPP's P/D decisions by decision_type.
func decisions(env *Env) (map[string]float64, error) {
	fams, err := env.EPP.Registry().Gather()
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "llm_d_epp_disagg_decision_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision_type" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out, nil
}

// A P/D run through the gateway, the EPP over ext_proc and a P/D sidecar
// before each decode engine: every reply comes from a decode engine, the
// prefill engine serves exactly the prefill legs the sidecars sent, and
// the split ratio the run reports is the one the EPP's decisions imply.
func TestAPDRunSplitsAsTheDeciderSaysAndRepliesOnlyFromDecodeEngines(t *testing.T) {
	for _, policy := range []string{PolicyPDExact, PolicyPDPredicted, PolicyPDDecodeOnly} {
		t.Run(policy, func(t *testing.T) {
			ctx := context.Background()
			env, err := StartEnv(ctx, policy, tinyPDFleet(), 3)
			if err != nil {
				t.Fatal(err)
			}
			defer env.Close()
			w := Workload{Name: "tiny-pd", Kind: KindPD, Groups: 2, SystemTokens: 512, QuestionTokens: 32, Turns: 3,
				ShortShare: 0.5, ShortTokens: 24}
			const maxTokens = 4
			res := env.Run(ctx, w, RunOptions{Model: "sim-model", Rate: 20, Duration: 1500 * time.Millisecond, Drain: 10 * time.Second,
				MaxTokens: maxTokens, ThinkTime: 20 * time.Millisecond, Seed: 3})
			served, output := 0, int64(0)
			for _, s := range res.Samples {
				if s.Err != nil || s.Shed || s.Cut {
					t.Fatalf("a request failed: %+v; the gateway's failures: %+v", s, env.Gateway.RecentFailures())
				}
				if s.OutputTokens != maxTokens {
					t.Fatalf("a reply of %d tokens, want %d (a prefill leg's one token reached the client?)", s.OutputTokens, maxTokens)
				}
				served++
				output += int64(s.OutputTokens)
			}
			if served < 10 {
				t.Fatalf("only %d requests served", served)
			}
			pd := res.PD
			if pd == nil {
				t.Fatal("a P/D run reported no P/D figures")
			}
			var decodeReqs, decodeTokens, prefillReqs int64
			for _, c := range env.Fleet.Cores() {
				st := c.Stats()
				switch c.Engine().Config().Role {
				case sim.RoleDecode:
					decodeReqs += st.Requests
					decodeTokens += st.GenerationTokens
				case sim.RolePrefill:
					prefillReqs += st.Requests
				}
			}
			if decodeReqs != int64(served) || decodeTokens != output {
				t.Errorf("decode engines served %d requests and %d tokens; the client got %d replies of %d tokens", decodeReqs, decodeTokens, served, output)
			}
			if prefillReqs != pd.Split || pd.Split+pd.Local != int64(served) {
				t.Errorf("the prefill engine served %d requests; the sidecars split %d and passed %d of %d", prefillReqs, pd.Split, pd.Local, served)
			}
			// The EPP counts a decision as its ext_proc stream ends, which
			// can follow the client's last read.
			testkit.WaitFor(t, "the EPP's decisions match the sidecars' splits", func() error {
				d, err := decisions(env)
				if err != nil {
					return err
				}
				split, local := int64(d["prefill-decode"]), int64(d["decode-only"])
				if policy == PolicyPDDecodeOnly {
					// No profile handler, no decision to count: every
					// request must have stayed on its decode pod.
					if len(d) != 0 {
						return fmt.Errorf("decode-only counted decisions %v", d)
					}
					local = int64(served)
				}
				if split != pd.Split || local != pd.Local {
					return fmt.Errorf("the EPP decided %d splits and %d decode-only; the sidecars saw %d and %d", split, local, pd.Split, pd.Local)
				}
				return nil
			})
			if want := float64(pd.Split) / float64(served); pd.SplitRatio != want {
				t.Errorf("split ratio %v, want %v", pd.SplitRatio, want)
			}
			if policy == PolicyPDExact && pd.Split == 0 {
				t.Error("the exact threshold decider (16 uncached tokens) split nothing")
			}
			if policy == PolicyPDDecodeOnly && (pd.Split != 0 || pd.PrefillBusy != 0) {
				t.Errorf("decode-only split %d requests, prefill busy %v", pd.Split, pd.PrefillBusy)
			}
		})
	}
}

// The P/D checks judge the default's TTFT p90 against the best of the
// five at each rate, and its throughput against always-split's as the
// output tokens delivered over the same seeds.
func TestThePDChecksJudgeTheDefaultAgainstTheFive(t *testing.T) {
	t.Parallel()
	pt := func(pol string, rate float64, p90 time.Duration, seedTokens ...int) Point {
		tps := make([]float64, len(seedTokens))
		for i, n := range seedTokens {
			tps[i] = float64(n) / 12
		}
		return Point{Workload: "pd", Policy: pol, Rate: rate, Summary: Summary{TTFTp90: p90, OutputTokens: seedTokens[0], OutputTPS: tps[0]},
			PD: &PDResult{SeedOutputTPS: tps, SeedOutputTokens: seedTokens}}
	}
	// slower is p with every run's tokens per second a little lower, as
	// when its last request ends later: the tokens delivered are the same.
	slower := func(p Point) Point {
		pd := *p.PD
		pd.SeedOutputTPS = slices.Clone(pd.SeedOutputTPS)
		for i := range pd.SeedOutputTPS {
			pd.SeedOutputTPS[i] *= 0.99
		}
		p.PD = &pd
		return p
	}
	tests := []struct {
		name string
		pts  []Point
		want []Outcome
	}{
		{"a default best everywhere passes all three", []Point{
			pt(PolicyPDPredicted, 10, 100*time.Millisecond, 3000, 3000), pt(PolicyPDAlways, 10, 200*time.Millisecond, 2900, 3000),
			pt(PolicyPDPredicted, 20, 100*time.Millisecond, 6000, 6000), pt(PolicyPDExact, 20, 120*time.Millisecond, 6000, 6000),
			pt(PolicyPDAlways, 20, 300*time.Millisecond, 5000, 5000),
		}, []Outcome{Pass, Pass, Pass}},
		{"a default 5% behind at the top fails the first only", []Point{
			pt(PolicyPDPredicted, 10, 100*time.Millisecond, 3000), pt(PolicyPDAlways, 10, 200*time.Millisecond, 3000),
			pt(PolicyPDPredicted, 20, 105*time.Millisecond, 6000), pt(PolicyPDDecodeOnly, 20, 100*time.Millisecond, 6000),
			pt(PolicyPDAlways, 20, 300*time.Millisecond, 5000),
		}, []Outcome{Fail, Pass, Pass}},
		{"throughput is every seed's tokens, not the median run's", []Point{
			pt(PolicyPDPredicted, 10, 100*time.Millisecond, 4000, 2000), pt(PolicyPDAlways, 10, 200*time.Millisecond, 3000, 3200),
		}, []Outcome{Pass, Pass, Fail}},
		{"every token delivered passes whatever the last request's latency", []Point{
			slower(pt(PolicyPDPredicted, 10, 100*time.Millisecond, 3000, 3000)), pt(PolicyPDAlways, 10, 200*time.Millisecond, 3000, 3000),
		}, []Outcome{Pass, Pass, Pass}},
		{"a token fewer fails", []Point{
			pt(PolicyPDPredicted, 10, 100*time.Millisecond, 3000, 2999), pt(PolicyPDAlways, 10, 200*time.Millisecond, 3000, 3000),
		}, []Outcome{Pass, Pass, Fail}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PDChecks(tt.pts)
			if len(got) != len(tt.want) {
				t.Fatalf("%d checks, want %d: %+v", len(got), len(tt.want), got)
			}
			for i, c := range got {
				if c.Outcome != tt.want[i] {
					t.Errorf("check %q: %s, want %s (%s)", c.Claim, c.Outcome, tt.want[i], c.Detail)
				}
			}
		})
	}
}
