package loadgen

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultPlans are the benchmark's workloads and rate ladders, sized for
// `make bench-routing` to finish within about an hour on a 2-core machine.
// Every request states a TTFT SLO (x-slo-ttft-ms), by which SLO
// attainment and goodput are judged.
//   - shared-prefix: the working set (8 groups of 2048-token system prompts,
//     1024 blocks) is twice one engine's GPU cache, so only routing that
//     keeps each group on few engines can hold it.
//   - multi-turn: conversations resend their history every turn.
//   - agent: one application whose every conversation opens with the same
//     3072-token system prompt (about 21k characters: beyond the 256 blocks
//     of 64 characters that upstream's approximate scorer hashes, so to it
//     all requests look alike), then 8 turns of 512-token tool output. The
//     conversations' histories, not the shared prompt, are what a pick can
//     win; engines get 4096 GPU blocks so that they can hold them.
//   - mixed-slo: interactive traffic with a tight SLO beside sheddable
//     batch traffic with a loose one, on a heterogeneous fleet (two
//     engines at full speed, two at half), so that where a request goes
//     and whether it is served at all both matter.
//   - unrelated: nothing to reuse, the control.
//   - cache-pressure: llm-d's "KV-cache wins you can see" shape (8 pods,
//     150 customers with 6,000-token contexts, demand about 73% of the
//     cluster's KV capacity) scaled to 4 engines: 24 customers, each a
//     4096-token context (256 blocks of 16 tokens) with 128-token
//     questions, drawn uniformly so that a customer returns after others
//     may have evicted it; engines of 2048 GPU blocks, 8192 in the fleet,
//     so demand is 24 × 256 = 6144 blocks, 0.75× the fleet's GPU cache:
//     it fits only if each customer stays on few engines.
//   - cache-pressure-cpu: the same with 48 customers, 12288 blocks, 1.5×
//     the fleet's GPU cache, and a CPU tier of 2048 blocks per engine, so
//     that GPU and CPU together (16384 blocks) hold it at 0.75×.
//     In real time a point costs about its arrivals (240 requests, at
//     least 8s) plus a second, per policy: these two ladders add about
//     10 minutes to the benchmark.
func DefaultPlans(quick bool) []Plan {
	plans := []Plan{
		{Workload: Workload{Name: "shared-prefix", Kind: KindSharedPrefix, Groups: 8, SystemTokens: 2048, QuestionTokens: 64, SLO: 250 * time.Millisecond},
			Rates: []float64{8, 16, 24, 32, 40}},
		{Workload: Workload{Name: "multi-turn", Kind: KindMultiTurn, Groups: 4, SystemTokens: 1024, QuestionTokens: 128, Turns: 4, SLO: 150 * time.Millisecond},
			Rates: []float64{8, 14, 20, 26, 32}},
		{Workload: Workload{Name: "agent", Kind: KindMultiTurn, Groups: 1, SystemTokens: 3072, QuestionTokens: 512, Turns: 8, SLO: 300 * time.Millisecond},
			GPUBlocks: 4096, Rates: []float64{12, 18, 24, 30, 36, 42}},
		{Workload: Workload{Name: "mixed-slo", Kind: KindSharedPrefix, Groups: 6, SystemTokens: 1536, QuestionTokens: 256,
			Classes: []Class{
				{Objective: "interactive", Priority: 0, SLO: 300 * time.Millisecond, Share: 0.6},
				{Objective: "batch", Priority: -1, SLO: 1500 * time.Millisecond, Share: 0.4},
			}},
			Speeds: []float64{1, 1, 0.5, 0.5}, Rates: []float64{12, 24, 36, 48, 60}},
		{Workload: Workload{Name: "unrelated", Kind: KindUnrelated, SystemTokens: 1024, QuestionTokens: 64, SLO: 250 * time.Millisecond},
			Rates: []float64{6, 12, 18}},
		{Workload: Workload{Name: "cache-pressure", Kind: KindSharedPrefix, Groups: 24, SystemTokens: 4096, QuestionTokens: 128, SLO: 400 * time.Millisecond},
			GPUBlocks: 2048, Rates: []float64{12, 24, 36}},
		{Workload: Workload{Name: "cache-pressure-cpu", Kind: KindSharedPrefix, Groups: 48, SystemTokens: 4096, QuestionTokens: 128, SLO: 400 * time.Millisecond},
			GPUBlocks: 2048, CPUBlocks: 2048, Rates: []float64{24, 36}},
	}
	plans = append(plans, RingPlans()...)
	if quick {
		for i := range plans {
			plans[i].Rates = plans[i].Rates[:1]
		}
	}
	return plans
}

