package loadgen

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Check is one of the benchmark's claims, evaluated.
type Check struct {
	Workload string
	Claim    string
	Detail   string
	Outcome  Outcome
	// Policy is the kvroute policy a TTFT check is about, if any.
	Policy string
}

// Outcome is a check's result.
type Outcome string

// The outcomes: a claim that does not apply (the approximate policy never
// blew up in that workload's ladder) is neither passed nor failed.
const (
	Pass          Outcome = "pass"
	Fail          Outcome = "fail"
	NotApplicable Outcome = "n/a"
)

func outcome(ok bool) Outcome {
	if ok {
		return Pass
	}
	return Fail
}

// Checks evaluates, per workload: kvroute precise's cache hit rate against
// the oracle's at every rate (at least 95%), and, at the lowest rate where
// an approximate policy's TTFT p90 has blown up (five times its own at the
// lowest rate), that kvroute's is at least five times lower. A last check
// asks that upstream's approximate policy blew up somewhere, and that
// kvroute's load-aware precise routing (the prefill-cost scorer on the
// exact index) held there: a ladder that never strains the approximate
// policy proves nothing about it.
func Checks(pts []Point) []Check {
	var out []Check
	anyBlown, held := false, false
	for _, wl := range workloads(pts) {
		worst, detail := math.Inf(1), ""
		for _, rate := range rates(pts, wl) {
			pr, ok1 := find(pts, wl, PolicyPrecise, rate)
			or, ok2 := find(pts, wl, PolicyOracle, rate)
			if !ok1 || !ok2 || or.HitRate == 0 {
				continue
			}
			if r := pr.HitRate / or.HitRate; r < worst {
				worst = r
				detail = fmt.Sprintf("worst at %.1f req/s: precise %.1f%% vs oracle %.1f%% (%.0f%%)", rate, 100*pr.HitRate, 100*or.HitRate, 100*r)
			}
		}
		if detail != "" {
			out = append(out, Check{Workload: wl, Claim: "kvroute-precise cache hit rate ≥ 95% of the oracle's at every rate",
				Detail: detail, Outcome: outcome(worst >= 0.95)})
		}
		rs := rates(pts, wl)
		if len(rs) == 0 {
			continue
		}
		if or, ok := find(pts, wl, PolicyOracle, rs[0]); ok && or.HitRate < 0.01 {
			continue // nothing to reuse: prefix routing has nothing to win
		}
		for _, approx := range []string{PolicyApprox, PolicyApproxEPP} {
			cs := blownUpChecks(pts, wl, rs, approx)
			out = append(out, cs...)
			for _, c := range cs {
				if approx == PolicyApprox && c.Outcome != NotApplicable {
					anyBlown = true
					held = held || c.Policy == PolicyPrefillCost && c.Outcome == Pass
				}
			}
		}
	}
	if slices.ContainsFunc(pts, func(p Point) bool { return p.Policy == PolicyApprox }) {
		detail := "approx-prefix never blew up"
		if anyBlown {
			detail = "see the rows above"
		}
		out = append(out, Check{Workload: "all", Detail: detail, Outcome: outcome(anyBlown && held),
			Claim: "approx-prefix blew up in some workload, and kvroute's load-aware precise routing (kvroute-prefill-cost) was ≥ 5x lower there"})
	}
	return out
}

// blownUpChecks compares kvroute's TTFT p90 with approx's at the lowest
// rate where approx's has blown up (five times its own at the lowest rate).
func blownUpChecks(pts []Point, wl string, rs []float64, approx string) []Check {
	base, ok := find(pts, wl, approx, rs[0])
	if !ok {
		return nil
	}
	claim := "kvroute's TTFT p90 ≥ 5x lower than " + approx + "'s where that blew up"
	blown := -1.0
	for _, rate := range rs[1:] {
		if ap, ok := find(pts, wl, approx, rate); ok && ap.TTFTp90 >= 5*base.TTFTp90 {
			blown = rate
			break
		}
	}
	if blown < 0 {
		return []Check{{Workload: wl, Claim: claim, Outcome: NotApplicable,
			Detail: fmt.Sprintf("%s held up: its p90 never reached 5x its %.1f req/s value (%s) in this ladder", approx, rs[0], ms(base.TTFTp90))}}
	}
	ap, _ := find(pts, wl, approx, blown)
	var out []Check
	for _, pol := range []string{PolicyPrecise, PolicyPreciseLoad, PolicyPrefillCost} {
		kv, ok := find(pts, wl, pol, blown)
		if !ok {
			continue
		}
		ratio := float64(ap.TTFTp90) / float64(max(kv.TTFTp90, time.Microsecond))
		out = append(out, Check{Workload: wl, Claim: pol + ": " + claim, Policy: pol, Outcome: outcome(ratio >= 5),
			Detail: fmt.Sprintf("at %.1f req/s: %s %s, %s %s (%.1fx)", blown, approx, ms(ap.TTFTp90), pol, ms(kv.TTFTp90), ratio)})
	}
	return out
}

