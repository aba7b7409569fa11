package loadgen

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPercentileIsNearestRank(t *testing.T) {
	t.Parallel()
	ten := func() []time.Duration {
		var xs []time.Duration
		for i := 10; i >= 1; i-- {
			xs = append(xs, time.Duration(i)*time.Millisecond)
		}
		return xs
	}
	tests := []struct {
		name string
		xs   []time.Duration
		p    float64
		want time.Duration
	}{
		{"no samples give zero", nil, 90, 0},
		{"one sample is every percentile", []time.Duration{7}, 99, 7},
		{"the median of ten is the fifth", ten(), 50, 5 * time.Millisecond},
		{"p90 of ten is the ninth", ten(), 90, 9 * time.Millisecond},
		{"p99 of ten is the largest", ten(), 99, 10 * time.Millisecond},
		{"p100 is the largest", ten(), 100, 10 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Percentile(tt.xs, tt.p); got != tt.want {
				t.Errorf("Percentile(p%v) = %v, want %v", tt.p, got, tt.want)
			}
		})
	}
}

func TestSummarizeCountsCutRequestsAndLeavesOutFailures(t *testing.T) {
	t.Parallel()
	samples := []Sample{
		{TTFT: 10 * time.Millisecond, E2E: 100 * time.Millisecond, PromptTokens: 100, CachedTokens: 80, OutputTokens: 10},
		{TTFT: 20 * time.Millisecond, E2E: 200 * time.Millisecond, PromptTokens: 100, CachedTokens: 0, OutputTokens: 10},
		{TTFT: 5 * time.Second, E2E: 5 * time.Second, Cut: true},
		{Err: errors.New("refused")},
	}
	s := Summarize(samples, 2*time.Second)
	if s.Requests != 4 || s.Errors != 1 || s.Cut != 1 {
		t.Errorf("counts = %d requests, %d errors, %d cut; want 4, 1, 1", s.Requests, s.Errors, s.Cut)
	}
	if s.TTFTp99 != 5*time.Second || s.TTFTp50 != 20*time.Millisecond {
		t.Errorf("TTFT p50 %v p99 %v; want 20ms and the cut request's 5s", s.TTFTp50, s.TTFTp99)
	}
	if s.HitRate != 0.4 || s.OutputTPS != 10 {
		t.Errorf("hit rate %v, output %v tok/s; want 0.4 and 10", s.HitRate, s.OutputTPS)
	}
}

func point(wl, pol string, rate float64, p90 time.Duration, hit float64) Point {
	return Point{Workload: wl, Policy: pol, Rate: rate, Summary: Summary{TTFTp90: p90, HitRate: hit, Requests: 1}}
}

