package approx

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/testkit"
)

func tokens(n int, seed uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = seed*1000 + uint32(i)
	}
	return out
}

func TestApproxHashes(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("abcdefgh", 100) // 800 chars
	tests := []struct {
		name      string
		req       *request.Request
		bs, max   int
		wantCount int
	}{
		{name: "token ids give one hash per full block", req: &request.Request{TokenIDs: tokens(100, 1)}, bs: 16, max: 256, wantCount: 6},
		{name: "text gives one hash per four characters a token", req: &request.Request{Prompt: long}, bs: 16, max: 256, wantCount: 12},
		{name: "the block cap bounds the hashes", req: &request.Request{TokenIDs: tokens(100, 1)}, bs: 16, max: 2, wantCount: 2},
		{name: "a prompt shorter than a block has none", req: &request.Request{Prompt: long[:63]}, bs: 16, max: 256, wantCount: 0},
		{name: "a multimodal request has none", req: &request.Request{TokenIDs: tokens(100, 1), NoReproduciblePrefix: true}, bs: 16, max: 256, wantCount: 0},
		{name: "blocks larger than the internal buffer still hash", req: &request.Request{TokenIDs: tokens(1000, 1)}, bs: 128, max: 256, wantCount: 7},
		{name: "a zero block size has none", req: &request.Request{Prompt: long}, bs: 0, max: 256, wantCount: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := Hashes(nil, tt.req, tt.bs, tt.max)
			if len(got) != tt.wantCount {
				t.Fatalf("%d hashes, want %d", len(got), tt.wantCount)
			}
		})
	}
}

func TestApproxHashesChain(t *testing.T) {
	t.Parallel()
	base := &request.Request{Model: "m", TokenIDs: tokens(64, 1)}
	h := Hashes(nil, base, 16, 256)
	differentFrom := func(what string, other []uint64, sharedBlocks int) {
		t.Helper()
		for i := range min(len(h), len(other)) {
			if (h[i] == other[i]) != (i < sharedBlocks) {
				t.Errorf("%s: block %d equal=%v, want equal only for the first %d", what, i, h[i] == other[i], sharedBlocks)
			}
		}
	}
	// A longer prompt with the same start shares its leading blocks.
	longer := Hashes(nil, &request.Request{Model: "m", TokenIDs: append(tokens(64, 1), tokens(32, 2)...)}, 16, 256)
	differentFrom("a longer prompt", longer, 4)
	// A change in block 2 breaks the chain from there on.
	changed := tokens(64, 1)
	changed[40] = 7
	differentFrom("a prompt changed in block 2", Hashes(nil, &request.Request{Model: "m", TokenIDs: changed}, 16, 256), 2)
	differentFrom("another model", Hashes(nil, &request.Request{Model: "m2", TokenIDs: tokens(64, 1)}, 16, 256), 0)
	differentFrom("a LoRA", Hashes(nil, &request.Request{Model: "m", LoRA: "l", TokenIDs: tokens(64, 1)}, 16, 256), 0)
	differentFrom("a cache salt", Hashes(nil, &request.Request{Model: "m", CacheSalt: "s", TokenIDs: tokens(64, 1)}, 16, 256), 0)
	// Model and LoRA are separated, not concatenated.
	a := Hashes(nil, &request.Request{Model: "ab", LoRA: "c", Prompt: strings.Repeat("x", 64)}, 16, 256)
	b := Hashes(nil, &request.Request{Model: "a", LoRA: "bc", Prompt: strings.Repeat("x", 64)}, 16, 256)
	if a[0] == b[0] {
		t.Error("model ab + LoRA c hashes like model a + LoRA bc")
	}
}

func TestApproxHashesReusesDst(t *testing.T) {
	req := &request.Request{Model: "m", TokenIDs: tokens(4096, 1)}
	dst := make([]uint64, 0, 256)
	allocs := testing.AllocsPerRun(20, func() { dst = Hashes(dst, req, 16, 256) })
	if allocs != 0 {
		t.Fatalf("%v allocations per call with a large enough dst, want 0", allocs)
	}
}