// RingPlans are the cache-pressure shape pushed past the demand the
// default ladder stops at, to find where approximate routing breaks
// rather than to tune for it: the same 4096-token customers and 128-token
// questions on engines of 2048 GPU blocks (8192 in the fleet), at 1.0×
// (32 customers) and 1.5× (48 customers, no CPU tier) of the fleet's GPU
// cache, each at 36 req/s (the default ladder's top) and 54 (1.5× it).
// cache-pressure itself (0.75×) is run at 54 besides its ladder by
// `--rates 36,54` (scripts/ring-bench.sh).
func RingPlans() []Plan {
	rates := []float64{36, 54}
	return []Plan{
		{Workload: Workload{Name: "cache-pressure-1x", Kind: KindSharedPrefix, Groups: 32, SystemTokens: 4096, QuestionTokens: 128, SLO: 400 * time.Millisecond},
			GPUBlocks: 2048, Rates: rates},
		{Workload: Workload{Name: "cache-pressure-1.5x", Kind: KindSharedPrefix, Groups: 48, SystemTokens: 4096, QuestionTokens: 128, SLO: 400 * time.Millisecond},
			GPUBlocks: 2048, Rates: rates},
	}
}

// makeTargets are the Makefile's benchmark targets by the command each runs.
var makeTargets = map[string]string{
	"go run ./cmd/kvsim bench":                      "make bench-routing",
	"go run ./cmd/kvsim bench --virtual --seeds 25": "make bench-routing-virtual",
}