func TestChecksFindWhereTheApproximatePolicyBlowsUp(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	pts := []Point{
		point("w", PolicyApprox, 1, 100*ms, 0.5), point("w", PolicyPrecise, 1, 50*ms, 0.9), point("w", PolicyOracle, 1, 50*ms, 0.9),
		point("w", PolicyApprox, 2, 300*ms, 0.5), point("w", PolicyPrecise, 2, 50*ms, 0.85), point("w", PolicyOracle, 2, 50*ms, 0.95),
		point("w", PolicyApprox, 3, 900*ms, 0.5), point("w", PolicyPrecise, 3, 300*ms, 0.9), point("w", PolicyOracle, 3, 50*ms, 0.9),
		point("w", PolicyPreciseLoad, 3, 100*ms, 0.9), point("w", PolicyPrefillCost, 3, 200*ms, 0.9),
	}
	got := Checks(pts)
	if len(got) != 5 {
		t.Fatalf("got %d checks, want 5: %+v", len(got), got)
	}
	if got[0].Outcome != Fail || !strings.Contains(got[0].Detail, "2.0 req/s") {
		t.Errorf("hit-rate check = %+v; want a failure at 2 req/s (0.85 < 0.95*0.95)", got[0])
	}
	// Blown up first at 3 req/s (900ms ≥ 5×100ms); there precise is only
	// 3x lower, precise with load 9x, prefill cost 4.5x.
	if got[1].Outcome != Fail || got[1].Policy != PolicyPrecise || !strings.Contains(got[1].Detail, "at 3.0 req/s") {
		t.Errorf("TTFT check = %+v; want a failure at 3 req/s", got[1])
	}
	if got[2].Outcome != Pass || got[2].Policy != PolicyPreciseLoad || !strings.Contains(got[2].Detail, "9.0x") {
		t.Errorf("TTFT check = %+v; want a pass with 9x", got[2])
	}
	if got[3].Outcome != Fail || got[3].Policy != PolicyPrefillCost {
		t.Errorf("TTFT check = %+v; want a failure with 4.5x", got[3])
	}
	// The overall claim rests on the default policy, which was not run.
	if got[4].Workload != "all" || got[4].Outcome != Fail {
		t.Errorf("overall check = %+v; want a failure", got[4])
	}
	// Run at 3 req/s only, the default is 6x lower than approx there (so
	// the overall claim holds), and 1.5x precise-load's (so the claim
	// against the best other policy fails), which comes first.
	pts = append(pts, point("w", PolicyPredicted, 3, 150*ms, 0.9))
	got = Checks(pts)
	if len(got) != 7 || got[0].Outcome != Fail || !strings.Contains(got[0].Detail, "1.50x") {
		t.Fatalf("checks = %+v; want seven, the first failing at 1.5x", got)
	}
	if got[5].Policy != PolicyPredicted || !strings.Contains(got[5].Detail, "6.0x") || got[6].Outcome != Pass {
		t.Errorf("checks = %+v; want the default's row at 6x and the overall check passing", got)
	}

	// The EPP's approximate variant blows up at 2 req/s (600ms), where
	// precise is 12x lower.
	pts = append(pts, point("w", PolicyApproxEPP, 1, 100*ms, 0.3), point("w", PolicyApproxEPP, 2, 600*ms, 0.3))
	got = Checks(pts)
	if len(got) != 8 || got[6].Outcome != Pass || !strings.Contains(got[6].Detail, "at 2.0 req/s") || !strings.Contains(got[6].Detail, "12.0x") {
		t.Errorf("checks = %+v; want a row for approx-prefix-epp, passing at 2 req/s with 12x", got)
	}

	// Where approx never blows up the TTFT claim does not apply, and the
	// overall check fails: nothing strained the approximate policy.
	flat := []Point{point("u", PolicyApprox, 1, 100*ms, 0.5), point("u", PolicyApprox, 2, 110*ms, 0.5), point("u", PolicyOracle, 1, 100*ms, 0.5)}
	got = Checks(flat)
	if len(got) != 2 || got[0].Outcome != NotApplicable || !strings.Contains(got[0].Detail, "never reached") {
		t.Errorf("checks = %+v; want the TTFT claim not to apply", got)
	}
	if got[1].Workload != "all" || got[1].Outcome != Fail {
		t.Errorf("overall check = %+v; want a failure", got[1])
	}
	// One workload where it blew up and kvroute held is enough.
	if got := Checks(append(flat, pts...)); got[len(got)-1].Outcome != Pass {
		t.Errorf("overall check = %+v; want a pass", got[len(got)-1])
	}
	none := []Point{point("n", PolicyApprox, 1, 100*ms, 0), point("n", PolicyApprox, 2, 900*ms, 0), point("n", PolicyOracle, 1, 100*ms, 0)}
	if got := Checks(none); len(got) != 1 || got[0].Workload != "all" {
		t.Errorf("checks = %+v; want only the overall one for a workload with nothing to reuse", got)
	}
}

func sloPoint(wl, pol string, rate float64, p90 time.Duration, attained float64) Point {
	p := point(wl, pol, rate, p90, 0.5)
	p.WithSLO, p.SLOAttainment = 100, attained
	return p
}

