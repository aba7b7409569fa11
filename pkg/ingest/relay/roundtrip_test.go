package relay

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// A snapshot must rebuild, in the EPP's index, exactly what the live events
// built: for every shape of event publishers send, the index fed the live
// batches and the index given the relay's snapshot of them answer every
// lookup alike, and so does the index given the snapshot of a relay
// restarted from its checkpoint.
func TestSnapshotsRebuildWhatEveryPublisherShapeBuilt(t *testing.T) {
	t.Parallel()
	const model, addr = "m", "10.0.0.1:8000"
	for _, tc := range []struct {
		name    string
		bs      int
		bigram  bool
		batches func(rng *rand.Rand) ([]*events.Batch, [][]uint32)
	}{
		{"a hybrid engine: full attention, a sliding window, Mamba with sparse stores", 4, false, func(rng *rand.Rand) ([]*events.Batch, [][]uint32) {
			return poolBatches(rng, blockpool.Config{BlockSize: 4, GPUBlocks: 90, Seed: 3,
				Groups: []blockpool.Group{{Kind: blockpool.FullAttention}, {Kind: blockpool.SlidingWindow, Window: 9}, {Kind: blockpool.Mamba}}})
		}},
		{"self-describing CPU offload and removals with copy counts", 4, false, func(rng *rand.Rand) ([]*events.Batch, [][]uint32) {
			return poolBatches(rng, blockpool.Config{BlockSize: 4, GPUBlocks: 24, CPUBlocks: 40, Seed: 5,
				SelfDescribingOffload: true, ReportRemainingCopies: true})
		}},
		{"SGLang token pairs with a salt in its metadata", 4, true, func(rng *rand.Rand) ([]*events.Batch, [][]uint32) {
			toks := seqTokens(17, 100)
			b := &events.Batch{Events: []events.Event{
				{Kind: events.KindBlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: toks[:8], Bigram: true, BigramNext: toks[8], BlockSize: 4},
				{Kind: events.KindBlockStored, BlockHashes: []uint64{3, 4}, ParentHash: 2, HasParent: true, TokenIDs: toks[8:16], Bigram: true, BigramNext: toks[16], BlockSize: 4},
				{Kind: events.KindBlockStored, BlockHashes: []uint64{5}, TokenIDs: toks[:4], Bigram: true, BigramNext: toks[4], BlockSize: 4, CacheSalt: "tenant"},
				{Kind: events.KindBlockRemoved, BlockHashes: []uint64{4}},
			}}
			return []*events.Batch{b}, [][]uint32{toks}
		}},
		{"LMCache chunks of four blocks, never removed", 4, false, func(rng *rand.Rand) ([]*events.Batch, [][]uint32) {
			toks := seqTokens(40, 7)
			b := &events.Batch{Events: []events.Event{
				{Kind: events.KindBlockStored, BlockHashes: []uint64{11}, TokenIDs: toks[:4], BlockSize: 4},
				{Kind: events.KindBlockStored, BlockHashes: []uint64{21}, TokenIDs: toks[:16], BlockSize: 16, Medium: events.TierCPU},
				{Kind: events.KindBlockStored, BlockHashes: []uint64{22}, ParentHash: 21, HasParent: true, TokenIDs: toks[16:32], BlockSize: 16, Medium: events.TierCPU},
			}}
			return []*events.Batch{b}, [][]uint32{toks}
		}},
		{"TensorRT-LLM multimodal tokens and keys", 4, false, func(rng *rand.Rand) ([]*events.Batch, [][]uint32) {
			toks := seqTokens(12, 50)
			b := &events.Batch{Events: []events.Event{
				{Kind: events.KindBlockStored, BlockHashes: []uint64{31, 32, 33}, TokenIDs: toks, BlockSize: 4, OpaqueTokens: []int32{9},
					ExtraKeys: []events.ExtraKey{nil, {[]any{"mm_key", "9f", int64(2), nil}}, nil}},
			}}
			return []*events.Batch{b}, [][]uint32{toks, toks[:4]}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(7, 11))
			batches, prompts := tc.batches(rng)
			live := index.New(index.Options{}, nil)
			live.AddEndpoint(addr)
			m := NewMirror(0)
			m.Reset("inst")
			o := events.Origin{Stream: events.Stream{Endpoint: addr}, Model: model, Instance: "inst", BlockSize: tc.bs}
			for seq, b := range batches {
				// What the relay sees is what it decodes from the wire.
				data, err := events.AppendBatch(nil, b, events.EncodingMap)
				if err != nil {
					t.Fatal(err)
				}
				wired, err := events.Decode(data)
				if err != nil {
					t.Fatal(err)
				}
				o.Seq = uint64(seq)
				live.Apply(o, wired)
				m.Apply(uint64(seq), wired, tc.bs, 0)
			}
			rebuilt := installSnapshot(t, m, o)
			// The relay's checkpoint is made of the same snapshot chunks: a
			// relay restarted from it must serve the same snapshot again.
			pos, blocks, err := m.capture()
			if err != nil {
				t.Fatal(err)
			}
			var ckpt bytes.Buffer
			if _, err := encodeCheckpoint(&ckpt, checkpointHeader{Position: pos}, blocks, 1<<10); err != nil {
				t.Fatal(err)
			}
			h, restoredChunks, err := decodeCheckpoint(ckpt.Bytes())
			if err != nil {
				t.Fatalf("checkpoint: %v", err)
			}
			restarted := NewMirror(0)
			restarted.restore(h.Position, restoredChunks)
			fromCheckpoint := installSnapshot(t, restarted, o)
			for _, ix := range []*index.Index{live, rebuilt, fromCheckpoint} {
				if ix.Bigram(addr) != tc.bigram {
					t.Fatalf("bigram: live %v, rebuilt %v, from the checkpoint %v, want %v",
						live.Bigram(addr), rebuilt.Bigram(addr), fromCheckpoint.Bigram(addr), tc.bigram)
				}
			}
			hits := 0
			for _, p := range prompts {
				for _, salt := range []string{"", "tenant"} {
					var keys []uint64
					if tc.bigram {
						keys = index.AppendBigramBlockKeys(nil, index.BigramRootKey(model, "", salt), p, tc.bs)
					} else {
						keys = index.AppendBlockKeys(nil, index.RootKey(model, "", salt), p, tc.bs)
					}
					a, b, c := make([]index.Match, 1), make([]index.Match, 1), make([]index.Match, 1)
					live.Lookup(keys, []string{addr}, a)
					rebuilt.Lookup(keys, []string{addr}, b)
					fromCheckpoint.Lookup(keys, []string{addr}, c)
					if a[0] != b[0] || a[0] != c[0] {
						t.Fatalf("prompt %v salt %q: live %+v, rebuilt from the snapshot %+v, from the checkpoint's %+v", p, salt, a[0], b[0], c[0])
					}
					hits += a[0].Blocks
				}
			}
			if hits == 0 {
				t.Fatal("no probe hit anything: the check proves nothing")
			}
		})
	}
}

