// Command kvsim is a simulated vLLM fleet and the routing benchmark.
//
//	kvsim demo  [--serve]   kvroute against random routing on a small fleet (make run)
//	kvsim serve             a fleet with vLLM's HTTP API, publishing KV events
//	kvsim bench             the routing benchmark (make bench-routing)
//	kvsim predict-eval      the latency predictor's learning methods compared on recorded traces
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/loadgen"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kvsim:", err)
		os.Exit(1)
	}
}

const usage = `usage: kvsim <command> [flags]
  demo    kvroute against random routing on a small simulated fleet (--serve keeps it up)
  serve   a simulated vLLM fleet with HTTP APIs, publishing KV events to NATS or ZeroMQ
  bench   the routing benchmark; writes docs/results/routing/ (--virtual: docs/results/routing-virtual/; another --family: a -<family> suffix; --pd: the P/D workload's five policies, docs/results/routing-pd/; --pd-topology: the P/D workload across two racks, docs/results/routing-pd-topology/; --tenants: the multi-tenant workload and flow control, docs/results/routing-tenants/)
  chaos   the fault matrix against relays, NATS and two EPP replicas; writes docs/results/chaos.md
  scale   1k and 10k simulated engines in virtual time through the real event path; writes docs/results/scale.md
  predict-eval  the latency predictor's learning methods compared on traces recorded in virtual time
  placement  prefix groups against the engines' cache capacity, in virtual time: hit rate, TTFT, requests and evictions per engine
  ring-report  regenerates docs/routing-benchmark.md's ring results from the runs under docs/results/routing-ring/ (scripts/ring-bench.sh)`

func run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	switch args[0] {
	case "demo":
		return demo(ctx, args[1:])
	case "serve":
		return serve(ctx, args[1:])
	case "bench":
		return bench(ctx, args[1:])
	case "chaos":
		return chaosCmd(ctx, args[1:])
	case "scale":
		return scaleCmd(ctx, args[1:])
	case "predict-eval":
		return predictEval(ctx, args[1:])
	case "placement":
		return placement(ctx, args[1:])
	case "ring-report":
		return ringReport(args[1:])
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usage)
	}
}

// fleetFlags are the flags every command shares.
type fleetFlags struct {
	engines, blockSize, gpuBlocks, cpuBlocks, maxSeqs int
	prefill, load, decode                             time.Duration
	encoding, model, family                           string
}

func (f *fleetFlags) register(fs *flag.FlagSet, engines, gpuBlocks int) {
	t := sim.DefaultTiming()
	fs.IntVar(&f.engines, "engines", engines, "simulated engines")
	fs.IntVar(&f.blockSize, "block-size", 16, "tokens per KV block")
	fs.IntVar(&f.gpuBlocks, "gpu-blocks", gpuBlocks, "GPU KV cache capacity per engine, in blocks")
	fs.IntVar(&f.cpuBlocks, "cpu-blocks", 0, "CPU offload tier capacity per engine, in blocks (0: none)")
	fs.IntVar(&f.maxSeqs, "max-num-seqs", t.MaxSeqs, "concurrently running sequences per engine")
	fs.DurationVar(&f.prefill, "prefill-per-token", t.PrefillPerToken, "time to compute one uncached prompt token")
	fs.DurationVar(&f.load, "load-per-token", t.LoadPerToken, "time to load one cached token from the CPU tier")
	fs.DurationVar(&f.decode, "decode-step", t.DecodeStep, "time of one decode step")
	fs.StringVar(&f.encoding, "encoding", "mixed", "KV event encoding: array, map, or mixed (alternating)")
	fs.StringVar(&f.model, "model", "sim-model", "served model name")
	fs.StringVar(&f.family, "family", sim.FamilyVLLM, "engine family: "+strings.Join(sim.FamilyNames, ", ")+
		"; traits may follow after commas: usage=resident (KV usage counts cached blocks no request uses), silent=<duration> (no KV events for that long after start), silent-metrics (nor metrics)")
}