func TestTheDefaultPolicyIsCheckedAgainstTheBestOtherAtEveryRate(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name string
		pts  []Point
		// want is each check's claim (a distinctive part) and outcome, in
		// order, the hit-rate and blown-up checks left out.
		want []string
	}{
		{
			name: "within 10% everywhere and best at the top rate passes both",
			pts: []Point{
				sloPoint("agent", PolicyPrecise, 1, 100*ms, 0.99), sloPoint("agent", PolicyPredicted, 1, 108*ms, 1),
				sloPoint("agent", PolicyPrecise, 2, 300*ms, 0.9), sloPoint("agent", PolicyPredicted, 2, 200*ms, 0.97),
				sloPoint("agent", PolicyOracle, 2, 50*ms, 1),
			},
			want: []string{"at every rate pass", "highest rate pass", "SLO attainment n/a"},
		},
		{
			name: "more than 10% above another policy at one rate fails, naming it",
			pts: []Point{
				sloPoint("agent", PolicyPrecise, 1, 100*ms, 0.7), sloPoint("agent", PolicyPredicted, 1, 120*ms, 0.96),
				sloPoint("agent", PolicyPrecise, 2, 300*ms, 0.5), sloPoint("agent", PolicyPredicted, 2, 290*ms, 0.8),
			},
			want: []string{"at every rate fail 1.20x at 1.0 req/s", "highest rate pass", "SLO attainment pass 96.0%"},
		},
		{
			name: "the oracle is no rival and the top rate is checked only for agent and multi-turn",
			pts: []Point{
				sloPoint("mixed-slo", PolicyPrecise, 1, 100*ms, 0.9), sloPoint("mixed-slo", PolicyPredicted, 1, 100*ms, 0.99),
				sloPoint("mixed-slo", PolicyOracle, 1, 10*ms, 1),
				sloPoint("mixed-slo", PolicyPrecise, 2, 100*ms, 0.79), sloPoint("mixed-slo", PolicyPredicted, 2, 105*ms, 0.9),
			},
			want: []string{"at every rate pass", "SLO attainment fail 90.0%"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var got []string
			for _, c := range Checks(tt.pts) {
				if c.Policy != PolicyPredicted || strings.Contains(c.Claim, "approx") {
					continue
				}
				got = append(got, c.Claim+" "+string(c.Outcome)+" "+c.Detail)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("checks:\n%s\nwant %d", strings.Join(got, "\n"), len(tt.want))
			}
			for i, w := range tt.want {
				for _, part := range strings.Fields(w) {
					if !strings.Contains(got[i], part) {
						t.Errorf("check %d = %q, want it to say %q", i, got[i], part)
					}
				}
			}
		})
	}
}

func TestTheSVGPlotHasALinePerPolicy(t *testing.T) {
	t.Parallel()
	pts := []Point{
		point("w", PolicyRandom, 1, 100*time.Millisecond, 0), point("w", PolicyRandom, 2, 2*time.Second, 0),
		point("w", PolicyOracle, 1, 10*time.Millisecond, 0), point("w", PolicyOracle, 2, 20*time.Millisecond, 0),
	}
	var b bytes.Buffer
	WriteSVG(&b, pts, "w")
	svg := b.String()
	if !strings.HasPrefix(svg, "<svg") || strings.Count(svg, "<polyline") != 2 || strings.Count(svg, "<circle") != 4 {
		t.Errorf("unexpected SVG:\n%s", svg)
	}
	var tb bytes.Buffer
	WriteTables(&tb, pts)
	if strings.Count(tb.String(), "\n| 2.0 |") != 2 {
		t.Errorf("table lacks the 2 req/s rows:\n%s", tb.String())
	}
}

func TestCompareSaysLowerOrHigherHonestly(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name string
		a, b time.Duration
		want string
	}{
		{"a lower value is so many times lower", 100 * ms, 230 * ms, "2.3× lower"},
		{"a higher value is said to be higher, not a fraction lower", 266 * ms, 213 * ms, "1.2× higher"},
		{"equal values are no different", 5 * ms, 5 * ms, "no different"},
		{"an unknown value compares as no different", 0, 5 * ms, "no different"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := Compare(tt.a, tt.b); got != tt.want {
				t.Errorf("Compare(%v, %v) = %q, want %q", tt.a, tt.b, got, tt.want)
			}
		})
	}
}