// WriteReport writes the benchmark's Markdown report to path and an SVG
// plot per workload with more than one rate beside it.
func WriteReport(path string, o BenchOptions, pts []Point, command string, took time.Duration) error {
	var b strings.Builder
	t := o.Fleet.Timing
	fmt.Fprintf(&b, "# Routing benchmark\n\nGenerated by `%s`", command)
	// The make target is named only when it is what ran.
	if target, ok := makeTargets[command]; ok {
		fmt.Fprintf(&b, " (`%s`)", target)
	}
	fmt.Fprintf(&b, " in %s.", took.Round(time.Second))
	if o.Seeds > 1 {
		fmt.Fprintf(&b, " Each point ran %d times, with seeds %d to %d, and shows the run with the median TTFT p90: a single run's p90 moves by a fifth or more with its seed where a few slow requests decide it.", o.Seeds, o.Seed, o.Seed+uint64(o.Seeds)-1)
	} else {
		fmt.Fprintf(&b, " One run per point, seed %d.", o.Seed)
	}
	b.WriteString("\n\n")
	fmt.Fprintf(&b, "Fleet: %d simulated vLLM engines (`cmd/kvsim`), each a vLLM prefix-caching block pool of %d blocks of %d tokens",
		o.Fleet.Engines, o.Fleet.Pool.GPUBlocks, o.Fleet.Pool.BlockSize)
	if o.Fleet.Pool.CPUBlocks > 0 {
		fmt.Fprintf(&b, " plus %d CPU blocks", o.Fleet.Pool.CPUBlocks)
	}
	serving, eventsGo := "behind vLLM's HTTP API", "Every engine step publishes its KV events, as vLLM does."
	if o.Virtual {
		serving, eventsGo = "stepped in virtual time", "Every engine step's KV batch goes straight to kvroute's index."
	}
	fmt.Fprintf(&b, ", %s, with vLLM's scheduler loop (at most %d running sequences, a step budget of %d tokens shared by decodes and chunked prefills; prefill %s per uncached token plus %s per token per 1024 tokens of context, CPU-tier load %s per token, decode step %s + %s per running sequence + %s per 1024 tokens each reads). Workloads that say so run on a heterogeneous fleet (engines at fractions of that speed). %s\n\n",
		serving, t.MaxSeqs, t.MaxBatchedTokens, t.PrefillPerToken, t.PrefillAttention, t.LoadPerToken, t.DecodeStep, t.DecodePerSeq, t.DecodePerKToken, eventsGo)
	fmt.Fprintf(&b, "Engine family: `%s`, %s. The EPP is given the family's limits as a user gives it an engine's flags (max_num_seqs %d, max_num_batched_tokens %d; 0, a family without a token budget, leaves the EPP its default budget); its predictor replays vLLM's chunked scheduler whatever the family.\n\n",
		o.Fleet.Family, o.Fleet.Family.Describe(), o.Fleet.engineLimits().MaxNumSeqs, o.Fleet.engineLimits().MaxBatchedTokens)
	ttftNote := "TTFT is measured by the client at the first streamed token."
	if o.Virtual {
		ttftNote = "TTFT runs from a request's arrival to the end of the engine step that made its first token."
	}
	long := ""
	if o.MinRequests > 0 {
		long = fmt.Sprintf(", or longer at low rates, until about %d requests have arrived", o.MinRequests)
	}
	fmt.Fprintf(&b, "Traffic: open-loop Poisson arrivals for %s per run%s (then up to %s to finish; requests still running are cut and counted with their time so far), %d output tokens per request, streamed; a conversation's turns follow one another %s apart, conversations starting at the rate divided by the turns; every policy sees the same arrivals and prompts, on a fresh fleet with cold caches. %s Every request states a TTFT SLO (`x-slo-ttft-ms`); SLO attainment is the share of the requests served (not shed) whose TTFT met it, goodput those per second. In mixed-slo, 60%% of conversations are `interactive` (priority 0, SLO 300ms) and 40%% `batch` (priority -1, sheddable, SLO 1.5s), named by `x-gateway-inference-objective`; only kvroute's EPP can shed (429), which the tables count.\n\n",
		o.Duration, long, o.Drain, o.MaxTokens, o.ThinkTime, ttftNote)
	b.WriteString(`Policies:

| policy | how it routes |
|---|---|
| random, round-robin | in the client |
| least-queue | in the client, to the engine with the fewest waiting + running requests (read directly, no scrape lag) |
| approx-prefix | upstream's approximate prefix routing, in the client: the prompt text hashed in chunks and matched against a per-engine LRU of what was routed there (kvroute's ApproxIndex, upstream's algorithm and capacity), scored as upstream's default profile (prefix 3, queue 2, KV usage 2) with queue and usage read directly from the engines |
| approx-prefix-epp | kvroute's EPP with upstream's default profile (prefix-cache-scorer 3, queue 2, KV usage 2) and no KV events, so that prefix answers come from its approximate routing-history fallback (see the note below) |
| kvroute-precise | kvroute's EPP, precise-prefix-cache-scorer only (plus the speculative recorder), fed by the engines' KV events over NATS |
| kvroute-precise-load | kvroute's EPP with its default profile, upstream's weights on the precise scorer (precise prefix 3, queue 2, KV usage 2) |
| kvroute-prefill-cost | kvroute's EPP with the prefill-cost-scorer: per engine, the prompt tokens the exact index says are not cached there plus the prefill work queued there; the cheapest wins |
| **kvroute-predicted-latency** (the default) | kvroute's EPP with its latency predictor (` + "`predicted-latency-producer`" + `, learning online from the responses, fed the exact index's tokens per tier and the EPP's own in-flight accounting) and the ` + "`latency-scorer`" + ` (least predicted p90 TTFT, plus its own prefill time weighted by the endpoint's KV usage squared); ` + "`latency-slo-admitter`" + ` sheds sheddable requests no endpoint is predicted to serve within their SLO |
| oracle | in the client, reading every engine's true state: for each engine, its own scheduler replayed forward from its step under way, batch, queue and caches (` + "`sim.Core.EstimateTTFT`" + `); the least true TTFT wins. It is greedy (it knows no future arrivals, and weighs only the request at hand) and never sheds, so under overload a policy that keeps prefixes together, or sheds, can beat it |

Workloads:

| workload | shape | groups | system prompt (tokens) | question or turn (tokens) | turns | GPU blocks per engine | engine speeds | TTFT SLO | rates (req/s) |
|---|---|---:|---:|---:|---:|---:|---|---|---|
` + workloadRows(o) + `
` + demandNotes(o) + `approx-prefix-epp is kvroute's own routing-history fallback, the path an endpoint without KV events takes; approx-prefix is the faithful upstream algorithm, run in the client, which the checks compare against.

`)
	b.WriteString(gatewayPoliciesNote(o))
	b.WriteString(sharingPoliciesNote(o))
	if o.Virtual {
		b.WriteString("This run is in **virtual time** (`--virtual`): one simulated clock advances through arrivals, engine steps and think times, with no HTTP, NATS or sleeping. The EPP-routed policies run kvroute's index, PrepareData and scheduler in process; each engine step's KV batch reaches the index as the step ends, and each pick sees the engines' queues and KV usage as they are then, where real time has a NATS hop and a 50ms scrape. It shows what the policies do with exact information, in seconds; the client-side policies give the same result every run (kvroute's pickers break ties at random). The real-time report, `make bench-routing`, is the one that goes through the real transport.\n\n")
	} else {
		b.WriteString(frontText(o.Shape))
	}
	checks := Checks(pts)
	writeChecks(&b, checks)
	if o.Shape != (Shape{}) {
		fmt.Fprintf(&b, "Shape of every run: %s.\n\n", o.Shape)
	}
	writeRestarts(&b, pts)
	b.WriteString("## Results\n\n")
	dir := path[:strings.LastIndexByte(path, '/')+1]
	for _, wl := range workloads(pts) {
		if len(rates(pts, wl)) < 2 {
			continue
		}
		name := "routing-" + wl + ".svg"
		f, err := os.Create(dir + name)
		if err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		WriteSVG(f, pts, wl)
		if err := f.Close(); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		sloName := "routing-" + wl + "-slo.svg"
		g, err := os.Create(dir + sloName)
		if err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		WritePlot(g, pts, wl, MetricSLOAttainment)
		if err := g.Close(); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		fmt.Fprintf(&b, "![%s: TTFT p90 against request rate](%s)\n![%s: SLO attainment against request rate](%s)\n\n", wl, name, wl, sloName)
	}
	fmt.Fprintf(&b, "Raw numbers: [routing-benchmark.json](routing-benchmark.json). In the tables, *p90 vs oracle* is each policy's TTFT p90 over the oracle's at the same rate (below 1: the policy beat the greedy oracle).\n\n")
	var tb strings.Builder
	WriteTables(&tb, pts)
	WritePredictorTable(&tb, pts)
	b.WriteString(tb.String())
	return writeReportFiles(path, b.String(), pts)
}

