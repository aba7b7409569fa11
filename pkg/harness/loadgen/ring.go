package loadgen

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// RingRun is one `kvsim bench` run of the ring (scripts/ring-bench.sh),
// read back from its folder: what ran, when, under what load, and its
// points.
type RingRun struct {
	Name, Command string
	// Commit is the tree the run's kvsim was built from.
	Commit            string
	Started, Finished time.Time
	// Load is the machine's 1-minute load average sampled during the run.
	Load   []float64
	Points []Point
	// Seeds are the run's every seed's figures, from its progress lines:
	// a point keeps only its median run.
	Seeds []SeedRun
	// Replicas, Bypass, RestartAt and Family are the run's shape, read
	// from its command line.
	Replicas  int
	Bypass    float64
	RestartAt time.Duration
	Family    string
}

// Plain says whether the run has the default shape: one replica, no
// restart, no bypass, vLLM's engines.
func (r RingRun) Plain() bool {
	return r.Replicas == 1 && r.Bypass == 0 && r.RestartAt == 0 && r.Family == "vllm"
}

// Files a ring run's folder holds besides the report kvsim bench writes.
const (
	ringMetaFile = "run.json"
	ringLoadFile = "load.txt"
	// ringProgressFile is what kvsim bench printed, a line per seed.
	ringProgressFile = "progress.txt"
	ringDataFile     = "routing-benchmark.json"
)

// ErrRingInput is returned for a ring run's folder that cannot be read as
// one.
var ErrRingInput = errors.New("loadgen: ring run")

// maxRingFile bounds what is read of any one file of a run's folder.
const maxRingFile = 64 << 20

// ReadRingRuns reads every finished run under dir (a folder with run.json;
// one without is still running, or failed, and is left out), in name
// order.
func ReadRingRuns(dir string) ([]RingRun, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRingInput, err)
	}
	var out []RingRun
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		sub := filepath.Join(dir, e.Name())
		if _, err := os.Stat(filepath.Join(sub, ringMetaFile)); err != nil {
			continue
		}
		r, err := readRingRun(sub)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func readRingRun(dir string) (RingRun, error) {
	var r RingRun
	read := func(name string) ([]byte, error) {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRingInput, err)
		}
		defer f.Close()
		b, err := io.ReadAll(io.LimitReader(f, maxRingFile+1))
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrRingInput, name, err)
		}
		if len(b) > maxRingFile {
			return nil, fmt.Errorf("%w: %s/%s is over %d bytes", ErrRingInput, dir, name, maxRingFile)
		}
		return b, nil
	}
	meta, err := read(ringMetaFile)
	if err != nil {
		return r, err
	}
	var m struct {
		Run, Command, Commit string
		Started, Finished    time.Time
	}
	if err := json.Unmarshal(meta, &m); err != nil {
		return r, fmt.Errorf("%w: %s/%s: %w", ErrRingInput, dir, ringMetaFile, err)
	}
	r.Name, r.Command, r.Commit, r.Started, r.Finished = m.Run, m.Command, m.Commit, m.Started, m.Finished
	if r.Name == "" {
		r.Name = filepath.Base(dir)
	}
	if err := r.parseShape(); err != nil {
		return r, fmt.Errorf("%s: %w", dir, err)
	}
	data, err := read(ringDataFile)
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r.Points); err != nil {
		return r, fmt.Errorf("%w: %s/%s: %w", ErrRingInput, dir, ringDataFile, err)
	}
	load, err := read(ringLoadFile)
	if err != nil {
		return r, err
	}
	if r.Load, err = ParseLoad(load); err != nil {
		return r, fmt.Errorf("%s/%s: %w", dir, ringLoadFile, err)
	}
	progress, err := read(ringProgressFile)
	if err != nil {
		return r, err
	}
	r.Seeds = ParseProgress(progress)
	return r, nil
}

// SeedRun is one seed's run of a point, as its progress line gives it.
type SeedRun struct {
	Workload, Policy string
	Rate             float64
	Seed             uint64
	TTFTp90          time.Duration
	HitRate          float64
}

