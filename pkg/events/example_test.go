package events_test

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/kvroute/kvroute/pkg/events"
)

// A batch as vLLM publishes it (array-encoded events, msgspec's msgpack):
// at 1.5 s, data-parallel rank 0, one BlockStored of one 4-token block
// in GPU memory. The bytes arrive unchanged as a NATS message's payload.
const storedBatch = "93cb3ff80000000000009198ab426c6f636b53746f72656491cf0102030405060708c0940102030404c0a3475055c000"

func ExampleDecoder_Decode() {
	payload, _ := hex.DecodeString(storedBatch)

	// A consumer keeps one Decoder and one Batch per goroutine: decoding
	// into the same Batch again reuses its slices.
	var d events.Decoder
	var b events.Batch
	if err := d.Decode(payload, &b); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("ts=%v dp_rank=%d events=%d blocks=%d\n", b.TS, b.DPRank, len(b.Events), b.Blocks())
	for _, e := range b.Events {
		fmt.Printf("%s %s hashes=%#x parent=%v block_size=%d tokens=%v\n",
			e.Kind, e.Medium, e.BlockHashes, e.HasParent, e.BlockSize, e.TokenIDs)
	}

	// Bytes that are no batch are an error wrapping ErrMalformed, never a panic.
	err := d.Decode(payload[:20], &b)
	fmt.Println(errors.Is(err, events.ErrMalformed), len(b.Events))
	// Output:
	// ts=1.5 dp_rank=0 events=1 blocks=1
	// BlockStored GPU hashes=[0x102030405060708] parent=false block_size=4 tokens=[1 2 3 4]
	// true 0
}
