package index_test

import (
	"fmt"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
)

func ExampleIndex_Lookup() {
	const model, blockSize = "llama", 4
	ix := index.New(index.Options{}, nil)

	// Only members' events are applied: discovery adds each endpoint.
	a, b := "10.0.0.1:8000", "10.0.0.2:8000"
	ix.AddEndpoint(a)
	ix.AddEndpoint(b)

	// a's engine stored three blocks of a prompt on its GPU; b's engine
	// holds the first of them, offloaded to CPU memory. The hashes are
	// each engine's own; the index keys blocks by their tokens.
	prompt := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	ix.Apply(events.Origin{Stream: events.Stream{Endpoint: a}, Model: model, Instance: "a1", Seq: 0, BlockSize: blockSize},
		&events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: []uint64{0xa1, 0xa2, 0xa3},
			TokenIDs: prompt, BlockSize: blockSize, Medium: events.TierGPU,
		}}})
	ix.Apply(events.Origin{Stream: events.Stream{Endpoint: b}, Model: model, Instance: "b1", Seq: 0, BlockSize: blockSize},
		&events.Batch{Events: []events.Event{{
			Kind: events.KindBlockStored, BlockHashes: []uint64{0xb1},
			TokenIDs: prompt[:4], BlockSize: blockSize, Medium: events.TierCPU,
		}}})

	// A request shares the first two blocks and then differs; its trailing
	// partial block has no key.
	request := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 99, 100, 101, 102, 103}
	keys := index.AppendBlockKeys(nil, index.RootKey(model, "", ""), request, blockSize)

	addrs := []string{a, b, "10.0.0.3:8000"}
	out := make([]index.Match, len(addrs))
	ix.Lookup(keys, addrs, out)
	for i, m := range out {
		fmt.Printf("%s: %d of %d blocks, GPU %d, CPU %d\n",
			addrs[i], m.Blocks, len(keys), m.ByTier[events.TierGPU], m.ByTier[events.TierCPU])
	}
	// Output:
	// 10.0.0.1:8000: 2 of 3 blocks, GPU 2, CPU 0
	// 10.0.0.2:8000: 1 of 3 blocks, GPU 0, CPU 1
	// 10.0.0.3:8000: 0 of 3 blocks, GPU 0, CPU 0
}
