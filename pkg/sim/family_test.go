package sim

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

func familyReplica(t *testing.T, family string, gpu, maxSeqs int) *Core {
	t.Helper()
	f, err := ParseFamily(family)
	if err != nil {
		t.Fatal(err)
	}
	cfg := FleetConfig{Pool: blockpool.Config{BlockSize: 16, GPUBlocks: gpu, Seed: 1}, Timing: DefaultTiming(), Family: f}
	cfg.Timing.MaxSeqs = maxSeqs
	return NewCore(NewEngine(cfg.EngineConfig(0, "127.0.0.1:1"), nil), cfg.TimingOf(0))
}

func TestParseFamilyReadsNamesAndTraits(t *testing.T) {
	t.Parallel()
	tests := []struct {
		spec string
		want Family
		err  bool
	}{
		{"", Family{Name: FamilyVLLM}, false},
		{"vllm", Family{Name: FamilyVLLM}, false},
		{"no-chunk", Family{Name: FamilyNoChunk}, false},
		{"fifo,usage=resident", Family{Name: FamilyFIFO, Usage: UsageResident}, false},
		{"drawn,usage=running,silent=3s,silent-metrics", Family{Name: FamilyDrawn, Silence: 3 * time.Second, SilentMetrics: true}, false},
		{"sglang", Family{}, true},
		{"vllm,usage=half", Family{}, true},
		{"vllm,silent=-1s", Family{}, true},
		{"vllm,silent=soon", Family{}, true},
		{"vllm,silent-metrics", Family{}, true},
		{"vllm,loud", Family{}, true},
	}
	for _, tt := range tests {
		t.Run(tt.spec, func(t *testing.T) {
			t.Parallel()
			got, err := ParseFamily(tt.spec)
			if tt.err {
				if !errors.Is(err, ErrUnknownFamily) {
					t.Fatalf("ParseFamily(%q) = %+v, %v; want ErrUnknownFamily", tt.spec, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseFamily(%q) = %+v, %v; want %+v", tt.spec, got, err, tt.want)
			}
			if back, err := ParseFamily(got.String()); err != nil || back != got {
				t.Errorf("ParseFamily(%q.String() = %q) = %+v, %v", tt.spec, got.String(), back, err)
			}
		})
	}
	for _, name := range FamilyNames {
		if d := (Family{Name: name}).Describe(); d == "" || strings.Contains(d, "\n") {
			t.Errorf("family %s: description %q is not one line", name, d)
		}
	}
}

func FuzzParseFamily(f *testing.F) {
	for _, s := range []string{"", "vllm", "fifo,usage=resident", "drawn,silent=2s,silent-metrics", "no-chunk,silent=1h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		got, err := ParseFamily(spec)
		if err != nil {
			if !errors.Is(err, ErrUnknownFamily) {
				t.Fatalf("ParseFamily(%q): error %v is not ErrUnknownFamily", spec, err)
			}
			return
		}
		if back, err := ParseFamily(got.String()); err != nil || back != got {
			t.Fatalf("ParseFamily(%q) = %+v, whose String %q parses to %+v, %v", spec, got, got.String(), back, err)
		}
	})
}

func TestFIFOStartsRequestsInArrivalOrderWhenASlotFrees(t *testing.T) {
	t.Parallel()
	r := familyReplica(t, FamilyFIFO, 4096, 2)
	// Output lengths differ so that slots free out of arrival order; a
	// long prompt must not be cut into chunks either.
	outs := []int{6, 2, 4, 1, 3}
	var seqs []*Seq
	for i, n := range outs {
		s, err := r.Submit(blockpool.Request{Tokens: prompt(i, 5000+64*i)}, n)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	firstAt := make([]int, len(seqs))
	for step := 1; step < 1000; step++ {
		w, ok := r.Plan()
		if !ok {
			break
		}
		if _, running := r.Load(); running > 2 {
			t.Fatalf("step %d: %d running, the limit is 2", step, running)
		}
		if w.Prefill > 0 && w.Prefill < 5000 {
			t.Fatalf("step %d prefilled %d tokens: a prompt was chunked", step, w.Prefill)
		}
		if err := r.Finish(r.Timing().Step(w)); err != nil {
			t.Fatal(err)
		}
		for i, s := range seqs {
			if firstAt[i] == 0 && len(s.Tokens) > 0 {
				firstAt[i] = step
			}
		}
	}
	for i := 1; i < len(firstAt); i++ {
		if firstAt[i] < firstAt[i-1] {
			t.Errorf("first tokens at steps %v: request %d started before request %d, which arrived first", firstAt, i, i-1)
		}
	}
	if firstAt[0] != 1 || firstAt[1] != 1 || firstAt[2] == 1 {
		t.Errorf("first tokens at steps %v: want the first two at step 1, prefilled whole, the third later", firstAt)
	}
}

func TestNoChunkDecodesNothingWhileAWholePromptIsPrefilled(t *testing.T) {
	t.Parallel()
	for _, family := range []string{FamilyNoChunk, FamilyVLLM} {
		t.Run(family, func(t *testing.T) {
			t.Parallel()
			r := familyReplica(t, family, 4096, 8)
			a, err := r.Submit(blockpool.Request{Tokens: prompt(1, 64)}, 20)
			if err != nil {
				t.Fatal(err)
			}
			w, _ := r.Plan()
			if err := r.Finish(r.Timing().Step(w)); err != nil {
				t.Fatal(err)
			}
			// A long prompt arrives while a decodes.
			if _, err := r.Submit(blockpool.Request{Tokens: prompt(2, 6000)}, 4); err != nil {
				t.Fatal(err)
			}
			w, _ = r.Plan()
			if err := r.Finish(r.Timing().Step(w)); err != nil {
				t.Fatal(err)
			}
			switch family {
			case FamilyNoChunk:
				if w.Prefill != 6000 || w.Decoding != 0 || len(a.Tokens) != 1 {
					t.Errorf("the step after the long prompt came: prefill %d, decoding %d, a's tokens %d; want the whole prompt, no decode, a still at 1",
						w.Prefill, w.Decoding, len(a.Tokens))
				}
				w, _ = r.Plan()
				if w.Prefill != 0 || w.Decoding != 2 {
					t.Errorf("the step after the prefill: prefill %d, decoding %d; want both decoding", w.Prefill, w.Decoding)
				}
			default:
				if w.Prefill >= 6000 || w.Decoding != 1 || len(a.Tokens) != 2 {
					t.Errorf("vLLM's step after the long prompt came: prefill %d, decoding %d, a's tokens %d; want a chunk beside a's decode",
						w.Prefill, w.Decoding, len(a.Tokens))
				}
			}
		})
	}
}

func TestDrawnCostsDifferBetweenRunsAndStayFixedWithinOne(t *testing.T) {
	t.Parallel()
	base := DefaultTiming()
	seen := map[Timing]uint64{}
	for seed := uint64(1); seed <= 8; seed++ {
		cfg := FleetConfig{Timing: base, Pool: blockpool.Config{Seed: seed}, Family: Family{Name: FamilyDrawn}}
		t0 := cfg.TimingOf(0)
		if cfg.TimingOf(0) != t0 {
			t.Fatalf("seed %d: engine 0's timing changed between calls", seed)
		}
		if cfg.TimingOf(1) == t0 {
			t.Errorf("seed %d: engines 0 and 1 drew the same costs", seed)
		}
		if prev, ok := seen[t0]; ok {
			t.Errorf("seeds %d and %d drew the same costs %v", prev, seed, t0)
		}
		seen[t0] = seed
		lo, hi := time.Duration(float64(base.PrefillPerToken)*drawnMinPrefill), time.Duration(float64(base.PrefillPerToken)*drawnMaxPrefill)
		if t0.PrefillPerToken < lo || t0.PrefillPerToken > hi || t0.RequestOverhead < 0 || t0.RequestOverhead > DrawnMaxOverhead {
			t.Errorf("seed %d: drew prefill %v per token, overhead %v; outside [%v, %v] and [0, %v]",
				seed, t0.PrefillPerToken, t0.RequestOverhead, lo, hi, DrawnMaxOverhead)
		}
		if got := t0.Step(StepWork{Admitted: 2}); got != 2*t0.RequestOverhead {
			t.Errorf("seed %d: a step admitting two requests and computing nothing costs %v, want twice the overhead %v", seed, got, t0.RequestOverhead)
		}
		// A core keeps the timing it was given for the whole run.
		r := NewCore(NewEngine(EngineConfig{Pod: "p", Pool: blockpool.Config{BlockSize: 16, GPUBlocks: 64}}, nil), t0)
		if r.Timing() != t0 {
			t.Errorf("seed %d: the core runs %v, not the drawn %v", seed, r.Timing(), t0)
		}
	}
	if got := (FleetConfig{Timing: base}).TimingOf(0); got != base {
		t.Errorf("vLLM's family changed the timing: %v", got)
	}
}

func TestUsageCountsCachedFreeBlocksOnlyWhenResident(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		usage     UsageMode
		wantAfter float64
	}{
		{UsageRunning, 0},
		{UsageResident, 8.0 / 64},
	} {
		eng := NewEngine(EngineConfig{Pod: "p", Pool: blockpool.Config{BlockSize: 16, GPUBlocks: 64, Seed: 1}, Family: Family{Usage: tt.usage}}, nil)
		r := NewCore(eng, DefaultTiming())
		if _, err := r.Submit(blockpool.Request{Tokens: prompt(1, 8*16)}, 2); err != nil {
			t.Fatal(err)
		}
		w, _ := r.Plan()
		if got := eng.Usage(); got != 8.0/64 {
			t.Errorf("usage mode %d: %v while the request runs, want %v", tt.usage, got, 8.0/64)
		}
		if err := r.Finish(r.Timing().Step(w)); err != nil {
			t.Fatal(err)
		}
		drain(t, r)
		if got := eng.Usage(); got != tt.wantAfter {
			t.Errorf("usage mode %d: %v once the request ended and its 8 full blocks stay cached, want %v", tt.usage, got, tt.wantAfter)
		}
	}
}

// heardIndex is the least an index does with a stream: it keeps every GPU
// copy that stored events announce and removed events take back.
type heardIndex struct {
	mu      sync.Mutex
	copies  map[uint64]int
	batches []uint64
}

func (h *heardIndex) Apply(o events.Origin, b *events.Batch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.batches = append(h.batches, o.Seq)
	for _, e := range b.Events {
		switch e.Kind {
		case events.KindBlockStored:
			for _, x := range e.BlockHashes {
				h.copies[x]++
			}
		case events.KindBlockRemoved:
			for _, x := range e.BlockHashes {
				if h.copies[x] > 0 {
					h.copies[x]--
				}
			}
		}
	}
}

func (h *heardIndex) Uncertain(events.Stream, events.Reason) {}
func (h *heardIndex) Restart(events.Stream)                  {}

// leading is how many of hashes' leading blocks the index holds.
func (h *heardIndex) leading(hashes []uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for n < len(hashes) && h.copies[hashes[n]] > 0 {
		n++
	}
	return n
}

type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *stepClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func TestASilentEngineIsHeardAfterItsSilenceAndAnIndexThenReachesItsTruth(t *testing.T) {
	t.Parallel()
	clock := &stepClock{now: time.Unix(1000, 0)}
	idx := &heardIndex{copies: map[uint64]int{}}
	eng := NewEngine(EngineConfig{Pod: "p", Model: "m", Sink: idx,
		Pool:   blockpool.Config{BlockSize: 16, GPUBlocks: 64, Seed: 1, Now: clock.Now},
		Family: Family{Silence: 5 * time.Second, SilentMetrics: true}}, nil)
	srv := NewServer(NewCore(eng, DefaultTiming()), nil)
	metrics := func() int {
		rec := httptest.NewRecorder()
		srv.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code == http.StatusOK && !strings.Contains(rec.Body.String(), `num_gpu_blocks="64"`) {
			t.Errorf("metrics without the cache's size:\n%s", rec.Body.String())
		}
		return rec.Code
	}

	var served [][]uint32
	serve := func(seed int) {
		p := prompt(seed, 20*16)
		if _, err := eng.Serve(blockpool.Request{Tokens: p}); err != nil {
			t.Fatal(err)
		}
		served = append(served, p)
	}
	for i := range 3 {
		serve(i) // 60 of 64 blocks cached, unheard
	}
	if len(idx.batches) != 0 || metrics() != http.StatusServiceUnavailable {
		t.Fatalf("during the silence: %d batches heard, metrics answered %d; want none, 503", len(idx.batches), metrics())
	}
	clock.add(5 * time.Second)
	if metrics() != http.StatusOK {
		t.Fatalf("after the silence the metrics answer %d", metrics())
	}
	for i := 3; i < 10; i++ {
		serve(i) // the cache turns over more than twice
	}
	if len(idx.batches) == 0 || idx.batches[0] == 0 {
		t.Fatalf("batches heard after the silence: %v; want some, the first after a gap", idx.batches)
	}
	for i, p := range served {
		hashes, _ := eng.blocks(blockpool.Request{Tokens: p})
		truth := eng.Held(blockpool.Request{Tokens: p}).Blocks
		if got := idx.leading(hashes); got != truth {
			t.Errorf("prompt %d: the index holds %d leading blocks, the engine %d", i, got, truth)
		}
	}
}

// TestEveryFamilyServesVLLMsAPIMetricsAndEvents runs a fleet of each
// family on loopback: a completion is served with its cached tokens, the
// metrics carry vLLM's names and the cache's size, and the step's KV
// events reach the engine's sink.
func TestEveryFamilyServesVLLMsAPIMetricsAndEvents(t *testing.T) {
	t.Parallel()
	for _, name := range FamilyNames {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			heard := &heardIndex{copies: map[uint64]int{}}
			ctx, cancel := context.WithCancel(context.Background())
			f, err := StartFleet(ctx, FleetConfig{
				Engines: 1, Model: "m", Family: Family{Name: name},
				Pool:    blockpool.Config{BlockSize: 4, GPUBlocks: 256, Seed: 1},
				Timing:  Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 4, MaxBatchedTokens: 64},
				Sidecar: func(EngineConfig) Sidecar { return sinkSidecar{heard} },
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				cancel()
				if err := f.Close(); err != nil {
					t.Error(err)
				}
			}()
			s := f.Servers[0]
			shared := strings.Repeat("alpha beta gamma delta ", 8)
			var cached int
			for _, q := range []string{"first question", "second question"} {
				code, body := post(t, s, "/v1/completions", `{"model":"m","prompt":"`+shared+q+`","max_tokens":3}`)
				if code != http.StatusOK {
					t.Fatalf("status %d: %s", code, body)
				}
				var resp struct{ Usage usage }
				if err := json.Unmarshal(body, &resp); err != nil {
					t.Fatal(err)
				}
				cached = resp.Usage.PromptTokensDetails.CachedTokens
			}
			if cached != 32 {
				t.Errorf("the second request's cached tokens: %d, want the 32 shared", cached)
			}
			resp, err := http.Get("http://" + s.Addr() + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			page, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{`num_gpu_blocks="256"`, "vllm:kv_cache_usage_perc", "vllm:num_requests_waiting", "vllm:prefix_cache_hits_total"} {
				if !strings.Contains(string(page), want) {
					t.Errorf("metrics lack %s", want)
				}
			}
			heard.mu.Lock()
			n := len(heard.batches)
			heard.mu.Unlock()
			if n == 0 {
				t.Error("no KV event batch reached the sink")
			}
		})
	}
}

// sinkSidecar hands an engine's batches to a sink and runs until stopped.
type sinkSidecar struct{ events.Sink }

func (sinkSidecar) Run(ctx context.Context) error { <-ctx.Done(); return nil }
