package index

import (
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

var benchHoldings = flag.Int("index.holdings", 10_000_000,
	"holdings built by BenchmarkIndexMemory (the budget is stated at 10M)")

const benchBS = 16

func benchAddr(i int) string { return fmt.Sprintf("10.9.%d.%d:8000", i/250, i%250) }

func benchTokens(rng *rand.Rand, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = rng.Uint32() % 128000
	}
	return out
}

// storeRun applies one BlockStored of tokens' blocks from the root, with
// hashes hashBase+i, as engine addr would publish it.
func storeRun(ix *Index, addr string, seq uint64, hashBase uint64, tokens []uint32) {
	n := len(tokens) / benchBS
	hashes := make([]uint64, n)
	for i := range hashes {
		hashes[i] = hashBase + uint64(i)
	}
	o := events.Origin{Stream: events.Stream{Endpoint: addr}, Model: "bench", Instance: "i", BlockSize: benchBS, Seq: seq}
	ix.Apply(o, &events.Batch{Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens[:n*benchBS], BlockSize: benchBS,
	}}})
}

// BenchmarkIndexLookup measures a request's whole prefix lookup, hashing its
// tokens into block keys included, over candidates that hold the prompt's
// prefix to various lengths, in an index that also holds a million other
// holdings.
func BenchmarkIndexLookup(b *testing.B) {
	cases := []struct {
		name       string
		blocks     int
		endpoints  int
		heldBlocks func(i, blocks, endpoints int) int
	}{
		{"32k tokens/64 endpoints/staggered prefixes", 2048, 64,
			func(i, blocks, n int) int { return blocks * (i + 1) / n }},
		{"32k tokens/64 endpoints/all hold everything", 2048, 64,
			func(i, blocks, n int) int { return blocks }},
		{"32k tokens/64 endpoints/one holds everything", 2048, 64,
			func(i, blocks, n int) int {
				if i == 0 {
					return blocks
				}
				return 0
			}},
		{"8k tokens/16 endpoints/staggered prefixes", 512, 16,
			func(i, blocks, n int) int { return blocks * (i + 1) / n }},
		{"8k tokens/64 endpoints/all hold everything", 512, 64,
			func(i, blocks, n int) int { return blocks }},
		{"1k tokens/64 endpoints/all hold everything", 64, 64,
			func(i, blocks, n int) int { return blocks }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			ix := New(Options{}, nil)
			addrs := make([]string, tc.endpoints)
			prompt := benchTokens(rng, tc.blocks*benchBS)
			for i := range addrs {
				addrs[i] = benchAddr(i)
				ix.AddEndpoint(addrs[i])
				if n := tc.heldBlocks(i, tc.blocks, tc.endpoints); n > 0 {
					storeRun(ix, addrs[i], 0, 1, prompt[:n*benchBS])
				}
				// Background: other prompts, so the maps are of a real size.
				for j := range 1_000_000 / tc.endpoints / 256 {
					storeRun(ix, addrs[i], uint64(j+1), uint64(j+1)<<32, benchTokens(rng, 256*benchBS))
				}
			}
			out := benchLookups(b, ix, prompt, addrs)
			if want := tc.heldBlocks(tc.endpoints-1, tc.blocks, tc.endpoints); out[tc.endpoints-1].Blocks != want && want > 0 {
				b.Fatalf("last endpoint matched %d blocks, want %d", out[tc.endpoints-1].Blocks, want)
			}
		})
	}
}

// benchLookups times b.N lookups of prompt (hashing included) over addrs,
// reports ns and CPU ns per block, and returns the last answers.
func benchLookups(b *testing.B, ix *Index, prompt []uint32, addrs []string) []Match {
	out := make([]Match, len(addrs))
	keys := make([]uint64, 0, len(prompt)/benchBS)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := testkit.CPUTime()
	for b.Loop() {
		keys = AppendBlockKeys(keys[:0], RootKey("bench", "", ""), prompt, benchBS)
		ix.Lookup(keys, addrs, out)
	}
	b.StopTimer()
	blocks := float64(b.N) * float64(len(prompt)/benchBS)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/block")
	if cpu := testkit.CPUTime() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/blocks, "cpu-ns/block")
	}
	return out
}