func TestApproxIndexMatch(t *testing.T) {
	t.Parallel()
	x := New(100, nil)
	h := []uint64{1, 2, 3, 4, 5}
	x.Record("a", h)                 // all five
	x.Record("b", h[:2])             // the first two
	x.Record("c", []uint64{1, 3, 4}) // a hole at block 1
	x.Record("d", []uint64{2, 3, 4}) // nothing leading
	addrs := []string{"a", "b", "c", "d", "unknown"}
	out := make([]int, len(addrs))
	x.Match(h, addrs, out)
	if want := []int{5, 2, 1, 0, 0}; !slices.Equal(out, want) {
		t.Fatalf("Match = %v, want %v", out, want)
	}
	x.RemoveEndpoint("a")
	x.Match(h, addrs, out)
	if out[0] != 0 {
		t.Fatalf("removed endpoint still matches %d blocks", out[0])
	}
	x.Record("a", h[:1])
	x.Match(h, addrs, out)
	if out[0] != 1 {
		t.Fatalf("endpoint recorded again after removal matches %d blocks, want 1", out[0])
	}
}

func TestApproxIndexEvictsLeastRecentlyRoutedFromTheTail(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	x := New(6, reg)
	p1, p2, p3 := []uint64{11, 12, 13}, []uint64{21, 22, 23}, []uint64{31, 32}
	x.Record("a", p1)
	x.Record("a", p2)
	x.Record("a", p1[:1]) // p1's first block is used again
	x.Record("a", p3)     // evicts two: p1's tail (13, 12), not its head
	out := make([]int, 1)
	for _, tc := range []struct {
		prompt []uint64
		want   int
	}{{p1, 1}, {p2, 3}, {p3, 2}} {
		x.Match(tc.prompt, []string{"a"}, out)
		if out[0] != tc.want {
			t.Errorf("Match(%v) = %d, want %d", tc.prompt, out[0], tc.want)
		}
	}
	if got := testutil.ToFloat64(x.evictions); got != 2 {
		t.Errorf("evictions = %v, want 2", got)
	}
	if got := testutil.ToFloat64(x.blocks); got != 6 {
		t.Errorf("blocks gauge = %v, want 6", got)
	}
	x.SetCapacity("a", 2) // keeps the two most recent: p3
	x.Match(p3, []string{"a"}, out)
	if out[0] != 2 {
		t.Errorf("after shrinking, p3 matches %d, want 2", out[0])
	}
	x.Match(p2, []string{"a"}, out)
	if out[0] != 0 {
		t.Errorf("after shrinking, p2 matches %d, want 0", out[0])
	}
	if got := testutil.ToFloat64(x.blocks); got != 2 {
		t.Errorf("blocks gauge after shrinking = %v, want 2", got)
	}
	x.RemoveEndpoint("a")
	if got := testutil.ToFloat64(x.blocks); got != 0 {
		t.Errorf("blocks gauge after removal = %v, want 0", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kvroute_approx_endpoints"); err != nil || n != 1 {
		t.Errorf("kvroute_approx_endpoints gathered %d, %v", n, err)
	}
}

// checkLRU verifies the list threads every slot once, in the map's order.
func checkLRU(t *testing.T, l *approxLRU) []uint64 {
	t.Helper()
	var order []uint64
	if l.head < 0 {
		if len(l.slot) != 0 {
			t.Fatalf("empty list but %d in the map", len(l.slot))
		}
		return nil
	}
	i := l.head
	for {
		n := l.nodes[i]
		if l.nodes[n.next].prev != i {
			t.Fatalf("slot %d: next's prev is %d", i, l.nodes[n.next].prev)
		}
		if l.slot[n.hash] != i {
			t.Fatalf("slot %d holds %d but the map says %d", i, n.hash, l.slot[n.hash])
		}
		order = append(order, n.hash)
		i = n.next
		if i == l.head {
			break
		}
		if len(order) > len(l.nodes) {
			t.Fatal("the list loops without returning to its head")
		}
	}
	if len(order) != len(l.slot) || len(order) > l.capacity {
		t.Fatalf("list has %d, map %d, capacity %d", len(order), len(l.slot), l.capacity)
	}
	return order
}

func TestApproxLRUAgreesWithASimpleModel(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	l := newApproxLRU(8, prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"}))
	var model []uint64 // most recent first
	for step := range 5000 {
		if step%500 == 499 {
			c := 1 + r.IntN(10)
			l.resize(c)
			if len(model) > c {
				model = model[:c]
			}
			continue
		}
		h := uint64(r.IntN(20))
		l.touch(h)
		if i := slices.Index(model, h); i >= 0 {
			model = slices.Delete(model, i, i+1)
		}
		model = slices.Insert(model, 0, h)
		if len(model) > l.capacity {
			model = model[:l.capacity]
		}
		if got := checkLRU(t, l); !slices.Equal(got, model) {
			t.Fatalf("step %d: LRU order %v, model %v", step, got, model)
		}
	}
}

func TestApproxIndexConcurrentUse(t *testing.T) {
	t.Parallel()
	// Records evict while matches read and endpoints are removed: under
	// -race this proves evictions never touch shared state unlocked.
	x := New(64, prometheus.NewRegistry())
	addrs := []string{"a", "b", "c", "d"}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 9))
			hashes := make([]uint64, 32)
			out := make([]int, len(addrs))
			for range 2000 {
				for i := range hashes {
					hashes[i] = uint64(r.IntN(200))
				}
				switch r.IntN(10) {
				case 0:
					x.RemoveEndpoint(addrs[r.IntN(len(addrs))])
				case 1:
					x.SetCapacity(addrs[r.IntN(len(addrs))], 16+r.IntN(64))
				case 2, 3, 4:
					x.Record(addrs[r.IntN(len(addrs))], hashes)
				default:
					x.Match(hashes, addrs, out)
					for i, n := range out {
						if n < 0 || n > len(hashes) {
							panic(fmt.Sprintf("match %d for %s", n, addrs[i]))
						}
					}
				}
			}
		})
	}
	wg.Wait()
	total := 0
	for _, addr := range addrs {
		x.mu.RLock()
		l := x.endpoints[addr]
		x.mu.RUnlock()
		if l != nil {
			total += len(checkLRU(t, l))
		}
	}
	if got := testutil.ToFloat64(x.blocks); int(got) != total {
		t.Fatalf("blocks gauge %v, held %d", got, total)
	}
}