// installSnapshot installs m's snapshot, read back from the wire, into a
// new index under o.
func installSnapshot(t *testing.T, m *Mirror, o events.Origin) *index.Index {
	t.Helper()
	s, err := m.Snapshot(1 << 10)
	if err != nil {
		t.Fatal(err)
	}
	var chunks []*events.Batch
	for _, c := range s.Chunks {
		b, err := events.Decode(c)
		if err != nil {
			t.Fatalf("snapshot chunk: %v", err)
		}
		chunks = append(chunks, b)
	}
	ix := index.New(index.Options{}, nil)
	ix.AddEndpoint(o.Endpoint)
	if err := ix.InstallSnapshot(o, chunks); err != nil {
		t.Fatalf("install: %v", err)
	}
	return ix
}

func seqTokens(n int, from uint32) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = from + uint32(i)
	}
	return out
}

// poolBatches runs a simulated engine through a random shared-prefix
// workload and returns its batches and the prompts it served.
func poolBatches(rng *rand.Rand, cfg blockpool.Config) ([]*events.Batch, [][]uint32) {
	p := blockpool.New(cfg)
	bases := [][]uint32{seqTokens(24, 1000), seqTokens(24, 2000), seqTokens(24, 3000)}
	var prompts [][]uint32
	var batches []*events.Batch
	var running []string
	for step := 0; step < 120; step++ {
		base := bases[rng.IntN(len(bases))]
		prompt := append(append([]uint32(nil), base[:cfg.BlockSize*rng.IntN(6)]...), seqTokens(1+rng.IntN(12), uint32(rng.IntN(9000)))...)
		id := fmt.Sprint(step)
		if _, err := p.Allocate(blockpool.Request{ID: id, Tokens: prompt}); err == nil {
			running = append(running, id)
			prompts = append(prompts, prompt)
		}
		for len(running) > 2 {
			_ = p.Free(running[0])
			running = running[1:]
		}
		if b, _, ok := p.Step(); ok {
			batches = append(batches, b)
		}
	}
	return batches, prompts
}