func (f *fleetFlags) options() (loadgen.FleetOptions, error) {
	t := sim.DefaultTiming()
	t.PrefillPerToken, t.LoadPerToken, t.DecodeStep, t.MaxSeqs = f.prefill, f.load, f.decode, f.maxSeqs
	o := loadgen.FleetOptions{
		Engines: f.engines, Model: f.model, Timing: t,
		Pool: blockpool.Config{BlockSize: f.blockSize, GPUBlocks: f.gpuBlocks, CPUBlocks: f.cpuBlocks},
	}
	var err error
	if o.Family, err = sim.ParseFamily(f.family); err != nil {
		return o, fmt.Errorf("--family: %w", err)
	}
	switch f.encoding {
	case "array":
		o.Encoding = events.EncodingArray
	case "map":
		o.Encoding = events.EncodingMap
	case "mixed":
		o.Mixed = true
	default:
		return o, fmt.Errorf("--encoding must be array, map or mixed, not %q", f.encoding)
	}
	if f.engines <= 0 || f.blockSize <= 0 || f.gpuBlocks <= 0 || f.cpuBlocks < 0 || f.maxSeqs <= 0 {
		return o, errors.New("--engines, --block-size, --gpu-blocks and --max-num-seqs must be positive, --cpu-blocks not negative")
	}
	return o, nil
}

