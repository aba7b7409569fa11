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

// DefaultPolicy is the policy the EPP runs with no configuration; the
// checks are about it.
const DefaultPolicy = PolicyPredicted

// Checks evaluates the benchmark's claims, per workload:
//   - the default policy's TTFT p90 is no more than 10% above the best
//     other policy's (the oracle excluded) at every rate;
//   - at the highest rate of agent and multi-turn it is the best policy
//     but the oracle;
//   - its SLO attainment is at least 95% at the lowest rate where
//     kvroute-precise (the exact prefix alone) falls below 80%;
//   - kvroute-precise's cache hit rate is at least 95% of the best any
//     policy reached, at every rate;
//   - where an approximate policy's TTFT p90 blew up (five times its own at
//     the lowest rate), kvroute's is at least five times lower.
func Checks(pts []Point) []Check {
	var out []Check
	anyBlown, held := false, false
	for _, wl := range workloads(pts) {
		rs := rates(pts, wl)
		if c, ok := defaultCheck(pts, wl, rs); ok {
			out = append(out, c)
		}
		if (wl == "agent" || wl == "multi-turn") && len(rs) > 0 {
			if c, ok := highestRateCheck(pts, wl, rs[len(rs)-1]); ok {
				out = append(out, c)
			}
		}
		if c, ok := attainmentCheck(pts, wl, rs); ok {
			out = append(out, c)
		}
		worst, detail := math.Inf(1), ""
		for _, rate := range rs {
			pr, ok := find(pts, wl, PolicyPrecise, rate)
			if !ok {
				continue
			}
			best, bestPol := 0.0, ""
			for _, pol := range policies(pts, wl) {
				if p, ok := find(pts, wl, pol, rate); ok && p.HitRate > best {
					best, bestPol = p.HitRate, pol
				}
			}
			if best == 0 {
				continue
			}
			if r := pr.HitRate / best; r < worst {
				worst = r
				detail = fmt.Sprintf("worst at %.1f req/s: precise %.1f%% vs %s %.1f%% (%.0f%%)", rate, 100*pr.HitRate, bestPol, 100*best, 100*r)
			}
		}
		if detail != "" {
			out = append(out, Check{Workload: wl, Claim: "kvroute-precise cache hit rate ≥ 95% of the best policy's at every rate",
				Detail: detail, Outcome: outcome(worst >= 0.95)})
		}
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
					held = held || c.Policy == DefaultPolicy && c.Outcome == Pass
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
			Claim: "approx-prefix blew up in some workload, and kvroute's default (" + DefaultPolicy + ") was ≥ 5x lower there"})
	}
	return out
}

// bestOther is the policy with the lowest TTFT p90 at rate, the default
// and the oracle excluded.
func bestOther(pts []Point, wl string, rate float64) (Point, bool) {
	var best Point
	found := false
	for _, pol := range policies(pts, wl) {
		if pol == DefaultPolicy || pol == PolicyOracle {
			continue
		}
		if p, ok := find(pts, wl, pol, rate); ok && (!found || p.TTFTp90 < best.TTFTp90) {
			best, found = p, true
		}
	}
	return best, found
}

func defaultCheck(pts []Point, wl string, rs []float64) (Check, bool) {
	var misses []string
	worst, worstAt := 0.0, ""
	n := 0
	for _, rate := range rs {
		d, ok1 := find(pts, wl, DefaultPolicy, rate)
		b, ok2 := bestOther(pts, wl, rate)
		if !ok1 || !ok2 {
			continue
		}
		n++
		r := float64(d.TTFTp90) / float64(max(b.TTFTp90, time.Microsecond))
		if r > worst {
			worst, worstAt = r, fmt.Sprintf("%.1f req/s: %s against %s's %s", rate, ms(d.TTFTp90), b.Policy, ms(b.TTFTp90))
		}
		if r > 1.1 {
			misses = append(misses, fmt.Sprintf("%g", rate))
		}
	}
	if n == 0 {
		return Check{}, false
	}
	detail := fmt.Sprintf("worst %.2fx at %s", worst, worstAt)
	if len(misses) > 0 {
		detail += fmt.Sprintf("; above 1.1x at %d of %d rates (%s req/s)", len(misses), n, strings.Join(misses, ", "))
	}
	return Check{Workload: wl, Policy: DefaultPolicy, Outcome: outcome(len(misses) == 0), Detail: detail,
		Claim: DefaultPolicy + " TTFT p90 ≤ 1.1x the best other policy's (oracle excluded) at every rate"}, true
}