func BenchmarkApproxHashes(b *testing.B) {
	for _, bc := range []struct {
		name string
		req  *request.Request
	}{
		{"tokens", &request.Request{Model: "m", TokenIDs: tokens(4096, 1)}},
		{"text", &request.Request{Model: "m", Prompt: strings.Repeat("The quick brown fox. ", 800)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dst := make([]uint64, 0, DefaultMaxBlocks)
			cpu := testkit.CPUTime()
			for b.Loop() {
				dst = Hashes(dst, bc.req, DefaultBlockSizeTokens, DefaultMaxBlocks)
			}
			blocks := float64(b.N * len(dst))
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/block")
			b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/blocks, "cpu-ns/block")
		})
	}
}

func BenchmarkApproxMatch(b *testing.B) {
	// 64 endpoints each holding the prompt's first half: 64 × 128 block
	// lookups per call.
	x := New(0, nil)
	req := &request.Request{Model: "m", TokenIDs: tokens(4096, 1)}
	hashes := Hashes(nil, req, DefaultBlockSizeTokens, DefaultMaxBlocks)
	addrs := make([]string, 64)
	for i := range addrs {
		addrs[i] = fmt.Sprintf("10.0.0.%d:8000", i)
		x.Record(addrs[i], hashes[:len(hashes)/2])
	}
	out := make([]int, len(addrs))
	cpu := testkit.CPUTime()
	for b.Loop() {
		x.Match(hashes, addrs, out)
	}
	// Each endpoint looks up its 128 held blocks and the miss after them.
	lookups := float64(b.N * len(addrs) * (len(hashes)/2 + 1))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/lookups, "ns/block")
	b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/lookups, "cpu-ns/block")
}