// BenchmarkIndexSpeculate measures recording a pick's speculative
// holdings: a request's blocks, none held by the picked endpoint, renewed
// by each pick (the clock moves half a TTL per pick, so that expiry runs
// too), in an index that also holds other holdings.
func BenchmarkIndexSpeculate(b *testing.B) {
	for _, blocks := range []int{64, 512, 2048} {
		b.Run(fmt.Sprintf("%dk tokens", blocks*benchBS/1024), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			now := time.Unix(1000, 0)
			ix := New(Options{Now: func() time.Time { return now }, SpeculativeTTL: 2 * time.Second}, nil)
			addrs := make([]string, 16)
			for i := range addrs {
				addrs[i] = benchAddr(i)
				ix.AddEndpoint(addrs[i])
				for j := range 256_000 / len(addrs) / 256 {
					storeRun(ix, addrs[i], uint64(j), uint64(i)<<40|uint64(j+1)<<32, benchTokens(rng, 256*benchBS))
				}
			}
			keys := AppendBlockKeys(nil, RootKey("bench", "", ""), benchTokens(rng, blocks*benchBS), benchBS)
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := testkit.CPUTime()
			for i := 0; b.Loop(); i++ {
				now = now.Add(time.Second)
				ix.Speculate(addrs[i%len(addrs)], keys)
			}
			b.StopTimer()
			n := float64(b.N) * float64(blocks)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/block")
			if cpu := testkit.CPUTime() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/n, "cpu-ns/block")
			}
		})
	}
}

// BenchmarkBlockKeys measures hashing alone.
func BenchmarkBlockKeys(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, bs := range []int{16, 64, 256} {
		b.Run(fmt.Sprintf("block size %d", bs), func(b *testing.B) {
			prompt := benchTokens(rng, 32768)
			keys := make([]uint64, 0, len(prompt)/bs)
			b.ReportAllocs()
			cpu0 := testkit.CPUTime()
			for b.Loop() {
				keys = AppendBlockKeys(keys[:0], 1, prompt, bs)
			}
			blocks := float64(b.N) * float64(len(prompt)/bs)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/block")
			if cpu := testkit.CPUTime() - cpu0; cpu > 0 {
				b.ReportMetric(float64(cpu.Nanoseconds())/blocks, "cpu-ns/block")
			}
		})
	}
}

// BenchmarkIndexIngest measures Apply on a realistic event stream: the
// batches a simulated engine publishes (stores with prefix reuse, removals
// as slots are reused), recorded beforehand so that only the index is timed.
func BenchmarkIndexIngest(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	pool := blockpool.New(blockpool.Config{BlockSize: benchBS, GPUBlocks: 20000, Seed: 9})
	groups := make([][]uint32, 32)
	for i := range groups {
		groups[i] = benchTokens(rng, benchBS*(16+rng.IntN(256)))
	}
	var batches []*events.Batch
	var running []string
	blocks := 0
	for i := 0; blocks < 2_000_000; i++ {
		g := groups[rng.IntN(len(groups))]
		tokens := append(append([]uint32(nil), g[:benchBS*rng.IntN(len(g)/benchBS)]...), benchTokens(rng, benchBS*(1+rng.IntN(128)))...)
		r := blockpool.Request{ID: fmt.Sprint(i), Tokens: tokens}
		if _, err := pool.Allocate(r); errors.Is(err, blockpool.ErrNoSpace) {
			for _, id := range running {
				_ = pool.Free(id)
			}
			running = running[:0]
			continue
		} else if err != nil {
			b.Fatal(err)
		}
		running = append(running, r.ID)
		if len(running) > 8 {
			_ = pool.Free(running[0])
			running = running[1:]
		}
		if batch, _, ok := pool.Step(); ok {
			batches = append(batches, batch)
			blocks += batch.Blocks()
		}
	}
	ix := New(Options{}, nil)
	const addr = "10.9.9.9:8000"
	ix.AddEndpoint(addr)
	o := events.Origin{Stream: events.Stream{Endpoint: addr}, Model: "bench", Instance: "i", BlockSize: benchBS}
	applied, seq := 0, uint64(0)
	var cpu time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := testkit.CPUTime()
	for i := 0; b.Loop(); i++ {
		if i%len(batches) == 0 && i > 0 {
			// Start over as a restarted engine would; the clearing is not timed.
			b.StopTimer()
			cpu += testkit.CPUTime() - cpu0
			ix.Restart(o.Stream)
			seq = 0
			cpu0 = testkit.CPUTime()
			b.StartTimer()
		}
		batch := batches[i%len(batches)]
		o.Seq = seq
		seq++
		ix.Apply(o, batch)
		applied += batch.Blocks()
	}
	b.StopTimer()
	cpu += testkit.CPUTime() - cpu0
	b.ReportMetric(float64(applied)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(applied), "ns/block")
	if cpu > 0 {
		b.ReportMetric(float64(applied)/cpu.Seconds(), "blocks/cpu-s")
	}
}

