package blockpool

import (
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/events"
)

const bs = 4

func tokens(n int, from uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

func newPool(t *testing.T, gpu, cpu int) *Pool {
	t.Helper()
	return New(Config{BlockSize: bs, GPUBlocks: gpu, CPUBlocks: cpu, Seed: 7})
}

// step returns the step's events, failing if there are none.
func step(t *testing.T, p *Pool) []events.Event {
	t.Helper()
	b, _, ok := p.Step()
	if !ok {
		t.Fatal("no events in step")
	}
	return b.Events
}

func mustAllocate(t *testing.T, p *Pool, r Request) int {
	t.Helper()
	hit, err := p.Allocate(r)
	if err != nil {
		t.Fatal(err)
	}
	return hit
}

func TestAllocatePublishesTheStoredRunWithItsParent(t *testing.T) {
	t.Parallel()
	p := newPool(t, 16, 0)
	first := Request{ID: "a", Tokens: tokens(2*bs+1, 0)}
	mustAllocate(t, p, first)
	evs := step(t, p)
	hashes := p.BlockHashes(first)
	want := events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: first.Tokens[:2*bs],
		BlockSize: bs, ExtraKeys: []events.ExtraKey{nil, nil}}
	if len(evs) != 1 || !sameEvent(evs[0], want) {
		t.Fatalf("events %+v, want %+v", evs, want)
	}
	// A longer prompt with the same start reuses two blocks and stores the
	// third with the second as parent.
	second := Request{ID: "b", Tokens: tokens(3*bs+2, 0)}
	if hit := mustAllocate(t, p, second); hit != 2 {
		t.Fatalf("hit %d, want 2", hit)
	}
	evs = step(t, p)
	h2 := p.BlockHashes(second)
	if len(evs) != 1 || !evs[0].HasParent || evs[0].ParentHash != hashes[1] ||
		!slices.Equal(evs[0].BlockHashes, h2[2:]) || !slices.Equal(evs[0].TokenIDs, second.Tokens[2*bs:3*bs]) {
		t.Fatalf("child event %+v", evs)
	}
}

func sameEvent(a, b events.Event) bool {
	return a.Kind == b.Kind && slices.Equal(a.BlockHashes, b.BlockHashes) && a.HasParent == b.HasParent &&
		a.ParentHash == b.ParentHash && slices.Equal(a.TokenIDs, b.TokenIDs) && a.BlockSize == b.BlockSize &&
		a.Medium == b.Medium && a.LoRAName == b.LoRAName && len(a.ExtraKeys) == len(b.ExtraKeys)
}

func TestAPromptOfWholeBlocksRecomputesItsLastBlockAndStoresItAgain(t *testing.T) {
	t.Parallel()
	p := newPool(t, 16, 0)
	r := Request{ID: "a", Tokens: tokens(3*bs, 0)}
	mustAllocate(t, p, r)
	step(t, p)
	r.ID = "b"
	if hit := mustAllocate(t, p, r); hit != 2 {
		t.Fatalf("hit %d, want 2 (the last token is always computed)", hit)
	}
	evs := step(t, p)
	last := p.BlockHashes(r)[2]
	if len(evs) != 1 || !slices.Equal(evs[0].BlockHashes, []uint64{last}) {
		t.Fatalf("want the last block stored again, got %+v", evs)
	}
}

func TestFreedBlocksStayCachedUntilTheirSlotIsReused(t *testing.T) {
	t.Parallel()
	p := newPool(t, 4, 0)
	a := Request{ID: "a", Tokens: tokens(4*bs, 0)}
	mustAllocate(t, p, a)
	step(t, p)
	if err := p.Free("a"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := p.Step(); ok {
		t.Fatal("freeing published events")
	}
	if h := p.Held(a); h.Blocks != 4 {
		t.Fatalf("held %+v after free", h)
	}
	// One new block reuses the least recently freed slot: the prompt's tail,
	// as blocks are freed last block first.
	mustAllocate(t, p, Request{ID: "b", Tokens: tokens(bs, 100)})
	evs := step(t, p)
	ha := p.BlockHashes(a)
	if len(evs) != 2 || evs[0].Kind != events.KindBlockRemoved || !slices.Equal(evs[0].BlockHashes, ha[3:]) ||
		evs[1].Kind != events.KindBlockStored {
		t.Fatalf("events %+v, want removal of the tail then the store", evs)
	}
	if h := p.Held(a); h.Blocks != 3 {
		t.Fatalf("held %+v, want the first three blocks", h)
	}
}

func TestAllocateWithoutRoomChangesNothing(t *testing.T) {
	t.Parallel()
	p := newPool(t, 2, 0)
	mustAllocate(t, p, Request{ID: "a", Tokens: tokens(bs, 0)})
	step(t, p)
	_, err := p.Allocate(Request{ID: "b", Tokens: tokens(2*bs, 50)})
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err %v", err)
	}
	if _, _, ok := p.Step(); ok {
		t.Fatal("a failed allocation published events")
	}
	if p.FreeBlocks() != 1 || p.Usage() != 0.5 {
		t.Fatalf("free %d usage %v", p.FreeBlocks(), p.Usage())
	}
	if _, err := p.Allocate(Request{ID: "a", Tokens: tokens(1, 0)}); !errors.Is(err, ErrRunning) {
		t.Fatalf("duplicate id: %v", err)
	}
	if err := p.Free("zz"); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("free unknown: %v", err)
	}
}

