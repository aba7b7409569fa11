package loadgen

import (
	"context"
	"testing"
	"time"
)

// TestVirtualRunsMatchTheirKnownShape runs every policy in virtual time on
// a workload where prefix routing plainly wins: eight groups of prompts on
// a fleet that can hold each group's prefix on one engine but not all of
// them everywhere. Every policy must give the same answer twice; kvroute's,
// fed the engines' batches in process, must find the cache as the oracle
// does; and a conversation's later turns must arrive.
func TestVirtualRunsMatchTheirKnownShape(t *testing.T) {
	t.Parallel()
	fo := tinyFleet()
	w := Workload{Name: "groups", Kind: KindSharedPrefix, Groups: 6, SystemTokens: 1024, QuestionTokens: 16}
	o := RunOptions{Model: fo.Model, Rate: 40, Duration: 3 * time.Second, Drain: 5 * time.Second, MaxTokens: 4, Seed: 3}
	sum := map[string]Summary{}
	for _, pol := range AllPolicies {
		res, err := RunVirtual(context.Background(), pol, fo, w, o)
		if err != nil {
			t.Fatalf("%s: %v", pol, err)
		}
		s := Summarize(res.Samples, res.Makespan)
		if s.Requests < 100 || s.Errors > 0 || s.Cut > 0 {
			t.Fatalf("%s: %d requests, %d errors, %d cut", pol, s.Requests, s.Errors, s.Cut)
		}
		sum[pol] = s
		t.Logf("%-22s hit %.2f  TTFT p90 %v", pol, s.HitRate, s.TTFTp90)
	}
	// A run repeats exactly, the EPP's random tie-breaks included: they are
	// seeded from the run's seed.
	for _, pol := range []string{PolicyRandom, PolicyPrecise} {
		again, err := RunVirtual(context.Background(), pol, fo, w, o)
		if err != nil {
			t.Fatal(err)
		}
		if s := Summarize(again.Samples, again.Makespan); s != sum[pol] {
			t.Errorf("%s gave %+v, then %+v", pol, sum[pol], s)
		}
	}
	if p, r, or := sum[PolicyPrecise].HitRate, sum[PolicyRandom].HitRate, sum[PolicyOracle].HitRate; p < 0.95*or || p < r+0.2 {
		t.Errorf("hit rates: kvroute-precise %.2f, random %.2f, oracle %.2f; want precise within 5%% of the oracle and well above random", p, r, or)
	}
	if e := sum[PolicyApproxEPP].HitRate; e < sum[PolicyRandom].HitRate+0.2 {
		t.Errorf("approx-prefix-epp hit rate %.2f: its routing history should find the groups", e)
	}

	chat := Workload{Name: "chat", Kind: KindMultiTurn, Groups: 2, SystemTokens: 256, QuestionTokens: 32, Turns: 3}
	o.ThinkTime = 100 * time.Millisecond
	res, err := RunVirtual(context.Background(), PolicyPreciseLoad, fo, chat, o)
	if err != nil {
		t.Fatal(err)
	}
	later := 0
	for _, s := range res.Samples {
		if s.Start >= o.Duration/2 && s.CachedTokens > 256 {
			later++ // a later turn that found its conversation's history cached
		}
	}
	if later == 0 {
		t.Error("no later turn found its history cached")
	}
}