func highestRateCheck(pts []Point, wl string, rate float64) (Check, bool) {
	d, ok1 := find(pts, wl, DefaultPolicy, rate)
	b, ok2 := bestOther(pts, wl, rate)
	if !ok1 || !ok2 {
		return Check{}, false
	}
	return Check{Workload: wl, Policy: DefaultPolicy, Outcome: outcome(d.TTFTp90 <= b.TTFTp90),
		Claim:  fmt.Sprintf("%s has the lowest TTFT p90 but the oracle's at the highest rate", DefaultPolicy),
		Detail: fmt.Sprintf("at %.1f req/s: %s %s, best other %s %s", rate, DefaultPolicy, ms(d.TTFTp90), b.Policy, ms(b.TTFTp90))}, true
}

func attainmentCheck(pts []Point, wl string, rs []float64) (Check, bool) {
	claim := DefaultPolicy + " SLO attainment ≥ 95% at the lowest rate where kvroute-precise's falls below 80%"
	measured := false
	for _, rate := range rs {
		if pr, ok := find(pts, wl, PolicyPrecise, rate); ok && pr.WithSLO > 0 {
			measured = true
		}
	}
	if !measured {
		return Check{}, false
	}
	for _, rate := range rs {
		pr, ok := find(pts, wl, PolicyPrecise, rate)
		if !ok || pr.WithSLO == 0 || pr.SLOAttainment >= 0.8 {
			continue
		}
		d, ok := find(pts, wl, DefaultPolicy, rate)
		if !ok {
			return Check{}, false
		}
		return Check{Workload: wl, Policy: DefaultPolicy, Claim: claim, Outcome: outcome(d.SLOAttainment >= 0.95),
			Detail: fmt.Sprintf("at %.1f req/s: kvroute-precise %.1f%%, %s %.1f%% (%d shed)", rate, 100*pr.SLOAttainment, DefaultPolicy, 100*d.SLOAttainment, d.Shed)}, true
	}
	return Check{Workload: wl, Policy: DefaultPolicy, Claim: claim, Outcome: NotApplicable, Detail: "kvroute-precise stayed at or above 80% in this ladder"}, true
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
	for _, pol := range []string{PolicyPrecise, PolicyPreciseLoad, PolicyPrefillCost, PolicyPredicted} {
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
	for _, pol := range slices.Concat(AllPolicies, SharingPolicies, FlowControlPolicies, UpstreamPolicies, PDPolicies, DPPolicies) {
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
		fmt.Fprintln(w, "| req/s | policy | TTFT p50 | TTFT p90 | TTFT p99 | p90 vs oracle | E2E p90 | output tok/s | cache hit | SLO attainment | goodput (req/s) | requests (shed, cut) |")
		fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, rate := range rates(pts, wl) {
			or, hasOracle := find(pts, wl, PolicyOracle, rate)
			for _, pol := range policies(pts, wl) {
				p, ok := find(pts, wl, pol, rate)
				if !ok {
					continue
				}
				vs := "—"
				if hasOracle && or.TTFTp90 > 0 {
					vs = fmt.Sprintf("%.2fx", float64(p.TTFTp90)/float64(or.TTFTp90))
				}
				name := pol
				if pol == DefaultPolicy {
					name = "**" + pol + "**"
				}
				fmt.Fprintf(w, "| %.1f | %s | %s | %s | %s | %s | %s | %.0f | %.1f%% | %.1f%% | %.1f | %d (%d, %d) |\n", rate, name,
					ms(p.TTFTp50), ms(p.TTFTp90), ms(p.TTFTp99), vs, ms(p.E2Ep90), p.OutputTPS, 100*p.HitRate,
					100*p.SLOAttainment, p.Goodput, p.Requests, p.Shed, p.Cut)
			}
		}
		fmt.Fprintln(w)
	}
}

// svgColors gives each policy a fixed colour across plots; every policy
// has one.
var svgColors = map[string]string{
	PolicyRandom: "#999999", PolicyRoundRobin: "#bcbd22", PolicyLeastQueue: "#17becf",
	PolicyApprox: "#d62728", PolicyApproxEPP: "#ff7f0e",
	PolicyPrecise: "#1f77b4", PolicyPreciseLoad: "#2ca02c", PolicyPrefillCost: "#9467bd",
	PolicyPredicted: "#e377c2", PolicyPredictedUnshared: "#8c564b", PolicyOracle: "#000000",
	PolicyPDDecodeOnly: "#17becf", PolicyPDAlways: "#d62728", PolicyPDUpstream: "#ff7f0e",
	PolicyPDExact: "#1f77b4", PolicyPDPredicted: "#e377c2",
	PolicyPDTopologyBlind: "#1f77b4", PolicyPDTopologyAware: "#2ca02c", PolicyPDTopologyRack: "#9467bd",
	PolicyPDTopologyPredictedBlind: "#8c564b", PolicyPDTopologyPredicted: "#e377c2",
}

// Metric is what a plot draws against request rate.
type Metric int

// The plotted metrics.
const (
	// MetricTTFTp90 is TTFT p90, on a log scale.
	MetricTTFTp90 Metric = iota
	// MetricSLOAttainment is SLO attainment, 0 to 100%.
	MetricSLOAttainment
)

// WriteSVG plots TTFT p90 (log scale) against request rate for one
// workload, a line per policy.
func WriteSVG(w io.Writer, pts []Point, wl string) { WritePlot(w, pts, wl, MetricTTFTp90) }

// WritePlot plots metric against request rate for one workload, a line
// per policy; the default policy's line is drawn thicker.
func WritePlot(w io.Writer, pts []Point, wl string, metric Metric) {
	const (
		width, height            = 760, 440
		left, right, top, bottom = 70, 230, 40, 50
		plotW, plotH             = width - left - right, height - top - bottom
		minY                     = 1.0 // ms
	)
	rs := rates(pts, wl)
	value := func(p Point) float64 {
		if metric == MetricSLOAttainment {
			return 100 * p.SLOAttainment
		}
		return float64(p.TTFTp90) / float64(time.Millisecond)
	}
	title, yLabel := "TTFT p90 against request rate", "TTFT p90 (log scale)"
	lo, hi := math.Log10(minY), 1.0
	var y func(v float64) float64
	if metric == MetricSLOAttainment {
		title, yLabel = "SLO attainment against request rate", "SLO attainment (%)"
		y = func(v float64) float64 { return top + plotH - v/100*plotH }
	} else {
		maxY := 10.0
		for _, p := range pts {
			if p.Workload == wl {
				maxY = math.Max(maxY, value(p))
			}
		}
		hi = math.Ceil(math.Log10(maxY))
		y = func(v float64) float64 {
			v = math.Max(v, minY)
			return top + plotH - (math.Log10(v)-lo)/(hi-lo)*plotH
		}
	}
	minX, maxX := 0.0, 1.0
	if len(rs) > 0 {
		minX, maxX = rs[0], rs[len(rs)-1]
		if maxX == minX {
			maxX = minX + 1
		}
	}
	x := func(r float64) float64 { return left + (r-minX)/(maxX-minX)*plotW }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s: %s</text>`+"\n", left, esc(wl), title)
	if metric == MetricSLOAttainment {
		for v := 0.0; v <= 100; v += 20 {
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%g%%</text>`+"\n",
				left, left+plotW, y(v), y(v), left-6, y(v)+4, v)
		}
	} else {
		for e := lo; e <= hi; e++ {
			v := math.Pow(10, e)
			fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%.1f" y2="%.1f" stroke="#ddd"/><text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n",
				left, left+plotW, y(v), y(v), left-6, y(v)+4, axisMS(v))
		}
	}
	for _, r := range rs {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%d" stroke="#eee"/><text x="%.1f" y="%d" text-anchor="middle">%g</text>`+"\n",
			x(r), x(r), top, top+plotH, x(r), top+plotH+16, r)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", left, top, plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">request rate (req/s)</text>`+"\n", left+plotW/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(16,%d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", top+plotH/2, yLabel)
	for i, pol := range policies(pts, wl) {
		var path []string
		for _, r := range rs {
			if p, ok := find(pts, wl, pol, r); ok {
				path = append(path, fmt.Sprintf("%.1f,%.1f", x(r), y(value(p))))
			}
		}
		c, ok := svgColors[pol]
		if !ok {
			c = "#8c564b"
		}
		width, dash, label := 2, "", pol
		if pol == DefaultPolicy || pol == PolicyPDPredicted {
			width, label = 4, pol+" (default)"
		}
		if pol == PolicyOracle {
			dash = ` stroke-dasharray="6,3"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="%d"%s points="%s"/>`+"\n", c, width, dash, strings.Join(path, " "))
		for _, pt := range path {
			xy := strings.Split(pt, ",")
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s"/>`+"\n", xy[0], xy[1], c)
		}
		ly := top + 14 + i*20
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="%d"%s/><text x="%d" y="%d">%s</text>`+"\n",
			left+plotW+12, left+plotW+36, ly, ly, c, width, dash, left+plotW+42, ly+4, esc(label))
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

// frontText says how a real-time run's requests reach the engines.
func frontText(s Shape) string {
	if s.Front == FrontProxy {
		return "The EPP-routed policies run the request path through the EPP's standalone proxy (`--front proxy`): the client's HTTP request goes to the proxy, which tokenizes in process with the engines' tokenizer, runs PrepareData and the scheduler, and forwards to the picked engine; the EPP scrapes every engine's /metrics every 50ms. The client-side policies (the table's \"in the client\") go through the same hop, naming their pick in the subset hint (`x-gateway-destination-endpoint-subset`), which an EPP on upstream's profile, hearing no KV events, follows.\n\n"
	}
	replicas := "one EPP replica"
	if s.Replicas > 1 {
		replicas = fmt.Sprintf("%d EPP replicas, each its own EPP fed the KV events over NATS, spread round-robin as Envoy spreads an ext_proc cluster's streams", s.Replicas)
	}
	return "Every request passes the gateway (`pkg/harness/gateway`), which does what Envoy does with the inference extension's configuration: one ext_proc stream per request to " + replicas + " (request headers, body FULL_DUPLEX_STREAMED, response headers and body streamed back through the EPP), then the request forwarded to the endpoint the EPP named in `x-gateway-destination-endpoint`, the answer streamed back. The EPP tokenizes in process with the engines' tokenizer (as a deployment gives the EPP its model's tokenizer files; an engine's /tokenize is the fallback), runs PrepareData and the scheduler, and scrapes every engine's /metrics every 50ms. The client-side policies (the table's \"in the client\") go through the same gateway and EPP: the gateway passes the client's subset hint (`x-gateway-destination-endpoint-subset`) to the EPP as `envoy.lb.subset_hint` metadata, as Envoy's route metadata would, and an EPP on upstream's profile, hearing no KV events, tokenizes, schedules over that one endpoint and routes there, shedding nothing (their requests carry no objective). Every policy's TTFT thus includes the same gateway and request path, and they differ by the picks alone.\n\n"
}

// writeRestarts writes the EPP restarts' table and hit rate over time, if
// any run had one.
func writeRestarts(b *strings.Builder, pts []Point) {
	var with []Point
	for _, p := range pts {
		if p.Restart != nil {
			with = append(with, p)
		}
	}
	if len(with) == 0 {
		return
	}
	fmt.Fprintf(b, "## EPP restart\n\nIn each run the first EPP replica is stopped (its streams in flight cut) and a fresh one started on the same configuration. Steady state is the token hit rate of the requests through an EPP that started in the second half of the time before the stop; the new replica is back at it from the first of its picks that opens %d consecutive picks of its own at %.0f%% of it or more, counted from the new replica's readiness (its first passed health check at the gateway).\n\n", RecoveryWindow, 100*RecoveryShare)
	b.WriteString("| workload | policy | rate | stop at | ready at | steady hit rate | new replica's picks | back at steady state after readiness | hit rate (%) by second of the run |\n|---|---|---:|---:|---:|---:|---:|---|---|\n")
	for _, p := range with {
		r := p.Restart
		back := "not within the run"
		if r.Recovered {
			back = r.Recovery.Round(time.Millisecond).String()
		}
		var tl []string
		for _, h := range r.Timeline {
			if h.Requests == 0 {
				tl = append(tl, "–")
				continue
			}
			tl = append(tl, fmt.Sprintf("%.0f", 100*h.HitRate))
		}
		fmt.Fprintf(b, "| %s | %s | %g | %s | %s | %.1f%% | %d | %s | %s |\n", p.Workload, p.Policy, p.Rate,
			r.StopAt.Round(time.Millisecond), r.ReadyAt.Round(time.Millisecond), 100*r.Steady, r.NewPicks, back, strings.Join(tl, " "))
	}
	b.WriteString("\n")
}
