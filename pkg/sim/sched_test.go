package sim

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

func testReplica(gpu, cpu, maxSeqs int) *Core {
	eng := NewEngine(EngineConfig{Pod: "p", Address: "127.0.0.1:1", Model: "m",
		Pool: blockpool.Config{BlockSize: 16, GPUBlocks: gpu, CPUBlocks: cpu, Seed: 1}}, nil)
	t := DefaultTiming()
	t.MaxSeqs = maxSeqs
	return NewCore(eng, t)
}

func prompt(seed, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(seed*100003 + i)
	}
	return out
}

// drain steps the core until it is idle and returns the simulated time
// each step took.
func drain(t *testing.T, r *Core) []time.Duration {
	t.Helper()
	var steps []time.Duration
	for range 10000 {
		w, ok := r.Plan()
		if !ok {
			return steps
		}
		d := r.Timing().Step(w)
		steps = append(steps, d)
		if err := r.Finish(d); err != nil {
			t.Fatal(err)
		}
	}
	t.Fatal("the core never went idle")
	return nil
}

func TestTimingStepPricesEachKindOfWork(t *testing.T) {
	t.Parallel()
	tm := Timing{PrefillPerToken: 10 * time.Microsecond, LoadPerToken: time.Microsecond, DecodeStep: 5 * time.Millisecond, DecodePerSeq: 100 * time.Microsecond}
	tests := []struct {
		name string
		w    StepWork
		want time.Duration
	}{
		{"an idle step costs nothing", StepWork{}, 0},
		{"a prefill costs per uncached token", StepWork{Prefill: 1000}, 10 * time.Millisecond},
		{"a CPU-tier load costs per loaded token", StepWork{Loaded: 1000}, time.Millisecond},
		{"a decode step costs its base plus per sequence", StepWork{Decoding: 4}, 5400 * time.Microsecond},
		{"mixed work adds up", StepWork{Prefill: 100, Loaded: 100, Decoding: 1}, time.Millisecond + 100*time.Microsecond + 5100*time.Microsecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := tm.Step(tt.w); got != tt.want {
				t.Errorf("Step(%+v) = %v, want %v", tt.w, got, tt.want)
			}
		})
	}
}