// BenchmarkIndexMemory builds -index.holdings GPU holdings over 64 endpoints
// and reports the heap they take per holding. "distinct" gives every holding
// its own block (the worst case: nothing shared); "shared by 8" has groups of
// eight endpoints hold the same prompts, as a shared system prompt would.
func BenchmarkIndexMemory(b *testing.B) {
	for _, share := range []int{1, 8} {
		name := "distinct"
		if share > 1 {
			name = fmt.Sprintf("shared by %d", share)
		}
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				perHolding, holdings := buildAndMeasure(b, *benchHoldings, 64, share, 1)
				b.ReportMetric(perHolding, "bytes/holding")
				b.ReportMetric(float64(holdings), "holdings")
			}
		})
	}
	// Endpoints of 4 data-parallel ranks keep each rank's key set besides
	// the shards' holdings; the same distinct blocks on single-rank
	// endpoints, measured in the same run, are the baseline.
	b.Run("distinct, 4 ranks an endpoint", func(b *testing.B) {
		for b.Loop() {
			one, _ := buildAndMeasure(b, *benchHoldings, 64, 1, 1)
			ranked, holdings := buildAndMeasure(b, *benchHoldings, 64, 1, 4)
			b.ReportMetric(ranked, "bytes/holding")
			b.ReportMetric(ranked/one, "x-single-rank")
			b.ReportMetric(float64(holdings), "holdings")
		}
	})
}

// buildAndMeasure fills an index with about target holdings over
// endpoints, groups of share storing the same blocks, each endpoint's runs
// spread over ranks data-parallel ranks; it returns the heap bytes per
// holding and the holdings.
func buildAndMeasure(b *testing.B, target, endpoints, share, ranks int) (float64, int64) {
	const runBlocks = 128
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	start := time.Now()
	ix := New(Options{}, nil)
	addrs := make([]string, endpoints)
	for i := range addrs {
		addrs[i] = benchAddr(i)
		ix.AddEndpoint(addrs[i])
	}
	tokens := make([]uint32, runBlocks*benchBS)
	hashes := make([]uint64, runBlocks)
	batch := &events.Batch{Events: make([]events.Event, 1)}
	perEndpoint := target / endpoints
	for run := 0; run*runBlocks < perEndpoint; run++ {
		for i, addr := range addrs {
			// Endpoints in one sharing group store the same tokens under
			// their own engine hashes.
			rng := rand.New(rand.NewPCG(uint64(run), uint64(i/share)))
			for j := range tokens {
				tokens[j] = rng.Uint32()
			}
			for j := range hashes {
				hashes[j] = uint64(i)<<40 | uint64(run*runBlocks+j)
			}
			batch.Events[0] = events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: benchBS}
			o := events.Origin{Stream: events.Stream{Endpoint: addr, DPRank: run % ranks}, Model: "bench", Instance: "i", BlockSize: benchBS, Seq: uint64(run / ranks)}
			ix.Apply(o, batch)
		}
	}
	built := time.Since(start)
	runtime.GC()
	runtime.ReadMemStats(&after)
	holdings := ix.stats.holdings[events.TierGPU].Load()
	b.Logf("%d holdings (%d distinct blocks) built in %v: heap %d MB",
		holdings, ix.stats.blocks.Load(), built, (after.HeapAlloc-before.HeapAlloc)>>20)
	runtime.KeepAlive(ix)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(holdings), holdings
}

// BenchmarkIndexLookupHybrid measures a lookup over endpoints of a hybrid
// model (a full-attention group, a 4096-token sliding window and a Mamba
// group), each answered as vLLM's coordinator decides, beside the plain
// walk over the same prompt held by single-group endpoints.
func BenchmarkIndexLookupHybrid(b *testing.B) {
	const blocks, endpoints = 512, 16
	for _, hybrid := range []bool{false, true} {
		name := "8k tokens/16 endpoints/single group"
		if hybrid {
			name = "8k tokens/16 endpoints/full attention, sliding window and Mamba"
		}
		b.Run(name, func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, 2))
			ix := New(Options{}, nil)
			prompt := benchTokens(rng, blocks*benchBS)
			addrs := make([]string, endpoints)
			for i := range addrs {
				addrs[i] = benchAddr(i)
				ix.AddEndpoint(addrs[i])
				n := blocks * (i + 1) / endpoints
				hashes := make([]uint64, n)
				for j := range hashes {
					hashes[j] = uint64(j + 1)
				}
				stored := events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: prompt[:n*benchBS], BlockSize: benchBS}
				evs := []events.Event{stored}
				if hybrid {
					window, state := stored, stored
					evs[0].KVCacheSpecKind = "full_attention"
					window.GroupIdx, window.KVCacheSpecKind, window.SlidingWindow = 1, "sliding_window", 4096
					state.GroupIdx, state.KVCacheSpecKind = 2, "mamba"
					state.BlockHashes, state.BlockOffsets = hashes[n-1:], []int32{int32(n - 1)}
					evs = append(evs, window, state)
				}
				o := events.Origin{Stream: events.Stream{Endpoint: addrs[i]}, Model: "bench", Instance: "i", BlockSize: benchBS}
				ix.Apply(o, &events.Batch{Events: evs})
			}
			out := benchLookups(b, ix, prompt, addrs)
			if out[endpoints-1].Blocks != blocks {
				b.Fatalf("the endpoint holding everything matched %d blocks, want %d", out[endpoints-1].Blocks, blocks)
			}
		})
	}
}

