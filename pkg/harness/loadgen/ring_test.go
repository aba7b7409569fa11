package loadgen

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ringPt(wl, pol string, rate float64, p90 time.Duration, hit, tps float64) Point {
	return Point{Workload: wl, Policy: pol, Rate: rate, Summary: Summary{TTFTp90: p90, HitRate: hit, OutputTPS: tps}}
}

func outcomeOf(t *testing.T, cs []Check, where, claimPart string) Outcome {
	t.Helper()
	for _, c := range cs {
		if c.Workload == where && strings.Contains(c.Claim, claimPart) {
			return c.Outcome
		}
	}
	t.Fatalf("no check %q at %q in %+v", claimPart, where, cs)
	return ""
}

func TestRingChecksJudgeTheDefaultAgainstTheBetterUpstreamConfiguration(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name                  string
		def, upstream, approx time.Duration
		want                  Outcome
	}{
		{"within 1.1x of the better configuration passes", 540 * ms, 500 * ms, 900 * ms, Pass},
		{"above 1.1x of the better configuration fails though the other is worse", 560 * ms, 900 * ms, 500 * ms, Fail},
		{"lower than both passes", 100 * ms, 500 * ms, 600 * ms, Pass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := RingRun{Name: "r", Replicas: 1, Family: "vllm", Points: []Point{
				ringPt("cache-pressure", DefaultPolicy, 36, tc.def, 0.8, 100),
				ringPt("cache-pressure", PolicyUpstreamEPP, 36, tc.upstream, 0.8, 100),
				ringPt("cache-pressure", PolicyUpstreamEPPApprox, 36, tc.approx, 0.8, 100),
			}}
			got := outcomeOf(t, RingChecks([]RingRun{run}), "cache-pressure (r)", "the upstream EPP's at every rate")
			if got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRingTopRateCheckNeedsFiveTimesLowerP90AndAsMuchThroughput(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name         string
		def, up      time.Duration
		defTPS, upTP float64
		want         Outcome
	}{
		{"5x lower with more throughput passes", 100 * ms, 500 * ms, 900, 800, Pass},
		{"4.9x lower fails", 100 * ms, 490 * ms, 900, 800, Fail},
		{"5x lower with less throughput fails", 100 * ms, 600 * ms, 700, 800, Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := RingRun{Name: "r", Replicas: 1, Family: "vllm", Points: []Point{
				// The lower rate is not the top rate: its figures do not count.
				ringPt("cache-pressure-1.5x", DefaultPolicy, 36, time.Second, 0.8, 1),
				ringPt("cache-pressure-1.5x", PolicyUpstreamEPP, 36, time.Second, 0.8, 1),
				ringPt("cache-pressure-1.5x", DefaultPolicy, 54, tc.def, 0.8, tc.defTPS),
				ringPt("cache-pressure-1.5x", PolicyUpstreamEPP, 54, tc.up, 0.8, tc.upTP),
			}}
			got := outcomeOf(t, RingChecks([]RingRun{run}), "cache-pressure-1.5x (r)", "at the top rate")
			if got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRingFamilyCheckHoldsTheDefaultToThePreciseProfile(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	for _, tc := range []struct {
		name                string
		defHit, precHit     float64
		defP90, precP90     time.Duration
		want                Outcome
		wantDetailSubstring string
	}{
		{"a point below precise's hit rate and a lower p90 passes", 0.871, 0.880, 400 * ms, 500 * ms, Pass, "hit 87.1% against 88.0%"},
		{"more than a point below fails", 0.865, 0.880, 400 * ms, 500 * ms, Fail, "missed at 36"},
		{"a p90 above 1.1x fails", 0.9, 0.88, 560 * ms, 500 * ms, Fail, "1.12x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			run := RingRun{Name: "family-fifo", Replicas: 1, Family: "fifo", Points: []Point{
				ringPt("cache-pressure", DefaultPolicy, 36, tc.defP90, tc.defHit, 1),
				ringPt("cache-pressure", PolicyPrecise, 36, tc.precP90, tc.precHit, 1),
			}}
			cs := RingChecks([]RingRun{run})
			if got := outcomeOf(t, cs, "cache-pressure (family-fifo), family fifo", "kvroute-precise"); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
			if !strings.Contains(cs[0].Detail, tc.wantDetailSubstring) {
				t.Errorf("detail %q lacks %q", cs[0].Detail, tc.wantDetailSubstring)
			}
		})
	}
}

func TestRingRestartCheckWantsRecoveryWithinASecond(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    Restart
		want Outcome
	}{
		{"back 170ms after readiness passes", Restart{Recovered: true, Recovery: 170 * time.Millisecond}, Pass},
		{"back 1.2s after readiness fails", Restart{Recovered: true, Recovery: 1200 * time.Millisecond}, Fail},
		{"never back fails", Restart{NewPicks: 40}, Fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := ringPt("cache-pressure", DefaultPolicy, 36, time.Second, 0.8, 1)
			d.Restart = &tc.r
			u := ringPt("cache-pressure", PolicyUpstreamEPP, 36, time.Second, 0.8, 1)
			u.Restart = &Restart{NewPicks: 12}
			run := RingRun{Name: "restart", Replicas: 1, Family: "vllm", RestartAt: 4 * time.Second, Points: []Point{d, u}}
			cs := RingChecks([]RingRun{run})
			if got := outcomeOf(t, cs, "cache-pressure (restart)", "after an EPP restart"); got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
			for _, c := range cs {
				if strings.Contains(c.Claim, "after an EPP restart") && !strings.Contains(c.Detail, "the upstream EPP's its 12 picks never reached") {
					t.Errorf("the restart check does not report upstream's: %q", c.Detail)
				}
				if strings.Contains(c.Claim, "at the top rate") {
					t.Errorf("a restart run was judged as the plain top rate: %+v", c)
				}
			}
		})
	}
}