func TestRequestsBeyondTheConcurrencyLimitWait(t *testing.T) {
	t.Parallel()
	r := testReplica(1024, 0, 2)
	var seqs []*Seq
	for i := range 5 {
		s, err := r.Submit(blockpool.Request{Tokens: prompt(i, 64)}, 3)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	w, ok := r.Plan()
	if !ok {
		t.Fatal("nothing planned")
	}
	if waiting, running := r.Load(); waiting != 3 || running != 2 {
		t.Fatalf("after the first plan: %d waiting, %d running; want 3 and 2", waiting, running)
	}
	if w.Prefill != 128 || w.Decoding != 0 {
		t.Errorf("first step's work = %+v, want two 64-token prefills and no decode", w)
	}
	steps := drain(t, r)
	// Three admission waves of 3 tokens each (the last one alone).
	if len(steps) < 8 {
		t.Errorf("only %d steps for 5 requests of 3 tokens at 2 at a time", len(steps))
	}
	if got := seqs[4].WaitedSteps(); got < 4 {
		t.Errorf("the fifth request waited %d steps, want at least 4 (two waves ahead of it)", got)
	}
	for i, s := range seqs {
		n := 0
		for tok := range s.Tokens {
			if tok.Err != nil {
				t.Fatalf("seq %d: %v", i, tok.Err)
			}
			if !tok.Done {
				n++
			}
		}
		if n != 3 {
			t.Errorf("seq %d produced %d tokens, want 3", i, n)
		}
	}
}

func TestACacheHitShortensPrefill(t *testing.T) {
	t.Parallel()
	r := testReplica(1024, 0, 4)
	shared := prompt(1, 1024)
	first := append(append([]uint32{}, shared...), prompt(2, 64)...)
	second := append(append([]uint32{}, shared...), prompt(3, 64)...)

	s1, _ := r.Submit(blockpool.Request{Tokens: first}, 1)
	w1, _ := r.Plan()
	if err := r.Finish(r.Timing().Step(w1)); err != nil {
		t.Fatal(err)
	}
	s2, _ := r.Submit(blockpool.Request{Tokens: second}, 1)
	w2, _ := r.Plan()
	if err := r.Finish(r.Timing().Step(w2)); err != nil {
		t.Fatal(err)
	}
	if s1.Cached() != 0 || s2.Cached() != 1024 {
		t.Errorf("cached tokens = %d then %d, want 0 then 1024", s1.Cached(), s2.Cached())
	}
	if w1.Prefill != 1088 || w2.Prefill != 64 {
		t.Errorf("prefilled %d then %d tokens, want 1088 then 64", w1.Prefill, w2.Prefill)
	}
	d1, d2 := r.Timing().Step(w1), r.Timing().Step(w2)
	if d2*10 > d1 {
		t.Errorf("the hit's prefill took %v against %v uncached; want it more than 10x shorter", d2, d1)
	}
	st := r.Stats()
	if st.PrefixQueries != 2176 || st.PrefixHits != 1024 {
		t.Errorf("prefix counters = %d queried, %d hit; want 2176 and 1024", st.PrefixQueries, st.PrefixHits)
	}
}

func TestACPUTierHitIsLoadedNotRecomputed(t *testing.T) {
	t.Parallel()
	// 80 GPU blocks: a 64-block prompt, then another that evicts it from
	// GPU while the CPU tier keeps it.
	r := testReplica(80, 256, 1)
	a, b := prompt(1, 1024+8), prompt(2, 1024+8)
	for _, p := range [][]uint32{a, b} {
		if _, err := r.Submit(blockpool.Request{Tokens: p}, 1); err != nil {
			t.Fatal(err)
		}
		drain(t, r)
	}
	s, _ := r.Submit(blockpool.Request{Tokens: a}, 1)
	w, _ := r.Plan()
	if s.Cached() != 1024 || s.Loaded() == 0 {
		t.Fatalf("cached %d tokens, %d loaded from CPU; want 1024 cached, some loaded", s.Cached(), s.Loaded())
	}
	if w.Loaded != s.Loaded() || w.Prefill != 8 {
		t.Errorf("step work %+v, want %d loaded and 8 prefilled", w, s.Loaded())
	}
	uncached := r.Timing().Step(StepWork{Prefill: len(a)})
	if got := r.Timing().Step(w); got >= uncached {
		t.Errorf("a CPU hit took %v, no faster than recomputing (%v)", got, uncached)
	}
}

func TestAPromptLargerThanTheCacheFails(t *testing.T) {
	t.Parallel()
	r := testReplica(8, 0, 4)
	s, _ := r.Submit(blockpool.Request{Tokens: prompt(1, 16*9)}, 1)
	if _, ok := r.Plan(); ok {
		t.Fatal("a prompt that cannot fit was admitted")
	}
	tok := <-s.Tokens
	if !tok.Done || !errors.Is(tok.Err, ErrTooLarge) {
		t.Errorf("got %+v, want a done token with ErrTooLarge", tok)
	}
}

func TestStoppingAReplicaEndsItsSequences(t *testing.T) {
	t.Parallel()
	r := testReplica(1024, 0, 1)
	r.timing.DecodeStep = time.Hour // the loop stays inside its first step
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var seqs []*Seq
	for i := range 3 {
		s, err := r.Submit(blockpool.Request{Tokens: prompt(i, 32)}, 5)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		var last Token
		for tok := range s.Tokens {
			last = tok
		}
		if !last.Done || !errors.Is(last.Err, ErrStopped) {
			t.Errorf("seq %d ended with %+v, want ErrStopped", i, last)
		}
	}
	if _, err := r.Submit(blockpool.Request{Tokens: prompt(9, 8)}, 1); !errors.Is(err, ErrStopped) {
		t.Errorf("submit after stop: %v, want ErrStopped", err)
	}
}

func ExampleTokenize() {
	fmt.Println(len(Tokenize("the quick  brown\tfox")), Tokenize("a b")[0] == Tokenize("a")[0])
	// Output: 4 true
}

func TestTimingGrowsWithContextAndBatch(t *testing.T) {
	t.Parallel()
	tm := DefaultTiming()
	short, long := StepWork{}, StepWork{}
	short.addChunk(512, 0)
	long.addChunk(512, 8192)
	if tm.Step(long) <= tm.Step(short) {
		t.Errorf("512 tokens after 8k of context cost %v, no more than after none (%v)", tm.Step(long), tm.Step(short))
	}
	one := StepWork{Decoding: 1, DecodeContext: 1024}
	eight := StepWork{Decoding: 8, DecodeContext: 8 * 4096}
	if tm.Step(eight) <= tm.Step(one) {
		t.Errorf("a decode step of 8 long sequences cost %v, no more than one short one (%v)", tm.Step(eight), tm.Step(one))
	}
	slow := tm.Scaled(0.5)
	w := StepWork{Prefill: 1000, Decoding: 2}
	if got, want := slow.Step(w), 2*tm.Step(w); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Errorf("an engine at half speed took %v for a step the default takes %v; want twice as long", got, tm.Step(w))
	}
	if slow.MaxSeqs != tm.MaxSeqs || slow.MaxBatchedTokens != tm.MaxBatchedTokens {
		t.Errorf("scaling changed the limits: %+v", slow)
	}
}