func demo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvsim demo", flag.ContinueOnError)
	var ff fleetFlags
	ff.register(fs, 4, 512)
	serveOn := fs.Bool("serve", false, "keep kvroute's EPP and fleet serving after the comparison, until interrupted")
	rate := fs.Float64("rate", 20, "requests per second")
	dur := fs.Duration("duration", 10*time.Second, "how long each routing's traffic runs")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fo, err := ff.options()
	if err != nil {
		return err
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	return loadgen.Demo(ctx, loadgen.DemoOptions{
		Fleet: fo,
		Workload: loadgen.Workload{Name: "shared-prefix", Kind: loadgen.KindSharedPrefix,
			Groups: 8, SystemTokens: 2048, QuestionTokens: 64},
		Rate: *rate, Duration: *dur, Serve: *serveOn, Out: os.Stdout,
	})
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvsim serve", flag.ContinueOnError)
	var ff fleetFlags
	ff.register(fs, 4, 2048)
	natsURL := fs.String("nats-url", os.Getenv("NATS_URL"), "NATS server to publish KV events to; empty starts an embedded one")
	natsPort := fs.Int("embedded-nats-port", 4222, "loopback port of the embedded NATS server")
	ns := fs.String("pool-namespace", "default", "namespace of the pool the events belong to")
	pool := fs.String("pool-name", "kvsim", "pool the events belong to")
	out := fs.String("events", "nats", "where KV events go: nats, zmq, both, or none")
	zmqBase := fs.Int("zmq-base-port", 5557, "engine i binds its ZeroMQ PUB socket on tcp://127.0.0.1:<base+i> (and replay on base+100+i)")
	host := fs.String("host", "127.0.0.1", "host the engines' HTTP APIs listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	fo, err := ff.options()
	if err != nil {
		return err
	}
	fc := sim.FleetConfig{Engines: fo.Engines, Model: fo.Model, Pool: fo.Pool, Timing: fo.Timing,
		Encoding: fo.Encoding, MixedEncodings: fo.Mixed, Host: *host, Family: fo.Family}
	if *out == "nats" || *out == "both" {
		url := *natsURL
		if url == "" {
			srv, err := natsembed.Start(natsembed.Options{Port: *natsPort})
			if err != nil {
				return err
			}
			defer srv.Shutdown()
			url = srv.ClientURL()
			fmt.Printf("embedded NATS at %s\n", url)
		}
		nc, err := nats.Connect(url, nats.Name("kvsim"))
		if err != nil {
			return fmt.Errorf("connect to NATS at %s: %w", url, err)
		}
		defer nc.Close()
		fc.Publisher = events.NewPublisher(nc, *ns, *pool)
		// Each engine's relay answers snapshot requests and sends
		// heartbeats, as in a pod.
		fc.Sidecar = simkit.Relays(fc.Publisher, 0)
		fmt.Printf("KV events on %s\n", events.PoolSubject(*ns, *pool))
	}
	if *out == "zmq" || *out == "both" {
		fc.ZMQ = func(i int) *sim.ZMQConfig {
			return &sim.ZMQConfig{
				Endpoint:       fmt.Sprintf("tcp://127.0.0.1:%d", *zmqBase+i),
				ReplayEndpoint: fmt.Sprintf("tcp://127.0.0.1:%d", *zmqBase+100+i),
				Bind:           true,
			}
		}
	} else if *out != "nats" && *out != "none" {
		return fmt.Errorf("--events must be nats, zmq, both or none, not %q", *out)
	}
	f, err := sim.StartFleet(ctx, fc)
	if err != nil {
		return err
	}
	for i, s := range f.Servers {
		cfg := s.Core().Engine().Config()
		line := fmt.Sprintf("%s  http://%s", cfg.Pod, s.Addr())
		if fc.ZMQ != nil {
			line += fmt.Sprintf("  zmq tcp://127.0.0.1:%d", *zmqBase+i)
		}
		fmt.Println(line)
	}
	fmt.Printf("try: curl -s http://%s/v1/completions -H 'Content-Type: application/json' -d '{\"model\":%q,\"prompt\":\"hello world\",\"max_tokens\":4}'\n",
		f.Servers[0].Addr(), fo.Model)
	<-ctx.Done()
	return f.Close()
}

func bench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvsim bench", flag.ContinueOnError)
	var ff fleetFlags
	ff.register(fs, 4, 512)
	dur := fs.Duration("duration", 8*time.Second, "arrivals per run")
	minReq := fs.Int("min-requests", 240, "lengthen the arrivals of runs at low rates until about this many requests arrive (0: never)")
	drain := fs.Duration("drain", 5*time.Second, "time allowed after arrivals before requests in flight are cut")
	outDir := fs.String("out", "", "directory for routing-benchmark.md, its JSON and its SVG plots (default docs/results/routing, or docs/results/routing-virtual with --virtual)")
	virtual := fs.Bool("virtual", false, "run in virtual time: no HTTP, NATS or sleeping, kvroute's scheduler in process; seconds instead of minutes")
	quick := fs.Bool("quick", false, "one rate per workload and short runs, to try the machinery")
	only := fs.String("workloads", "", "comma-separated workloads to run (default all)")
	rates := fs.String("rates", "", "comma-separated request rates overriding every workload's ladder")
	policies := fs.String("policies", strings.Join(loadgen.AllPolicies, ","), "policies to compare; also kvroute-predicted-latency-unshared (the default with its replicas' dispatch sharing off, for --replicas above 1), and upstream-epp, upstream-epp-approx and kvroute-upstream-config, through the gateway (they need scripts/upstream-epp.sh and scripts/envtest-assets.sh)")
	seed := fs.Uint64("seed", 42, "seed of the arrivals, prompts and engines")
	seeds := fs.Int("seeds", 1, "runs per point, with seeds --seed, --seed+1, …; each point reports its run with the median TTFT p90")
	front := fs.String("front", "gateway", "how requests reach the EPP: gateway (ext_proc, as Envoy asks it) or proxy (the EPP's standalone proxy)")
	replicas := fs.Int("replicas", 1, "EPP replicas behind the gateway, each fed the KV events over NATS (real time only)")
	bypass := fs.Float64("bypass", 0, "share of requests sent past the EPP, round-robin over the engines by a second gateway (real time only)")
	restartAt := fs.Duration("restart-at", 0, "stop the first EPP replica this long into each run and start a fresh one (real time only)")
	dp := fs.Bool("dp", false, "the data-parallel workload (pods of 4 and of 8 ranks behind one API server each) under its three policies and, in real time, the upstream EPP (also upstream-epp-approx with --policies), written to docs/results/routing-dp/")
	pd := fs.Bool("pd", false, "the P/D workload (2 prefill and 4 decode engines, a P/D sidecar before each decode engine) under its five policies (real time only)")
	pdTopo := fs.Bool("pd-topology", false, "the P/D workload across two racks, topology-aware prefill picks against topology-blind ones (real time only); docs/results/routing-pd-topology/")
	tenants := fs.Bool("tenants", false, "the multi-tenant workload (one tenant floods, interactive and batch mixed) under kvroute's and the upstream EPP's flow control on and off, then mixed-slo's top rate with flow control and with shedding alone (real time only)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *pdTopo {
		if *pd {
			return errors.New("--pd-topology: give --pd or --pd-topology, not both")
		}
		if *virtual {
			return errors.New("--pd-topology: a P/D fleet runs in real time only")
		}
		if !flagSet(fs, "policies") {
			*policies = strings.Join(loadgen.PDTopologyPolicies, ",")
		}
	}
	if *tenants {
		if *virtual || *pd {
			return errors.New("--tenants: real time only, and not with --pd")
		}
		if !flagSet(fs, "policies") {
			*policies = strings.Join(loadgen.TenantsPolicies, ",")
		}
	}
	if *pd {
		if *virtual {
			return errors.New("--pd: a P/D fleet runs in real time only")
		}
		if !flagSet(fs, "policies") {
			*policies = strings.Join(loadgen.PDPolicies, ",")
		}
	}
	if *dp && !flagSet(fs, "policies") {
		*policies = strings.Join(loadgen.DPRealTimePolicies, ",")
		if *virtual {
			// The upstream binary runs in real time only.
			*policies = strings.Join(loadgen.DPPolicies, ",")
		}
	}
	shape := loadgen.Shape{Replicas: *replicas, Bypass: *bypass, RestartAt: *restartAt}
	switch *front {
	case "gateway":
	case "proxy":
		shape.Front = loadgen.FrontProxy
	default:
		return fmt.Errorf("--front %q: gateway or proxy", *front)
	}
	if *virtual && shape.RealTimeOnly() {
		return fmt.Errorf("--virtual: %s is real time only (virtual time has no ext_proc, gateway or second EPP)", shape)
	}
	if *seeds < 1 {
		return fmt.Errorf("--seeds %d: at least one", *seeds)
	}
	fo, err := ff.options()
	if err != nil {
		return err
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})))
	all := loadgen.DefaultPlans(*quick)
	if *pd {
		all = []loadgen.Plan{loadgen.PDPlan()}
	}
	if *dp {
		all = loadgen.DPPlans()
		if *quick {
			for i := range all {
				all[i].Rates = all[i].Rates[:1]
			}
		}
	}
	if *pdTopo {
		all = []loadgen.Plan{loadgen.PDTopologyPlan()}
	}
	if *tenants {
		all = []loadgen.Plan{loadgen.TenantsPlan()}
	}
	plans, err := selectPlans(all, *only, *rates)
	if err != nil {
		return err
	}
	if *outDir == "" && *pd {
		*outDir = filepath.Join("docs", "results", "routing-pd")
	}
	if *outDir == "" && *dp {
		*outDir = filepath.Join("docs", "results", "routing-dp")
		if *virtual {
			*outDir += "-virtual"
		}
	}
	if *outDir == "" && *pdTopo {
		*outDir = filepath.Join("docs", "results", "routing-pd-topology")
	}
	if *outDir == "" && *tenants {
		*outDir = filepath.Join("docs", "results", "routing-tenants")
	}
	if *outDir == "" {
		*outDir = filepath.Join("docs", "results", "routing")
		if *virtual {
			*outDir = filepath.Join("docs", "results", "routing-virtual")
		}
		if spec := fo.Family.String(); spec != sim.FamilyVLLM {
			// Each family's report beside vLLM's, not over it.
			*outDir += "-" + strings.NewReplacer(",", "-", "=", "-").Replace(spec)
		}
	}
	// The upstream EPP's output and metrics; not for git.
	fo.OutDir = filepath.Join(*outDir, "upstream-epp")
	o := loadgen.BenchOptions{
		Virtual:  *virtual,
		Plans:    plans,
		Policies: strings.Split(*policies, ","),
		Fleet:    fo, Duration: *dur, MinRequests: *minReq, Drain: *drain, MaxTokens: 32, ThinkTime: 200 * time.Millisecond, Seed: *seed, Seeds: *seeds,
		Progress: os.Stdout, Shape: shape,
	}
	if *quick {
		o.Duration, o.MinRequests = min(o.Duration, 3*time.Second), 0
	}
	start := time.Now()
	if *tenants {
		return benchTenants(ctx, o, *outDir, args, start)
	}
	bench := loadgen.Bench
	if *pdTopo {
		// The policies run back to back under each seed.
		bench = loadgen.BenchInterleaved
	}
	pts, err := bench(ctx, o)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	cmd := strings.TrimSpace("go run ./cmd/kvsim bench " + strings.Join(args, " "))
	path := filepath.Join(*outDir, "routing-benchmark.md")
	var checks []loadgen.Check
	switch {
	case *dp:
		err, checks = loadgen.WriteDPReport(path, o, pts, cmd, time.Since(start)), loadgen.DPChecks(pts)
	case *pdTopo:
		load, _ := os.ReadFile("/proc/loadavg")
		if f := strings.Fields(string(load)); len(f) >= 3 {
			load = []byte(strings.Join(f[:3], " "))
		}
		err, checks = loadgen.WritePDTopologyReport(path, o, pts, cmd, time.Since(start), string(load)), loadgen.PDTopologyChecks(pts)
	case *pd:
		err, checks = loadgen.WritePDReport(path, o, pts, cmd, time.Since(start)), loadgen.PDChecks(pts)
	default:
		err, checks = loadgen.WriteReport(path, o, pts, cmd, time.Since(start)), loadgen.Checks(pts)
	}
	if err != nil {
		return err
	}
	printChecks(checks)
	fmt.Printf("wrote %s in %s\n", path, time.Since(start).Round(time.Second))
	return nil
}

