package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// childEnv makes the test binary run the EPP's main instead of tests, so
// that a benchmark can start the real command as a process of its own.
const childEnv = "KVROUTE_EPP_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// BenchmarkEPPProcess measures ext_proc overhead as deployed: the EPP runs
// as its own process (this command's main), consuming KV events from 64
// simulated engines over NATS and scraping their /metrics, while this
// process plays Envoy. Each engine holds a different 32k-token prefix; a
// request is an 8k-token prompt given as token ids, sharing all but its
// last block with one of them. Requests arrive at 250, 500, 1000, 1500
// and 2000/s (open loop, at most 64 in flight), each timed from when it
// was due. The EPP's CPU per request is read from /proc, apart from the
// load generator's. KVROUTE_EPP_GOGC and KVROUTE_EPP_GOMAXPROCS set the EPP's
// GOGC and GOMAXPROCS.
func BenchmarkEPPProcess(b *testing.B) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		b.Skip("needs /proc to read the EPP's CPU time")
	}
	const (
		endpoints = 64
		blockSize = 16
		prefixLen = 32768
		size      = 8192
	)
	f := fleet.Start(b, fleet.Options{
		Endpoints: endpoints, BlockSize: blockSize, GPUBlocks: 4096,
		NoTokenizer: true, ScrapeInterval: time.Hour,
	})
	var file strings.Builder
	file.WriteString("endpoints:\n")
	for i, s := range f.Servers {
		fmt.Fprintf(&file, "- {name: pod-%d, address: '%s', model: m}\n", i, s.Addr)
	}
	dir := b.TempDir()
	epFile := filepath.Join(dir, "endpoints.yaml")
	if err := os.WriteFile(epFile, []byte(file.String()), 0o600); err != nil {
		b.Fatal(err)
	}
	grpcAddr, healthAddr, httpAddr := testkit.FreeAddr(b), testkit.FreeAddr(b), testkit.FreeAddr(b)
	var logs testkit.LogBuffer
	cmd := exec.Command(os.Args[0],
		"--nats-url", f.EPP.NATSURL(), "--pool-name", f.EPP.Pool(), "--pool-namespace", f.EPP.Namespace(),
		"--endpoints-file", epFile, "--grpc-addr", grpcAddr, "--grpc-health-addr", healthAddr,
		"--http-addr", httpAddr, "--secure-serving=false", "--refresh-metrics-interval=1s",
		"--tokenize=false", "--log-level=warn", "--enable-pprof")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	for _, knob := range []string{"GOGC", "GOMAXPROCS"} {
		if v := os.Getenv("KVROUTE_EPP_" + knob); v != "" {
			cmd.Env = append(cmd.Env, knob+"="+v)
		}
	}
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			b.Errorf("the EPP did not stop within 10s of SIGTERM\n%s", logs.String())
		}
	})
	metrics := "http://" + httpAddr + "/metrics"
	waitUntil(b, "the EPP to be ready", &logs, func() bool {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})

	// The engines fill their caches only now, so the EPP hears every event.
	bodies := fleet.PrefixBodies(f.FillPrefixes(b, prefixLen), size)
	want := float64(endpoints * prefixLen / blockSize)
	waitUntil(b, "the EPP's index to hold every engine's prefix", &logs, func() bool {
		return readMetric(metrics, "kvroute_index_blocks") >= want
	})

	c, err := envoy.Dial(grpcAddr, true)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	// Warm the connection and the EPP's pools before measuring.
	envoy.Load{Bodies: bodies, N: 500, Workers: 64, Interval: time.Millisecond}.Run(c)

	pid := cmd.Process.Pid
	b.Run("idle", func(b *testing.B) {
		// What the EPP costs with no traffic: the scrapes of 64 endpoints
		// once a second, the index's upkeep, the Go runtime.
		eppCPU, start := procCPU(b, pid), time.Now()
		time.Sleep(time.Duration(b.N) * time.Millisecond)
		used := procCPU(b, pid) - eppCPU
		b.ReportMetric(float64(used.Milliseconds())/time.Since(start).Seconds(), "epp-cpu-ms/s")
	})
	for _, rate := range []int{250, 500, 1000, 1500, 2000} {
		b.Run(fmt.Sprintf("rate%d", rate), func(b *testing.B) {
			interval := time.Second / time.Duration(rate)
			// KVROUTE_EPP_PROFILE=file saves a CPU profile of the EPP under
			// load, and file.allocs what it allocated meanwhile.
			profiled := make(chan error, 1)
			if path := os.Getenv("KVROUTE_EPP_PROFILE"); path != "" {
				secs := max(1, b.N/rate-1)
				path = fmt.Sprintf("%s.rate%d", path, rate)
				go func() {
					base := fmt.Sprintf("http://%s/debug/pprof/", httpAddr)
					errs := make(chan error, 1)
					go func() { errs <- saveProfile(fmt.Sprintf("%sallocs?seconds=%d", base, secs), path+".allocs") }()
					err := saveProfile(fmt.Sprintf("%sprofile?seconds=%d", base, secs), path)
					profiled <- errors.Join(err, <-errs)
				}()
			} else {
				profiled <- nil
			}
			b.ResetTimer()
			eppCPU, ownCPU := procCPU(b, pid), procCPU(b, os.Getpid())
			res := envoy.Load{Bodies: bodies, N: b.N, Workers: 64, Interval: interval}.Run(c)
			eppCPU, ownCPU = procCPU(b, pid)-eppCPU, procCPU(b, os.Getpid())-ownCPU
			b.StopTimer()
			if err := <-profiled; err != nil {
				b.Error(err)
			}
			if res.Failures > 0 {
				b.Fatalf("%d of %d requests failed\n%s", res.Failures, b.N, logs.String())
			}
			b.ReportMetric(float64(res.Quantile(0.50).Microseconds()), "p50-µs")
			b.ReportMetric(float64(res.Quantile(0.99).Microseconds()), "p99-µs")
			b.ReportMetric(float64(b.N)/res.Elapsed.Seconds(), "req/s")
			b.ReportMetric(float64(eppCPU.Microseconds())/float64(b.N), "epp-cpu-µs/req")
			b.ReportMetric(float64(ownCPU.Microseconds())/float64(b.N), "envoy-side-cpu-µs/req")
		})
	}
}

func saveProfile(url, path string) error {
	resp, err := http.Get(url)
	if err != nil {
		return fmt.Errorf("EPP profile: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("EPP profile: status %d: %v", resp.StatusCode, err)
	}
	return os.WriteFile(path, data, 0o600)
}

func waitUntil(tb testing.TB, what string, logs *testkit.LogBuffer, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting for %s\n%s", what, logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readMetric reads one unlabelled metric from a Prometheus text endpoint; -1
// when it cannot.
func readMetric(url, name string) float64 {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// procCPU is the user and system CPU time a process has used, from
// /proc/<pid>/stat (in clock ticks of 1/100 s, Linux's USER_HZ).
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	rest := raw[bytes.LastIndexByte(raw, ')')+2:]
	fields := strings.Fields(string(rest))
	// fields[0] is field 3 (state); utime and stime are fields 14 and 15.
	ut, err1 := strconv.ParseInt(fields[11], 10, 64)
	st, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("/proc/%d/stat: %q", pid, raw)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond
}