func TestRingRunsReadBackWhatTheScriptWrites(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(run, cmd string, pts []Point, load string) {
		sub := filepath.Join(dir, run)
		if err := os.MkdirAll(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(pts)
		meta := `{"run": "` + run + `", "command": "` + cmd + `", "commit": "99c62bb0aa11", "started": "2026-12-07T11:00:00Z", "finished": "2026-12-07T11:04:30Z"}`
		progress := "cache-pressure kvroute-predicted-latency  36.0 req/s  seed 42   TTFT p50    28ms p90   449ms p99   736ms  hit  88.2%  SLO  84.9%  goodput  31.9/s  (311 req, 0 shed, 0 err, 0 cut)  predicted TTFT: MAPE 41.9%, p90 coverage 90.4%\n" +
			"cache-pressure kvroute-predicted-latency  36.0 req/s  seed 43   TTFT p50    80ms p90   741ms p99  1019ms  hit  85.3%  SLO  75.6%  goodput  25.7/s  (283 req, 0 shed, 0 err, 0 cut)\n" +
			"              restart: stopped epp-0 at 4s, epp-1 ready at 5.1s; steady hit rate 88.0%; its picks back at steady state 120ms after readiness\n" +
			"check fail cache-pressure: a claim — a detail\n"
		for name, data := range map[string]string{ringMetaFile: meta, ringDataFile: string(raw), ringLoadFile: load, ringProgressFile: progress} {
			if err := os.WriteFile(filepath.Join(sub, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	pts := []Point{
		ringPt("cache-pressure", DefaultPolicy, 36, 400*time.Millisecond, 0.88, 900),
		ringPt("cache-pressure", PolicyUpstreamEPP, 36, 450*time.Millisecond, 0.87, 890),
	}
	write("cp", "go run ./cmd/kvsim bench -workloads cache-pressure -rates 36 -seeds 3", pts, "2026-12-07T11:00:00Z 3.10 2.00 1.00\n2026-12-07T11:00:15Z 5.30 2.50 1.10\n")
	write("replicas-2", "go run ./cmd/kvsim bench -workloads cache-pressure -replicas 2 -seeds 3", pts, "x 1.0 1.0 1.0\n")
	write("family-fifo", "go run ./cmd/kvsim bench -family=fifo -seeds 3", pts, "x 2.0 1.0 1.0\n")
	// A run still going has no run.json and is left out.
	if err := os.MkdirAll(filepath.Join(dir, "restart"), 0o755); err != nil {
		t.Fatal(err)
	}

	runs, err := ReadRingRuns(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 3 {
		t.Fatalf("read %d runs, want 3", len(runs))
	}
	byName := map[string]RingRun{}
	for _, r := range runs {
		byName[r.Name] = r
	}
	if r := byName["cp"]; !r.Plain() || len(r.Points) != 2 || len(r.Load) != 2 || r.Load[1] != 5.3 {
		t.Errorf("cp read as %+v", r)
	}
	if r := byName["replicas-2"]; r.Replicas != 2 || r.Plain() {
		t.Errorf("replicas-2 read as %+v", r)
	}
	if r := byName["family-fifo"]; r.Family != "fifo" {
		t.Errorf("family-fifo read as %+v", r)
	}

	var b strings.Builder
	WriteRingResults(&b, runs)
	for _, want := range []string{
		"| cache-pressure | 36 | **kvroute-predicted-latency** (default) | 88.0% |",
		"| 0 | 0 | 449 / 741 | 88.2 / 85.3 |",
		"| cache-pressure | 36 | 2 replicas | upstream-epp | 87.0% | 450ms | 890 | 0 |",
		"| cache-pressure | 36 | 1 replica | **kvroute-predicted-latency** (default) |",
		"| fifo | cache-pressure | 36 | upstream-epp |",
		"| cp | `go run ./cmd/kvsim bench -workloads cache-pressure -rates 36 -seeds 3` | 99c62bb0aa11 | 2026-12-07 11:00 | 4m30s | 3.1–5.3 (mean 4.2) |",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the results lack %q:\n%s", want, b.String())
		}
	}
}

func TestRingRunsRefuseWhatTheyCannotRead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, meta, data, load string
	}{
		{"meta not JSON", "{", "[]", ""},
		{"points not JSON", `{"run":"x","command":"c"}`, "[{", ""},
		{"load without a figure", `{"run":"x","command":"c"}`, "[]", "2026-12-07T11:00:00Z\n"},
		{"a negative load", `{"run":"x","command":"c"}`, "[]", "t -1 0 0\n"},
		{"a flag without its value", `{"run":"x","command":"kvsim bench -replicas"}`, "[]", ""},
		{"a replica count that is not one", `{"run":"x","command":"kvsim bench -replicas two"}`, "[]", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			sub := filepath.Join(dir, "x")
			if err := os.MkdirAll(sub, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, data := range map[string]string{ringMetaFile: tc.meta, ringDataFile: tc.data, ringLoadFile: tc.load, ringProgressFile: ""} {
				if err := os.WriteFile(filepath.Join(sub, name), []byte(data), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := ReadRingRuns(dir); !errors.Is(err, ErrRingInput) {
				t.Errorf("got %v, want ErrRingInput", err)
			}
		})
	}
}

func TestSpliceRingReplacesOnlyWhatLiesBetweenTheMarkers(t *testing.T) {
	t.Parallel()
	doc := "# Doc\n\nhand-written\n\n" + RingBegin + "\nold figures\n" + RingEnd + "\n\nafter\n"
	got, err := SpliceRing(doc, "new figures\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "# Doc\n\nhand-written\n\n" + RingBegin + "\n\nnew figures\n\n" + RingEnd + "\n\nafter\n"
	if got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	again, err := SpliceRing(got, "new figures\n")
	if err != nil || again != got {
		t.Errorf("splicing twice changed the document: %v\n%s", err, again)
	}
	if _, err := SpliceRing("# Doc without markers\n", "x"); err == nil {
		t.Error("a document without markers was overwritten")
	}
}

func FuzzParseLoad(f *testing.F) {
	f.Add([]byte("2026-12-07T11:00:00Z 3.10 2.00 1.00\n"))
	f.Add([]byte("t NaN 0 0\n"))
	f.Add([]byte("t 1e400\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		vs, err := ParseLoad(b)
		if err != nil {
			if !errors.Is(err, ErrRingInput) {
				t.Fatalf("error %v is not ErrRingInput", err)
			}
			return
		}
		for _, v := range vs {
			if v < 0 || v != v {
				t.Fatalf("kept load %v", v)
			}
		}
	})
}

func FuzzRingShape(f *testing.F) {
	f.Add("go run ./cmd/kvsim bench -replicas 2 -bypass 0.25 -restart-at 4s -family fifo")
	f.Add("bench --family=drawn,usage=resident -replicas")
	f.Fuzz(func(t *testing.T, cmd string) {
		r := RingRun{Command: cmd}
		if err := r.parseShape(); err != nil && !errors.Is(err, ErrRingInput) {
			t.Fatalf("error %v is not ErrRingInput", err)
		}
	})
}

func FuzzParseProgress(f *testing.F) {
	f.Add([]byte("cache-pressure kvroute-predicted-latency  36.0 req/s  seed 42   TTFT p50    28ms p90   449ms p99   736ms  hit  88.2%  SLO  84.9%\n"))
	f.Add([]byte("w p NaN req/s seed 1 TTFT p50 1ms p90 1e300ms p99 1ms hit 101% x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, s := range ParseProgress(b) {
			if !(s.Rate > 0) || s.TTFTp90 < 0 || s.HitRate < 0 || s.HitRate > 1 {
				t.Fatalf("kept %+v", s)
			}
		}
	})
}