// printChecks prints a benchmark's checks, a line each.
func printChecks(checks []loadgen.Check) {
	for _, c := range checks {
		fmt.Printf("check %-4s %s: %s — %s\n", c.Outcome, c.Workload, c.Claim, c.Detail)
	}
}

func selectPlans(plans []loadgen.Plan, only, rates string) ([]loadgen.Plan, error) {
	var ladder []float64
	for _, r := range strings.Split(rates, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		v, err := strconv.ParseFloat(r, 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("--rates: %q is not a positive number", r)
		}
		ladder = append(ladder, v)
	}
	var out []loadgen.Plan
	for _, p := range plans {
		if only != "" && !slices.Contains(strings.Split(only, ","), p.Workload.Name) {
			continue
		}
		if ladder != nil {
			p.Rates = ladder
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--workloads %q matches none", only)
	}
	return out, nil
}

// flagSet says whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// benchTenants runs the multi-tenant workload, then mixed-slo's top rate
// under kvroute's flow control and under shedding alone, seed by seed, and
// writes their report with the machine's load average meanwhile.
func benchTenants(ctx context.Context, o loadgen.BenchOptions, outDir string, args []string, start time.Time) error {
	load := sampleLoad(ctx)
	pts, err := loadgen.Bench(ctx, o)
	if err != nil {
		return err
	}
	var mixed [][]loadgen.Plan
	for _, p := range loadgen.DefaultPlans(false) {
		if p.Workload.Name == "mixed-slo" {
			p.Rates = p.Rates[len(p.Rates)-1:]
			mixed = append(mixed, []loadgen.Plan{p})
		}
	}
	var mixedPts [][]loadgen.Point
	for _, plans := range mixed {
		for k := range max(o.Seeds, 1) {
			one := o
			one.Plans, one.Seeds, one.Seed = plans, 1, o.Seed+uint64(k)
			one.Policies = []string{loadgen.PolicyFlowControl, loadgen.PolicyPredicted}
			seedPts, err := loadgen.Bench(ctx, one)
			if err != nil {
				return err
			}
			mixedPts = append(mixedPts, seedPts)
		}
	}
	// The well-behaved tenants alone, under kvroute's flow control if it
	// ran: the most it could give them beside the flooder.
	var alonePts []loadgen.Point
	if slices.Contains(o.Policies, loadgen.PolicyFlowControl) {
		alone, full := o, loadgen.TenantsPlan()
		alone.Plans = nil
		for _, p := range o.Plans {
			if p.Workload.Name == full.Workload.Name {
				a := loadgen.TenantsAlonePlan()
				a.Rates = loadgen.TenantsAloneRates(p.Rates)
				alone.Plans = append(alone.Plans, a)
			}
		}
		alone.Policies = []string{loadgen.PolicyFlowControl}
		if len(alone.Plans) > 0 {
			if alonePts, err = loadgen.Bench(ctx, alone); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(outDir, "routing-benchmark.md")
	cmd := strings.TrimSpace("go run ./cmd/kvsim bench " + strings.Join(args, " "))
	r := loadgen.TenantsReport{Command: cmd, Took: time.Since(start), LoadAverage: load(), Mixed: mixedPts, Alone: alonePts}
	if err := loadgen.WriteTenantsReport(path, o, pts, r); err != nil {
		return err
	}
	printChecks(loadgen.TenantsChecks(pts, mixedPts))
	fmt.Printf("wrote %s in %s\n", path, time.Since(start).Round(time.Second))
	return nil
}

// sampleLoad reads the 1-minute load average every 10s until ctx ends or
// the returned function is called, which describes what it read (empty
// where /proc/loadavg cannot be read).
func sampleLoad(ctx context.Context) func() string {
	read := func() (float64, bool) {
		b, err := os.ReadFile("/proc/loadavg")
		if err != nil {
			return 0, false
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return 0, false
		}
		v, err := strconv.ParseFloat(f[0], 64)
		return v, err == nil
	}
	var mu sync.Mutex
	var samples []float64
	take := func() {
		if v, ok := read(); ok {
			mu.Lock()
			samples = append(samples, v)
			mu.Unlock()
		}
	}
	take()
	stop := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stop:
				return
			case <-t.C:
				take()
			}
		}
	}()
	return func() string {
		close(stop)
		take()
		mu.Lock()
		defer mu.Unlock()
		if len(samples) == 0 {
			return ""
		}
		lo, hi, sum := samples[0], samples[0], 0.0
		for _, v := range samples {
			lo, hi, sum = min(lo, v), max(hi, v), sum+v
		}
		return fmt.Sprintf("%.1f to %.1f, mean %.1f over %d samples 10s apart, on %d CPUs", lo, hi, sum/float64(len(samples)), len(samples), runtime.NumCPU())
	}
}