// BenchmarkIndexLookupCold measures lookups with cold caches, as a
// request path that has just parsed an 8k-token body meets them: 64
// endpoints hold 32k-token prefixes, each request asks for 8k tokens of
// one of them (all but its last block held), the next request another,
// and a buffer four times the size of L2 is written between requests (not
// timed). "own prefixes": each endpoint holds its own (a key has one
// holder); "one prefix": all hold the same (a key has 64). "walk" times
// the lookup alone, its keys made beforehand; "keys and walk" times the
// request's whole sequence, its keys made from its tokens.
func BenchmarkIndexLookupCold(b *testing.B) {
	const endpoints, heldBlocks, askedBlocks = 64, 2048, 512
	for _, shared := range []bool{false, true} {
		for _, withKeys := range []bool{false, true} {
			name := "8k of 32k tokens/64 endpoints/own prefixes"
			if shared {
				name = "8k of 32k tokens/64 endpoints/one prefix"
			}
			if withKeys {
				name += "/keys and walk"
			} else {
				name += "/walk"
			}
			b.Run(name, func(b *testing.B) {
				benchLookupCold(b, endpoints, heldBlocks, askedBlocks, shared, withKeys)
			})
		}
	}
}

func benchLookupCold(b *testing.B, endpoints, heldBlocks, askedBlocks int, shared, withKeys bool) {
	rng := rand.New(rand.NewPCG(5, 6))
	ix := New(Options{}, nil)
	addrs := make([]string, endpoints)
	prompts := make([][]uint32, endpoints)
	for i := range addrs {
		addrs[i] = benchAddr(i)
		ix.AddEndpoint(addrs[i])
		if i == 0 || !shared {
			prompts[i] = benchTokens(rng, heldBlocks*benchBS)
		} else {
			prompts[i] = prompts[0]
		}
		storeRun(ix, addrs[i], 0, 1, prompts[i])
	}
	asked := make([][]uint32, endpoints)
	keys := make([][]uint64, endpoints)
	root := RootKey("bench", "", "")
	for i, p := range prompts {
		asked[i] = append(slices.Clone(p[:(askedBlocks-1)*benchBS]), benchTokens(rng, benchBS)...)
		keys[i] = AppendBlockKeys(nil, root, asked[i], benchBS)
	}
	flush := make([]byte, 8<<20)
	out := make([]Match, endpoints)
	// Timed by hand around each request, the flush left out: the timer's
	// own stop and start read the memory statistics, which costs more CPU
	// than a lookup.
	var wall, cpu time.Duration
	var each []time.Duration
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		for j := 0; j < len(flush); j += 64 {
			flush[j]++
		}
		k := keys[i%endpoints]
		cpu0, t0 := testkit.CPUTime(), time.Now()
		if withKeys {
			k = AppendBlockKeys(k[:0], root, asked[i%endpoints], benchBS)
		}
		ix.Lookup(k, addrs, out)
		d := time.Since(t0)
		wall += d
		cpu += testkit.CPUTime() - cpu0
		each = append(each, d)
	}
	if got := out[(b.N-1)%endpoints].Blocks; got != askedBlocks-1 {
		b.Fatalf("the holder matched %d blocks, want %d", got, askedBlocks-1)
	}
	blocks := float64(b.N) * float64(askedBlocks)
	b.ReportMetric(float64(wall.Nanoseconds())/float64(b.N), "ns/op")
	b.ReportMetric(float64(wall.Nanoseconds())/blocks, "ns/block")
	// The median resists the shared machine's preemptions, which the mean
	// takes in.
	slices.Sort(each)
	b.ReportMetric(float64(each[len(each)/2].Nanoseconds())/float64(askedBlocks), "p50-ns/block")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/blocks, "cpu-ns/block")
	}
}