func workloads(pts []Point) []string {
	var out []string
	for _, p := range pts {
		if !slices.Contains(out, p.Workload) {
			out = append(out, p.Workload)
		}
	}
	return out
}

func rates(pts []Point, wl string) []float64 {
	var out []float64
	for _, p := range pts {
		if p.Workload == wl && !slices.Contains(out, p.Rate) {
			out = append(out, p.Rate)
		}
	}
	slices.Sort(out)
	return out
}

func policies(pts []Point, wl string) []string {
	var out []string
	for _, pol := range AllPolicies {
		for _, p := range pts {
			if p.Workload == wl && p.Policy == pol {
				out = append(out, pol)
				break
			}
		}
	}
	return out
}

func find(pts []Point, wl, pol string, rate float64) (Point, bool) {
	for _, p := range pts {
		if p.Workload == wl && p.Policy == pol && p.Rate == rate {
			return p, true
		}
	}
	return Point{}, false
}

// WriteTables writes a Markdown table per workload: one row per rate and
// policy.
func WriteTables(w io.Writer, pts []Point) {
	for _, wl := range workloads(pts) {
		fmt.Fprintf(w, "### %s\n\n", wl)
		fmt.Fprintln(w, "| req/s | policy | TTFT p50 | TTFT p90 | TTFT p99 | E2E p90 | output tok/s | cache hit | requests (cut) |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, rate := range rates(pts, wl) {
			for _, pol := range policies(pts, wl) {
				p, ok := find(pts, wl, pol, rate)
				if !ok {
					continue
				}
				fmt.Fprintf(w, "| %.1f | %s | %s | %s | %s | %s | %.0f | %.1f%% | %d (%d) |\n", rate, pol,
					ms(p.TTFTp50), ms(p.TTFTp90), ms(p.TTFTp99), ms(p.E2Ep90), p.OutputTPS, 100*p.HitRate, p.Requests, p.Cut)
			}
		}
		fmt.Fprintln(w)
	}
}

// svgColors gives each policy a fixed colour across plots.
var svgColors = map[string]string{
	PolicyApproxEPP: "#ff7f0e",
	PolicyRandom:    "#999999", PolicyRoundRobin: "#bcbd22", PolicyLeastQueue: "#17becf",
	PolicyApprox: "#d62728", PolicyPrecise: "#1f77b4", PolicyPreciseLoad: "#2ca02c", PolicyOracle: "#000000",
}

// WriteSVG plots TTFT p90 (log scale) against request rate for one
// workload, a line per policy.
func WriteSVG(w io.Writer, pts []Point, wl string) {
	const (
		width, height            = 720, 420
		left, right, top, bottom = 70, 190, 40, 50
		plotW, plotH             = width - left - right, height - top - bottom
		minY                     = 1.0 // ms
	)
	rs := rates(pts, wl)
	maxY := 10.0
	for _, p := range pts {
		if p.Workload == wl {
			maxY = math.Max(maxY, float64(p.TTFTp90)/float64(time.Millisecond))
		}
	}
	lo, hi := math.Log10(minY), math.Ceil(math.Log10(maxY))
	minX, maxX := 0.0, 1.0
	if len(rs) > 0 {
		minX, maxX = rs[0], rs[len(rs)-1]
		if maxX == minX {
			maxX = minX + 1
		}
	}
	x := func(r float64) float64 { return left + (r-minX)/(maxX-minX)*plotW }
	y := func(v float64) float64 {
		v = math.Max(v, minY)
		return top + plotH - (math.Log10(v)-lo)/(hi-lo)*plotH
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s: TTFT p90 against request rate</text>`+"\n", left, esc(wl))
	for e := lo; e <= hi; e++ {
		v := math.Pow(10, e)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, left+plotW, y(v), y(v), left-6, y(v)+4, axisMS(v))
	}
	for _, r := range rs {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/><text x="%.1f" y="%d" text-anchor="middle">%g</text>`+"\n",
			x(r), x(r), top, top+plotH, x(r), top+plotH+16, r)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">request rate (req/s)</text>`+"\n", left+plotW/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(16,%d) rotate(-90)" text-anchor="middle">TTFT p90 (log scale)</text>`+"\n", top+plotH/2)
	for i, pol := range policies(pts, wl) {
		var path []string
		for _, r := range rs {
			if p, ok := find(pts, wl, pol, r); ok {
				path = append(path, fmt.Sprintf("%.1f,%.1f", x(r), y(float64(p.TTFTp90)/float64(time.Millisecond))))
			}
		}
		c := svgColors[pol]
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(path, " "))
		for _, pt := range path {
			xy := strings.Split(pt, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], c)
		}
		ly := top + 14 + i*20
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			left+plotW+12, left+plotW+36, ly, ly, c, left+plotW+42, ly+4, esc(pol))
	}
	b.WriteString("</svg>\n")
	_, _ = io.WriteString(w, b.String())
}

func axisMS(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gs", v/1000)
	}
	return fmt.Sprintf("%gms", v)
}

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