// ParseProgress reads the per-seed lines `kvsim bench` prints (Bench's
// Progress) and skips every other line: checks, restart and P/D lines.
func ParseProgress(b []byte) []SeedRun {
	var out []SeedRun
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		// workload policy rate "req/s" "seed" N "TTFT" "p50" x "p90" y "p99" z "hit" h …
		if len(f) < 16 || f[3] != "req/s" || f[4] != "seed" || f[9] != "p90" || f[13] != "hit" {
			continue
		}
		rate, err1 := strconv.ParseFloat(f[2], 64)
		seed, err2 := strconv.ParseUint(f[5], 10, 64)
		p90, err3 := strconv.ParseFloat(strings.TrimSuffix(f[10], "ms"), 64)
		hit, err4 := strconv.ParseFloat(strings.TrimSuffix(f[14], "%"), 64)
		if err := errors.Join(err1, err2, err3, err4); err != nil || !strings.HasSuffix(f[10], "ms") ||
			!(rate > 0) || !(p90 >= 0) || p90 > float64(math.MaxInt64/int64(time.Millisecond)) || !(hit >= 0 && hit <= 100) {
			continue
		}
		out = append(out, SeedRun{Workload: f[0], Policy: f[1], Rate: rate, Seed: seed,
			TTFTp90: time.Duration(p90 * float64(time.Millisecond)), HitRate: hit / 100})
	}
	return out
}

// seedFigures is a point's every seed's TTFT p90 and hit rate, in seed
// order, for a table cell.
func (r *RingRun) seedFigures(wl, pol string, rate float64) string {
	var p90s, hits []string
	for _, s := range r.Seeds {
		if s.Workload == wl && s.Policy == pol && s.Rate == rate {
			p90s = append(p90s, strconv.FormatInt(s.TTFTp90.Milliseconds(), 10))
			hits = append(hits, strconv.FormatFloat(100*s.HitRate, 'f', 1, 64))
		}
	}
	if len(p90s) == 0 {
		return "— | —"
	}
	return strings.Join(p90s, " / ") + " | " + strings.Join(hits, " / ")
}

// parseShape reads the run's shape from its command line's flags.
func (r *RingRun) parseShape() error {
	r.Replicas, r.Family = 1, "vllm"
	f := strings.Fields(r.Command)
	for i := 0; i < len(f); i++ {
		name, val, has := strings.Cut(strings.TrimLeft(f[i], "-"), "=")
		switch name {
		case "replicas", "bypass", "restart-at", "family":
		default:
			continue
		}
		if !has {
			if i+1 >= len(f) {
				return fmt.Errorf("%w: -%s has no value in %q", ErrRingInput, name, r.Command)
			}
			i++
			val = f[i]
		}
		var err error
		switch name {
		case "replicas":
			r.Replicas, err = strconv.Atoi(val)
		case "bypass":
			r.Bypass, err = strconv.ParseFloat(val, 64)
		case "restart-at":
			r.RestartAt, err = time.ParseDuration(val)
		case "family":
			r.Family = val
		}
		if err != nil {
			return fmt.Errorf("%w: -%s %q: %w", ErrRingInput, name, val, err)
		}
	}
	return nil
}