func TestALongPromptIsPrefilledInChunksBesideTheDecodes(t *testing.T) {
	t.Parallel()
	r := testReplica(1024, 0, 4)
	r.timing.MaxBatchedTokens = 1000
	short, _ := r.Submit(blockpool.Request{Tokens: prompt(1, 100)}, 10)
	w, _ := r.Plan()
	if err := r.Finish(r.Timing().Step(w)); err != nil {
		t.Fatal(err)
	}
	long, _ := r.Submit(blockpool.Request{Tokens: prompt(2, 2500)}, 1)
	var works []StepWork
	for range 3 {
		w, _ := r.Plan()
		works = append(works, w)
		if err := r.Finish(r.Timing().Step(w)); err != nil {
			t.Fatal(err)
		}
	}
	// One budget token for the short sequence's decode each step, the
	// rest for the long prompt: 999, 999, then the last 502.
	for i, want := range []int{999, 999, 502} {
		if works[i].Prefill != want || works[i].Decoding != 1 {
			t.Errorf("step %d: %+v, want %d prefilled beside 1 decoding", i, works[i], want)
		}
	}
	if works[1].PrefillContext <= works[0].PrefillContext {
		t.Errorf("the second chunk attends to no more context than the first: %d, %d", works[1].PrefillContext, works[0].PrefillContext)
	}
	if got := len(long.Tokens); got != 2 {
		t.Errorf("the long prompt has %d tokens out after its last chunk, want its only one and its end", got)
	}
	if got := len(short.Tokens); got != 4 {
		t.Errorf("the short sequence emitted %d tokens over 4 steps, want 4 (it kept decoding)", got)
	}
}

func TestEstimateTTFTIsWhatTheSchedulerThenDoes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		maxSeqs int
		budget  int
		queued  int
	}{
		{"an idle core", 4, 4096, 0},
		{"a core with a batch running", 4, 4096, 3},
		{"a core whose batch is full, so the request waits for a seat", 2, 4096, 5},
		{"a small token budget, so prefills are chunked", 4, 700, 4},
	}
	for _, tt := range tests {
		for _, family := range FamilyNames {
			t.Run(family+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				r := testReplica(4096, 0, tt.maxSeqs)
				r.timing.MaxBatchedTokens = tt.budget
				r.timing = Family{Name: family}.Timing(r.timing, 3, 0)
				estimateIsWhatTheSchedulerDoes(t, r, tt.queued)
			})
		}
	}
}

// estimateIsWhatTheSchedulerDoes queues queued requests on r, starts a
// step, and checks that EstimateTTFT then is what r's scheduler takes.
func estimateIsWhatTheSchedulerDoes(t *testing.T, r *Core, queued int) {
	t.Helper()
	shared := prompt(7, 512)
	for i := range queued {
		if _, err := r.Submit(blockpool.Request{Tokens: append(append([]uint32{}, shared...), prompt(i, 300)...)}, 6); err != nil {
			t.Fatal(err)
		}
	}
	// A step under way: the estimate starts from its end.
	now := time.Unix(1000, 0)
	var first time.Duration
	if w, ok := r.Plan(); ok {
		first = r.Timing().Step(w)
		r.Stepping(now.Add(first))
	}
	target := append(append([]uint32{}, shared...), prompt(99, 200)...)
	est := r.EstimateTTFT(target, now)

	if first > 0 {
		if err := r.Finish(first); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := r.Submit(blockpool.Request{Tokens: target}, 1)
	elapsed := first
	for range 10000 {
		w, ok := r.Plan()
		if !ok {
			t.Fatal("the core went idle before the request's first token")
		}
		d := r.Timing().Step(w)
		elapsed += d
		if err := r.Finish(d); err != nil {
			t.Fatal(err)
		}
		if len(s.Tokens) > 0 {
			break
		}
	}
	if est != elapsed {
		t.Errorf("estimated %v, the scheduler took %v", est, elapsed)
	}
}

func TestAFleetWithSpeedsHasEnginesOfDifferentSpeeds(t *testing.T) {
	t.Parallel()
	cfg := FleetConfig{Engines: 4, Timing: DefaultTiming(), Speeds: []float64{1, 0.5}}
	w := StepWork{Prefill: 1000}
	fast, slow := cfg.TimingOf(0).Step(w), cfg.TimingOf(1).Step(w)
	if slow != 2*fast || cfg.TimingOf(2).Step(w) != fast || cfg.TimingOf(3).Step(w) != slow {
		t.Errorf("steps of engines 0-3: %v %v %v %v; want fast, twice as slow, fast, slow",
			fast, slow, cfg.TimingOf(2).Step(w), cfg.TimingOf(3).Step(w))
	}
	if (FleetConfig{Timing: DefaultTiming()}).TimingOf(3) != DefaultTiming() {
		t.Error("a fleet without speeds does not run the default timing everywhere")
	}
}
