package index

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// kvroute's keys for a request must agree with the engine's own hashes for
// it: a request finds exactly the blocks the engine would serve it, however
// LoRA adapters, cache salts and multimodal items enter vLLM's block hashes
// (its extra keys: the adapter's name on every block, each multimodal item
// with its offset in the block, the salt on the first block).
func TestRequestKeysAgreeWithTheEnginesHashes(t *testing.T) {
	t.Parallel()
	const bs = ixTestBS
	prompt := blockToks(1, 2, 3, 4)
	for _, tc := range []struct {
		name string
		// stored is what the engine served; asked is the request asking.
		stored blockpool.Request
		asked  ixReq
		want   int
	}{
		{"a plain prompt", blockpool.Request{Tokens: prompt}, ixReq{tokens: prompt}, 4},
		{"an adapter's prompt asked with that adapter", blockpool.Request{Tokens: prompt, LoRA: "sql"}, ixReq{lora: "sql", tokens: prompt}, 4},
		{"an adapter's prompt asked by the base model", blockpool.Request{Tokens: prompt, LoRA: "sql"}, ixReq{tokens: prompt}, 0},
		{"an adapter's prompt asked with another adapter", blockpool.Request{Tokens: prompt, LoRA: "sql"}, ixReq{lora: "chat", tokens: prompt}, 0},
		{"a base-model prompt asked with an adapter", blockpool.Request{Tokens: prompt}, ixReq{lora: "sql", tokens: prompt}, 0},
		{"a salted prompt asked with its salt", blockpool.Request{Tokens: prompt, Salt: "t1"}, ixReq{salt: "t1", tokens: prompt}, 4},
		{"a salted prompt asked without one", blockpool.Request{Tokens: prompt, Salt: "t1"}, ixReq{tokens: prompt}, 0},
		{"a salted prompt asked with another salt", blockpool.Request{Tokens: prompt, Salt: "t1"}, ixReq{salt: "t2", tokens: prompt}, 0},
		{"an unsalted prompt asked with a salt", blockpool.Request{Tokens: prompt}, ixReq{salt: "t1", tokens: prompt}, 0},
		{"an adapter and a salt together", blockpool.Request{Tokens: prompt, LoRA: "sql", Salt: "t1"}, ixReq{lora: "sql", salt: "t1", tokens: prompt}, 4},
		{"an adapter and a salt, asked with the adapter only", blockpool.Request{Tokens: prompt, LoRA: "sql", Salt: "t1"}, ixReq{lora: "sql", tokens: prompt}, 0},
		{"an image in the third block: the text before it is shared",
			blockpool.Request{Tokens: prompt, MM: []blockpool.MMItem{{Hash: "img", Offset: 2*bs + 1, Length: 2}}}, ixReq{tokens: prompt}, 2},
		{"an image spanning blocks two and three",
			blockpool.Request{Tokens: prompt, MM: []blockpool.MMItem{{Hash: "img", Offset: bs + 2, Length: bs}}}, ixReq{tokens: prompt}, 1},
		{"an image in the first block, with an adapter and a salt",
			blockpool.Request{Tokens: prompt, LoRA: "sql", Salt: "t1", MM: []blockpool.MMItem{{Hash: "img", Offset: 0, Length: 1}}},
			ixReq{lora: "sql", salt: "t1", tokens: prompt}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := blockpool.New(blockpool.Config{BlockSize: bs, GPUBlocks: 16, Seed: 9})
			tc.stored.ID = "r"
			if _, err := pool.Allocate(tc.stored); err != nil {
				t.Fatal(err)
			}
			b, _, _ := pool.Step()
			ix := New(Options{}, prometheus.NewRegistry())
			ix.AddEndpoint(ixTestAddr)
			newIxFeeder(ix, ixTestAddr, 0).apply(b.Events...)
			if got := ixLookupOne(ix, tc.asked, ixTestAddr); got.Blocks != tc.want {
				t.Fatalf("the request finds %d blocks, the engine would serve %d", got.Blocks, tc.want)
			}
			// And the engine agrees: the same request, as it would hash it.
			same := blockpool.Request{Tokens: tc.asked.tokens, LoRA: tc.asked.lora, Salt: tc.asked.salt}
			if held := pool.Held(same); held.Blocks != tc.want {
				t.Fatalf("the engine holds %d blocks of the request, the test expects %d", held.Blocks, tc.want)
			}
		})
	}
}

// Extra keys older and other publishers write, and what a plain request can
// find under them.
func TestExtraKeyShapesOfOtherVersions(t *testing.T) {
	t.Parallel()
	prompt := blockToks(1, 2)
	for _, tc := range []struct {
		name  string
		event events.Event
		asked ixReq
		want  int
	}{
		{"vLLM's multimodal hash as a bare string on a later block marks it",
			evWithExtras(evStore([]uint64{1, 2}, prompt), nil, events.ExtraKey{"img-sha"}), ixReq{tokens: prompt}, 1},
		{"a bare string on the first block is the salt, as vLLM hashes it alike",
			evWithExtras(evStore([]uint64{1, 2}, prompt), events.ExtraKey{"img-sha"}, nil), ixReq{salt: "img-sha", tokens: prompt}, 2},
		{"prompt-embedding digests mark their blocks",
			evWithExtras(evStore([]uint64{1, 2}, prompt), events.ExtraKey{[]byte("digest-1")}, events.ExtraKey{[]byte("digest-2")}), ixReq{tokens: prompt}, 0},
		{"an adapter known only by its integer id matches no request",
			func() events.Event {
				e := evWithExtras(evStore([]uint64{1, 2}, prompt), events.ExtraKey{int64(3)}, events.ExtraKey{int64(3)})
				e.LoRAID, e.HasLoRAID = 3, true
				return e
			}(), ixReq{tokens: prompt}, 0},
		{"an adapter named in the event but not in its extras (vLLM before extra keys)",
			evWithLoRA(evStore([]uint64{1, 2}, prompt), "sql"), ixReq{lora: "sql", tokens: prompt}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ix := New(Options{}, nil)
			ix.AddEndpoint(ixTestAddr)
			newIxFeeder(ix, ixTestAddr, 0).apply(tc.event)
			if got := ixLookupOne(ix, tc.asked, ixTestAddr); got.Blocks != tc.want {
				t.Fatalf("found %d blocks, want %d", got.Blocks, tc.want)
			}
		})
	}
}