// ParseLoad reads the load samples scripts/ring-bench.sh writes, one a
// line: a time, then /proc/loadavg's 1-, 5- and 15-minute figures; it
// keeps the 1-minute ones.
func ParseLoad(b []byte) ([]float64, error) {
	var out []float64
	sc := bufio.NewScanner(strings.NewReader(string(b)))
	for n := 1; sc.Scan(); n++ {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 {
			return nil, fmt.Errorf("%w: load line %d: %q has no load average", ErrRingInput, n, sc.Text())
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil || v < 0 || math.IsInf(v, 0) || math.IsNaN(v) {
			return nil, fmt.Errorf("%w: load line %d: %q is not a load average", ErrRingInput, n, f[1])
		}
		out = append(out, v)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: load: %w", ErrRingInput, err)
	}
	return out, nil
}

func (r *RingRun) find(wl, pol string, rate float64) (Point, bool) {
	return find(r.Points, wl, pol, rate)
}

// upstreamBest is the upstream binary's point with the lower TTFT p90 of
// its two configurations at (wl, rate) in run r: "the upstream EPP's"
// figure in every check.
func (r *RingRun) upstreamBest(wl string, rate float64) (Point, bool) {
	var best Point
	found := false
	for _, pol := range []string{PolicyUpstreamEPP, PolicyUpstreamEPPApprox} {
		if p, ok := r.find(wl, pol, rate); ok && (!found || p.TTFTp90 < best.TTFTp90) {
			best, found = p, true
		}
	}
	return best, found
}

// Ring check thresholds, from the issue.
const (
	ringP90Margin    = 1.1
	ringTopRateGain  = 5.0
	ringHitPoints    = 0.01
	ringRestartBound = time.Second
)

// RingChecks evaluates the ring's checks over runs: one row per run,
// workload and claim, saying where it was worst.
func RingChecks(runs []RingRun) []Check {
	var out []Check
	for i := range runs {
		r := &runs[i]
		where := func(wl string) string { return wl + " (" + r.Name + ")" }
		for _, wl := range workloads(r.Points) {
			rs := rates(r.Points, wl)
			// The default against the upstream EPP at every rate.
			worst, detail, n, misses := 0.0, "", 0, []string(nil)
			for _, rate := range rs {
				d, ok1 := r.find(wl, DefaultPolicy, rate)
				u, ok2 := r.upstreamBest(wl, rate)
				if !ok1 || !ok2 {
					continue
				}
				n++
				ratio := float64(d.TTFTp90) / float64(max(u.TTFTp90, time.Microsecond))
				if ratio > worst {
					worst = ratio
					detail = fmt.Sprintf("worst %.2fx at %g req/s: %s against %s's %s", ratio, rate, ms(d.TTFTp90), u.Policy, ms(u.TTFTp90))
				}
				if ratio > ringP90Margin {
					misses = append(misses, fmt.Sprintf("%g", rate))
				}
			}
			if n > 0 {
				if len(misses) > 0 {
					detail += fmt.Sprintf("; above %.1fx at %s req/s", ringP90Margin, strings.Join(misses, ", "))
				}
				out = append(out, Check{Workload: where(wl), Policy: DefaultPolicy, Outcome: outcome(len(misses) == 0), Detail: detail,
					Claim: fmt.Sprintf("the default's TTFT p90 ≤ %.1fx the upstream EPP's at every rate", ringP90Margin)})
			}
			// The cache-pressure workloads' top rate.
			if r.Plain() && strings.HasPrefix(wl, "cache-pressure") && wl != "cache-pressure-cpu" && len(rs) > 1 {
				top := rs[len(rs)-1]
				d, ok1 := r.find(wl, DefaultPolicy, top)
				u, ok2 := r.upstreamBest(wl, top)
				if ok1 && ok2 {
					gain := float64(u.TTFTp90) / float64(max(d.TTFTp90, time.Microsecond))
					out = append(out, Check{Workload: where(wl), Policy: DefaultPolicy,
						Outcome: outcome(gain >= ringTopRateGain && d.OutputTPS >= u.OutputTPS),
						Claim:   fmt.Sprintf("at the top rate the default's TTFT p90 ≥ %.0fx lower than the upstream EPP's, with at least its throughput", ringTopRateGain),
						Detail: fmt.Sprintf("at %g req/s: %s against %s's %s (%.2fx lower); %.0f against %.0f output tok/s",
							top, ms(d.TTFTp90), u.Policy, ms(u.TTFTp90), gain, d.OutputTPS, u.OutputTPS)})
				}
			}
			// Engine families: the default against kvroute-precise.
			if r.Replicas == 1 && r.Bypass == 0 && r.RestartAt == 0 {
				n, misses, worst, detail := 0, []string(nil), -1.0, ""
				for _, rate := range rs {
					d, ok1 := r.find(wl, DefaultPolicy, rate)
					p, ok2 := r.find(wl, PolicyPrecise, rate)
					if !ok1 || !ok2 {
						continue
					}
					n++
					ratio := float64(d.TTFTp90) / float64(max(p.TTFTp90, time.Microsecond))
					short := p.HitRate - d.HitRate
					ok := short <= ringHitPoints && ratio <= ringP90Margin
					if !ok {
						misses = append(misses, fmt.Sprintf("%g", rate))
					}
					// The rate shown is the first miss, or else the one
					// nearest to missing.
					score := max(short/ringHitPoints, ratio/ringP90Margin)
					if (!ok && len(misses) == 1) || (len(misses) == 0 && score > worst) {
						worst = score
						pred := "no predictor figures"
						if a := d.Predictor; a != nil {
							pred = fmt.Sprintf("predictor TTFT MAPE %.1f%%, p90 coverage %.1f%%", 100*a.MAPE, 100*a.Coverage)
						}
						detail = fmt.Sprintf("at %g req/s: hit %.1f%% against %.1f%%, p90 %s against %s (%.2fx); %s",
							rate, 100*d.HitRate, 100*p.HitRate, ms(d.TTFTp90), ms(p.TTFTp90), ratio, pred)
					}
				}
				if n > 0 {
					if len(misses) > 0 {
						detail += fmt.Sprintf("; missed at %s req/s", strings.Join(misses, ", "))
					}
					out = append(out, Check{Workload: where(wl) + ", family " + r.Family, Policy: DefaultPolicy,
						Outcome: outcome(len(misses) == 0),
						Claim:   fmt.Sprintf("the default's hit rate within 1 point of kvroute-precise's and its TTFT p90 ≤ %.1fx that profile's at every rate", ringP90Margin),
						Detail:  detail})
				}
			}
			// The restart.
			if r.RestartAt > 0 {
				for _, rate := range rs {
					d, ok := r.find(wl, DefaultPolicy, rate)
					if !ok || d.Restart == nil {
						continue
					}
					up := "the upstream EPP did not run"
					if u, ok := r.find(wl, PolicyUpstreamEPP, rate); ok && u.Restart != nil {
						up = "the upstream EPP's " + u.Restart.Verdict()
					}
					out = append(out, Check{Workload: where(wl), Policy: DefaultPolicy,
						Outcome: outcome(d.Restart.Recovered && d.Restart.Recovery <= ringRestartBound),
						Claim:   "after an EPP restart, the default's picks back at steady state within one second of readiness",
						Detail:  fmt.Sprintf("at %g req/s: %s; %s", rate, d.Restart.Verdict(), up)})
				}
			}
		}
	}
	return out
}

// ringPolicyOrder is the order of the ring's tables.
var ringPolicyOrder = []string{DefaultPolicy, PolicyPrecise, PolicyKvrouteUpstreamConfig, PolicyUpstreamEPP, PolicyUpstreamEPPApprox, PolicyApprox}

func ringPolicies(pts []Point, wl string) []string {
	ps := policies(pts, wl)
	slices.SortStableFunc(ps, func(a, b string) int {
		ia, ib := slices.Index(ringPolicyOrder, a), slices.Index(ringPolicyOrder, b)
		if ia < 0 {
			ia = len(ringPolicyOrder)
		}
		if ib < 0 {
			ib = len(ringPolicyOrder)
		}
		return ia - ib
	})
	return ps
}

func ringLabel(pol string) string {
	switch pol {
	case DefaultPolicy:
		return "**" + pol + "** (default)"
	case PolicyApprox:
		return pol + " (client-side reference)"
	}
	return pol
}

// loadSummary is a run's load average, as min–max (mean).
func loadSummary(l []float64) string {
	if len(l) == 0 {
		return "not sampled"
	}
	lo, hi, sum := l[0], l[0], 0.0
	for _, v := range l {
		lo, hi, sum = min(lo, v), max(hi, v), sum+v
	}
	return fmt.Sprintf("%.1f–%.1f (mean %.1f)", lo, hi, sum/float64(len(l)))
}

// WriteRingResults writes the ring's results section: the checks, then
// a table per run kind, then what ran, when and under what load.
func WriteRingResults(w io.Writer, runs []RingRun) {
	fmt.Fprintf(w, "Every figure below is a point's median run of 3 seeds (42–44) by TTFT p90; the runs' folders under [results/routing-ring/](results/routing-ring/) hold each seed's line (`progress.txt`), the report `kvsim bench` wrote and its JSON.\n\n")
	fmt.Fprintf(w, "### Checks\n\n| where | claim | result | figure |\n|---|---|---|---|\n")
	checks := RingChecks(runs)
	passed := 0
	for _, c := range checks {
		res := string(c.Outcome)
		if c.Outcome == Fail {
			res = "**fail**"
		} else if c.Outcome == Pass {
			passed++
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", c.Workload, c.Claim, res, c.Detail)
	}
	fmt.Fprintf(w, "\n%d of %d checks pass.\n\n", passed, len(checks))

	fmt.Fprintf(w, "### Policies side by side\n\nOne EPP replica, vLLM's engines; the upstream binary's rows are `upstream-epp` (its built-in configuration) and `upstream-epp-approx` (its chart's file).\n\n")
	fmt.Fprintf(w, "| workload | req/s | policy | hit rate | TTFT p50 | TTFT p90 | TTFT p99 | output tok/s | SLO attainment | errors | cut | TTFT p90 by seed (ms) | hit rate by seed (%%) |\n|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range runs {
		if !r.Plain() {
			continue
		}
		for _, wl := range workloads(r.Points) {
			for _, rate := range rates(r.Points, wl) {
				for _, pol := range ringPolicies(r.Points, wl) {
					if p, ok := r.find(wl, pol, rate); ok {
						fmt.Fprintf(w, "| %s | %g | %s | %.1f%% | %s | %s | %s | %.0f | %.1f%% | %d | %d | %s |\n",
							wl, rate, ringLabel(pol), 100*p.HitRate, ms(p.TTFTp50), ms(p.TTFTp90), ms(p.TTFTp99), p.OutputTPS, 100*p.SLOAttainment, p.Errors, p.Cut, r.seedFigures(wl, pol, rate))
					}
				}
			}
		}
	}

	fmt.Fprintf(w, "\n### Replicas and bypass\n\nEPP replicas behind the gateway (one replica's row is the run above), and a quarter of the requests sent past the EPP by a second gateway.\n\n")
	fmt.Fprintf(w, "| workload | req/s | shape | policy | hit rate | TTFT p90 | output tok/s | errors | TTFT p90 by seed (ms) | hit rate by seed (%%) |\n|---|---:|---|---|---:|---:|---:|---:|---|---|\n")
	shapeRow := func(r RingRun, shape string, only []string) {
		for _, wl := range workloads(r.Points) {
			for _, rate := range rates(r.Points, wl) {
				for _, pol := range ringPolicies(r.Points, wl) {
					if only != nil && !slices.Contains(only, pol) {
						continue
					}
					if p, ok := r.find(wl, pol, rate); ok {
						fmt.Fprintf(w, "| %s | %g | %s | %s | %.1f%% | %s | %.0f | %d | %s |\n", wl, rate, shape, ringLabel(pol), 100*p.HitRate, ms(p.TTFTp90), p.OutputTPS, p.Errors, r.seedFigures(wl, pol, rate))
					}
				}
			}
		}
	}
	shaped := map[string]bool{}
	for _, r := range runs {
		if r.Family == "vllm" && r.RestartAt == 0 && (r.Replicas > 1 || r.Bypass > 0) {
			for _, p := range r.Points {
				shaped[p.Workload+"@"+strconv.FormatFloat(p.Rate, 'g', -1, 64)] = true
			}
		}
	}
	for _, r := range runs {
		if !r.Plain() {
			continue
		}
		// The one-replica baseline, at the points the shaped runs took.
		base := r
		base.Points = slices.DeleteFunc(slices.Clone(r.Points), func(p Point) bool {
			return !shaped[p.Workload+"@"+strconv.FormatFloat(p.Rate, 'g', -1, 64)]
		})
		shapeRow(base, "1 replica", []string{DefaultPolicy, PolicyUpstreamEPP})
	}
	for _, r := range runs {
		switch {
		case r.Family != "vllm" || r.RestartAt > 0:
		case r.Replicas > 1:
			shapeRow(r, fmt.Sprintf("%d replicas", r.Replicas), nil)
		case r.Bypass > 0:
			shapeRow(r, fmt.Sprintf("bypass %g", r.Bypass), nil)
		}
	}

	fmt.Fprintf(w, "\n### Restart\n\nThe first EPP replica stopped (`--restart-at`) and a fresh one started; steady state and recovery as defined under \"Run shapes\" above.\n\n")
	fmt.Fprintf(w, "| workload | req/s | policy | stopped at | ready at | steady hit rate | new replica's picks | recovery after readiness | hit rate | TTFT p90 | errors |\n|---|---:|---|---:|---:|---:|---:|---|---:|---:|---:|\n")
	for _, r := range runs {
		if r.RestartAt == 0 {
			continue
		}
		for _, wl := range workloads(r.Points) {
			for _, rate := range rates(r.Points, wl) {
				for _, pol := range ringPolicies(r.Points, wl) {
					p, ok := r.find(wl, pol, rate)
					if !ok || p.Restart == nil {
						continue
					}
					rs := p.Restart
					rec := "never"
					if rs.Recovered {
						rec = rs.Recovery.Round(time.Millisecond).String()
					}
					fmt.Fprintf(w, "| %s | %g | %s | %s | %s | %.1f%% | %d | %s | %.1f%% | %s | %d |\n", wl, rate, ringLabel(pol),
						rs.StopAt.Round(time.Millisecond), rs.ReadyAt.Round(time.Millisecond), 100*rs.Steady, rs.NewPicks, rec, 100*p.HitRate, ms(p.TTFTp90), p.Errors)
				}
			}
		}
	}

	fmt.Fprintf(w, "\n### Engine families\n\nThe predictor replays vLLM's scheduler whatever the family; its TTFT MAPE and p90 coverage are read from its own metrics at the end of the run.\n\n")
	fmt.Fprintf(w, "| family | workload | req/s | policy | hit rate | TTFT p90 | output tok/s | predictor TTFT MAPE | p90 coverage | TTFT p90 by seed (ms) | hit rate by seed (%%) |\n|---|---|---:|---|---:|---:|---:|---:|---:|---|---|\n")
	for _, r := range runs {
		if r.Replicas != 1 || r.Bypass != 0 || r.RestartAt != 0 {
			continue
		}
		famRuns := 0
		for _, o := range runs {
			if o.Family != "vllm" {
				famRuns++
			}
		}
		for _, wl := range workloads(r.Points) {
			rs := rates(r.Points, wl)
			if wl != "cache-pressure" || len(rs) == 0 || (r.Family == "vllm" && famRuns == 0) {
				continue
			}
			rate := rs[0]
			for _, pol := range []string{DefaultPolicy, PolicyPrecise, PolicyUpstreamEPP} {
				p, ok := r.find(wl, pol, rate)
				if !ok {
					continue
				}
				mape, cov := "—", "—"
				if a := p.Predictor; a != nil {
					mape, cov = fmt.Sprintf("%.1f%%", 100*a.MAPE), fmt.Sprintf("%.1f%%", 100*a.Coverage)
				}
				fmt.Fprintf(w, "| %s | %s | %g | %s | %.1f%% | %s | %.0f | %s | %s | %s |\n", r.Family, wl, rate, ringLabel(pol), 100*p.HitRate, ms(p.TTFTp90), p.OutputTPS, mape, cov, r.seedFigures(wl, pol, rate))
			}
		}
	}

	fmt.Fprintf(w, "\n### What ran\n\nThe machine has 2 cores, shared with other builds while these ran; the load average (1 minute, sampled every 15 s) is each run's.\n\n| run | command | commit | started (UTC) | took | load average |\n|---|---|---|---|---:|---|\n")
	for _, r := range runs {
		fmt.Fprintf(w, "| %s | `%s` | %s | %s | %s | %s |\n", r.Name, r.Command, r.Commit, r.Started.UTC().Format("2006-01-02 15:04"), r.Finished.Sub(r.Started).Round(time.Second), loadSummary(r.Load))
	}
}

// Markers around the generated part of docs/routing-benchmark.md.
const (
	RingBegin = "<!-- The ring's results: generated by `go run ./cmd/kvsim ring-report` from docs/results/routing-ring/; do not edit. -->"
	RingEnd   = "<!-- End of the ring's results. -->"
)

// SpliceRing replaces what lies between the markers in doc with body; a
// doc without them is refused, so that nothing hand-written is
// overwritten.
func SpliceRing(doc, body string) (string, error) {
	i := strings.Index(doc, RingBegin)
	j := strings.Index(doc, RingEnd)
	if i < 0 || j < i {
		return "", fmt.Errorf("loadgen: the document has no ring markers (%q … %q)", RingBegin, RingEnd)
	}
	return doc[:i+len(RingBegin)] + "\n\n" + strings.TrimSpace(body) + "\n\n" + doc[j:], nil
}