func TestOffloadToCPU(t *testing.T) {
	t.Parallel()
	p := newPool(t, 2, 3)
	a := Request{ID: "a", Tokens: tokens(2*bs, 0)}
	mustAllocate(t, p, a)
	evs := step(t, p)
	ha := p.BlockHashes(a)
	if len(evs) != 2 || evs[1].Medium != events.TierCPU || len(evs[1].TokenIDs) != 0 || evs[1].BlockSize != 0 ||
		!slices.Equal(evs[1].BlockHashes, ha) {
		t.Fatalf("want a GPU store then a CPU placeholder, got %+v", evs)
	}
	_ = p.Free("a")
	// Two new blocks push a's blocks out of the GPU and one out of the CPU.
	b := Request{ID: "b", Tokens: tokens(2*bs, 100)}
	mustAllocate(t, p, b)
	evs = step(t, p)
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Kind.String()+"/"+e.Medium.String())
	}
	want := []string{"BlockRemoved/GPU", "BlockRemoved/GPU", "BlockStored/GPU", "BlockRemoved/CPU", "BlockStored/CPU"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	if evs[3].BlockHashes[0] != ha[0] {
		t.Fatal("the CPU tier did not evict its least recently used block")
	}
	if h := p.Held(a); h.Blocks != 0 {
		t.Fatalf("a's first block left CPU, yet held %+v", h)
	}
	tiers := p.BlockTiers(a)
	if !slices.Equal(tiers, []events.Tier{NotHeld, events.TierCPU}) {
		t.Fatalf("tiers %v", tiers)
	}
}

func TestResetPrefixCache(t *testing.T) {
	t.Parallel()
	p := newPool(t, 8, 8)
	a := Request{ID: "a", Tokens: tokens(2*bs, 0)}
	mustAllocate(t, p, a)
	step(t, p)
	if err := p.ResetPrefixCache(); !errors.Is(err, ErrInUse) {
		t.Fatalf("reset with a request running: %v", err)
	}
	_ = p.Free("a")
	if err := p.ResetPrefixCache(); err != nil {
		t.Fatal(err)
	}
	evs := step(t, p)
	if len(evs) != 1 || evs[0].Kind != events.KindAllBlocksCleared {
		t.Fatalf("events %+v", evs)
	}
	if h := p.Held(a); h.Blocks != 0 {
		t.Fatalf("held %+v after reset", h)
	}
	// Reused slots that no longer cache anything publish no removals.
	mustAllocate(t, p, Request{ID: "b", Tokens: tokens(8*bs, 100)})
	for _, e := range step(t, p) {
		if e.Kind == events.KindBlockRemoved && e.Medium == events.TierGPU {
			t.Fatalf("removal of a block cleared by the reset: %+v", e)
		}
	}
}

func TestExtrasFollowVLLMOrder(t *testing.T) {
	t.Parallel()
	p := newPool(t, 8, 0)
	r := Request{ID: "a", Tokens: tokens(3*bs, 0), LoRA: "sql", Salt: "s",
		MM: []MMItem{{Hash: "img", Offset: bs + 1, Length: 2}}}
	mustAllocate(t, p, r)
	evs := step(t, p)
	got := evs[0].ExtraKeys
	// A multimodal item is named with its start relative to the block.
	want := []events.ExtraKey{{"sql", "s"}, {"sql", []any{"img", int64(1)}}, {"sql"}}
	if len(got) != len(want) {
		t.Fatalf("extras %v", got)
	}
	for i := range want {
		if !reflect.DeepEqual(got[i], want[i]) {
			t.Fatalf("block %d extras %v, want %v", i, got[i], want[i])
		}
	}
	if evs[0].LoRAName != "sql" {
		t.Fatalf("lora name %q", evs[0].LoRAName)
	}
}

func TestHashesAreOpaquePerEngine(t *testing.T) {
	t.Parallel()
	r := Request{Tokens: tokens(4*bs, 0)}
	a := New(Config{BlockSize: bs, GPUBlocks: 4, Seed: 1}).BlockHashes(r)
	b := New(Config{BlockSize: bs, GPUBlocks: 4, Seed: 2}).BlockHashes(r)
	a2 := New(Config{BlockSize: bs, GPUBlocks: 4, Seed: 1}).BlockHashes(r)
	if !slices.Equal(a, a2) {
		t.Fatal("same seed, different hashes")
	}
	for i := range a {
		if a[i] == b[i] || a[i] == 0 {
			t.Fatalf("block %d: %#x vs %#x", i, a[i], b[i])
		}
	}
	salted := New(Config{BlockSize: bs, GPUBlocks: 4, Seed: 1}).BlockHashes(Request{Tokens: r.Tokens, Salt: "x"})
	if salted[3] == a[3] {
		t.Fatal("the salt on block 0 does not reach later blocks")
	}
}

func TestStepNumbersOnlyPublishedBatches(t *testing.T) {
	t.Parallel()
	p := newPool(t, 8, 0)
	if _, _, ok := p.Step(); ok {
		t.Fatal("an idle step published")
	}
	mustAllocate(t, p, Request{ID: "a", Tokens: tokens(bs, 0)})
	b, seq, ok := p.Step()
	if !ok || seq != 0 || !b.HasDPRank {
		t.Fatalf("first batch seq %d ok %v", seq, ok)
	}
	mustAllocate(t, p, Request{ID: "b", Tokens: tokens(bs, 9)})
	if _, seq, _ := p.Step(); seq != 1 {
		t.Fatalf("second batch seq %d", seq)
	}
}

func TestRunningIsSorted(t *testing.T) {
	t.Parallel()
	p := newPool(t, 8, 0)
	for _, id := range []string{"c", "a", "b"} {
		mustAllocate(t, p, Request{ID: id, Tokens: tokens(1, 0)})
	}
	if got := p.Running(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("running %v", got)
	}
}