// workloadRows lists the plans' workloads as Markdown table rows.
func workloadRows(o BenchOptions) string {
	var b strings.Builder
	for _, p := range o.Plans {
		w := p.Workload
		blocks := strconv.Itoa(o.Fleet.Pool.GPUBlocks)
		if p.GPUBlocks > 0 {
			blocks = strconv.Itoa(p.GPUBlocks)
		}
		if cpu := max(p.CPUBlocks, o.Fleet.Pool.CPUBlocks); cpu > 0 {
			blocks += fmt.Sprintf(" (+ %d CPU)", cpu)
		}
		rates := make([]string, len(p.Rates))
		for i, r := range p.Rates {
			rates[i] = strconv.FormatFloat(r, 'f', -1, 64)
		}
		speeds := "all 1"
		if len(p.Speeds) > 0 {
			ss := make([]string, len(p.Speeds))
			for i, v := range p.Speeds {
				ss[i] = strconv.FormatFloat(v, 'f', -1, 64)
			}
			speeds = strings.Join(ss, ", ")
		}
		slo := w.SLO.String()
		if len(w.Classes) > 0 {
			var cs []string
			for _, c := range w.Classes {
				cs = append(cs, fmt.Sprintf("%s %s", c.Objective, c.SLO))
			}
			slo = strings.Join(cs, ", ")
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %s | %s | %s | %s |\n",
			w.Name, w.Kind, max(w.Groups, 1), w.SystemTokens, w.QuestionTokens, max(w.Turns, 1), blocks, speeds, slo, strings.Join(rates, ", "))
	}
	return b.String()
}

// demandNotes states, for each shared-prefix workload whose contexts
// would fill more than half the fleet's GPU cache, the arithmetic of its
// demand on the cache.
func demandNotes(o BenchOptions) string {
	var b strings.Builder
	bs := max(o.Fleet.Pool.BlockSize, 1)
	for _, p := range o.Plans {
		w := p.Workload
		if w.Kind != KindSharedPrefix {
			continue
		}
		gpu := o.Fleet.Pool.GPUBlocks
		if p.GPUBlocks > 0 {
			gpu = p.GPUBlocks
		}
		cpu := max(p.CPUBlocks, o.Fleet.Pool.CPUBlocks)
		engines := max(o.Fleet.Engines, 1)
		per := w.SystemTokens / bs
		demand, fleet := max(w.Groups, 1)*per, engines*gpu
		if 2*demand <= fleet {
			continue
		}
		fmt.Fprintf(&b, "%s's demand on the KV cache: %d contexts × %d blocks (%d tokens of %d) = %d blocks, %.2f× the fleet's GPU cache (%d engines × %d = %d blocks)",
			w.Name, max(w.Groups, 1), per, w.SystemTokens, bs, demand, float64(demand)/float64(fleet), engines, gpu, fleet)
		if cpu > 0 {
			fmt.Fprintf(&b, ", %.2f× its GPU and CPU tiers together (%d blocks)", float64(demand)/float64(engines*(gpu+cpu)), engines*(gpu+cpu))
		}
		b.WriteString(".\n")
	}
	if b.Len() > 0 {
		b.WriteString("\n")
	}
	return b.String()
}

// writeChecks writes a report's checks as a table, failures in bold;
// nothing when there are none.
func writeChecks(b *strings.Builder, checks []Check) {
	if len(checks) == 0 {
		return
	}
	b.WriteString("## Checks\n\n| workload | claim | result | detail |\n|---|---|---|---|\n")
	for _, c := range checks {
		res := string(c.Outcome)
		if c.Outcome == Fail {
			res = "**fail**"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s |\n", c.Workload, c.Claim, res, c.Detail)
	}
	b.WriteString("\n")
}
