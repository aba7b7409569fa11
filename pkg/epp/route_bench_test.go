package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkRoute measures a whole scheduling decision as the request path
// makes it, PrepareData included: candidate snapshot, the precise prefix
// producer (block keys and index lookup), the profile's producers, scorers
// and picker, and the speculative recorder. Each endpoint holds a different
// share of the prompt's prefix, as after a shared-prefix workload. The
// default profile (predicted latency: the latency producer runs the
// predictor for every candidate) is measured beside upstream's weights.
// Each pick's response is ended right after it, and the cost includes
// ending it in the in-flight accounting.
func BenchmarkRoute(b *testing.B) {
	for _, cfg := range []string{"predicted-latency", "upstream-weights"} {
		for _, n := range []int{16, 64, 256} {
			for _, tokens := range []int{1024, 8192} {
				b.Run(fmt.Sprintf("config=%s/endpoints=%d/tokens=%d", cfg, n, tokens), func(b *testing.B) {
					text, err := config.NamedText(cfg)
					if err != nil {
						b.Fatal(err)
					}
					benchmarkRoute(b, text, n, tokens)
				})
			}
		}
	}
}

func benchmarkRoute(b *testing.B, configText string, endpoints, tokens int) {
	e, err := New(Options{Pool: "bench", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigText: configText})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	const bs = 16
	r := rand.New(rand.NewPCG(1, 2))
	prompt := make([]uint32, tokens)
	for i := range prompt {
		prompt[i] = uint32(r.IntN(32000))
	}
	now := time.Now()
	for i := range endpoints {
		addr := fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250+1)
		e.Datastore().Upsert(&datalayer.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: addr, Model: "m"})
		e.Datastore().SetMetrics(fmt.Sprintf("pod-%d", i), datalayer.Metrics{
			WaitingQueueSize: r.IntN(4), RunningRequests: r.IntN(16), KVCacheUsage: r.Float64() * 0.7, UpdateTime: now,
		})
		// Endpoint i holds a leading share of the prompt: from none to all.
		held := (tokens / bs) * i / endpoints
		if held == 0 {
			continue
		}
		hashes := make([]uint64, held)
		for k := range hashes {
			hashes[k] = uint64(i)<<32 | uint64(k+1)
		}
		batch := &events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: prompt[:held*bs], BlockSize: bs,
		}}}
		e.Index().Apply(events.Origin{Stream: events.Stream{Endpoint: addr}, Model: "m", BlockSize: bs, Instance: "i"}, batch)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	cpu := testkit.CPUTime()
	for b.Loop() {
		req := &request.Request{ID: "bench", Model: "m", TokenIDs: prompt}
		p, err := e.Director().Route(ctx, req, nil)
		if err != nil {
			b.Fatal(err)
		}
		// Ended at once, as a response refused (which nothing learns
		// from), so that each pick finds the in-flight accounting as a
		// steady load leaves it, not b.N requests that never end.
		e.Director().HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 503})
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "µs/route")
	b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N)/1000, "cpu-µs/route")
}

// BenchmarkHandleRequest measures one request as the ext_proc stream hands
// it to the director, in the default configuration (predicted latency):
// an 8k-token prompt given as token ids parsed from its body into pooled
// memory, candidates made in pooled memory, PrepareData, scheduling,
// dispatch, and then the response's first byte and end accounted for, so
// that the in-flight accounting stays as a steady load leaves it. Each of
// the 64 endpoints holds its own prompt whole (as BenchmarkExtProcFloor's
// fleet does), and requests cycle through the prompts. It reports CPU µs
// and allocations per request.
func BenchmarkHandleRequest(b *testing.B) { benchHandleRequest(b, "", 0) }

// BenchmarkHandleRequestEviction is BenchmarkHandleRequest on endpoints
// whose GPU caches are full (num_gpu_blocks is what each holds), so that
// the latency-scorer's eviction term is computed for every candidate but
// the one holding the prompt: with the term off, and with the default
// configuration, in one run, for their ratio.
func BenchmarkHandleRequestEviction(b *testing.B) {
	off := strings.Replace(config.DefaultConfigText, "    use: quantile\n", "    use: quantile\n    evictionWeight: 0\n", 1)
	if off == config.DefaultConfigText {
		b.Fatal("the default configuration's latency-scorer parameters moved")
	}
	b.Run("term-off", func(b *testing.B) { benchHandleRequest(b, off, 8192/16) })
	b.Run("default", func(b *testing.B) { benchHandleRequest(b, "", 8192/16) })
}

// benchHandleRequest runs BenchmarkHandleRequest under config (empty: the
// default), with num_gpu_blocks gpuBlocks on every endpoint (0: unknown).
func benchHandleRequest(b *testing.B, cfg string, gpuBlocks int) {
	const endpoints, tokens, bs = 64, 8192, 16
	e, err := New(Options{Pool: "bench", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigText: cfg})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	r := rand.New(rand.NewPCG(1, 2))
	now := time.Now()
	bodies := make([][]byte, endpoints)
	addrs := make([]string, endpoints)
	for i := range endpoints {
		prompt := make([]uint32, tokens)
		for k := range prompt {
			prompt[k] = uint32(r.IntN(150000))
		}
		addrs[i] = fmt.Sprintf("10.1.0.%d:8000", i+1)
		e.Datastore().Upsert(&datalayer.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: addrs[i], Model: "m"})
		e.Datastore().SetMetrics(fmt.Sprintf("pod-%d", i), datalayer.Metrics{
			WaitingQueueSize: r.IntN(4), RunningRequests: r.IntN(16), KVCacheUsage: r.Float64() * 0.7, UpdateTime: now.Add(time.Hour),
			BlockSize: bs, NumGPUBlocks: gpuBlocks,
		})
		hashes := make([]uint64, tokens/bs)
		for k := range hashes {
			hashes[k] = uint64(i)<<32 | uint64(k+1)
		}
		e.Index().Apply(events.Origin{Stream: events.Stream{Endpoint: addrs[i]}, Model: "m", BlockSize: bs, Instance: "i"},
			&events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: prompt, BlockSize: bs}}})
		bodies[i], _ = json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
	}
	ctx := context.Background()
	d := e.Director()
	var ids []uint32
	var set datalayer.CandidateSet
	headers := map[string]string{":path": "/v1/completions", "content-type": "application/json", director.HeaderRequestID: "bench"}
	b.ReportAllocs()
	cpu := testkit.CPUTime()
	i := 0
	for b.Loop() {
		in := director.Input{Path: "/v1/completions", Headers: headers, Body: bodies[i%endpoints], IDBuf: ids[:0:cap(ids)], Candidates: &set}
		if in.IDBuf == nil {
			in.IDBuf = []uint32{}
		}
		i++
		p, err := d.HandleRequest(ctx, &in)
		if err != nil {
			b.Fatal(err)
		}
		ids = in.IDBuf
		t := time.Now()
		d.HandleFirstByte(p)
		d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200, FirstByte: t, End: t,
			Usage: openai.Usage{PromptTokens: tokens, CompletionTokens: 1}})
	}
	b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N)/1000, "cpu-µs/req")
}
