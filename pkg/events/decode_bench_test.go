package events

import (
	"math/rand/v2"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// benchBatch builds one realistic engine step: storedEvents chained
// BlockStored runs of blocks blocks each, blockSize tokens per block, and a
// BlockRemoved naming as many blocks as one run. Token ids span a
// 150k-token vocabulary, so they take every msgpack width a real prompt
// does; hashes are full 64-bit values.
func benchBatch(storedEvents, blocks, blockSize int) *Batch {
	rng := rand.New(rand.NewPCG(1, 2))
	b := &Batch{TS: 1733000000.125, HasDPRank: true}
	var parent uint64
	for range storedEvents {
		e := Event{Kind: KindBlockStored, BlockSize: blockSize, Medium: TierGPU}
		if parent != 0 {
			e.ParentHash, e.HasParent = parent, true
		}
		for range blocks {
			parent = rng.Uint64() | 1
			e.BlockHashes = append(e.BlockHashes, parent)
			for range blockSize {
				e.TokenIDs = append(e.TokenIDs, uint32(rng.IntN(150000)))
			}
		}
		b.Events = append(b.Events, e)
	}
	rm := Event{Kind: KindBlockRemoved, Medium: TierGPU}
	for range blocks {
		rm.BlockHashes = append(rm.BlockHashes, rng.Uint64())
	}
	b.Events = append(b.Events, rm)
	return b
}

// reportBlockRate reports the unit the ingest budget is written in.
func reportBlockRate(b *testing.B, blocksPerOp int) {
	blocks := float64(blocksPerOp) * float64(b.N)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/blocks, "ns/block")
	b.ReportMetric(blocks/b.Elapsed().Seconds(), "blocks/s")
}

// BenchmarkDecode measures Decoder.Decode into a reused Batch on a step of
// four 32-block stores (block size 16) and one 32-block removal.
func BenchmarkDecode(b *testing.B) {
	batch := benchBatch(4, 32, 16)
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		data, err := AppendBatch(nil, batch, enc)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(enc.String(), func(b *testing.B) {
			var d Decoder
			var out Batch
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := d.Decode(data, &out); err != nil {
					b.Fatal(err)
				}
			}
			reportBlockRate(b, batch.Blocks())
		})
	}
}

// BenchmarkDecodeGenericUnmarshal is the baseline BenchmarkDecode is held
// against: the library's generic decoding of the same bytes into any.
func BenchmarkDecodeGenericUnmarshal(b *testing.B) {
	batch := benchBatch(4, 32, 16)
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		data, err := AppendBatch(nil, batch, enc)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(enc.String(), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				var v any
				if err := msgpack.Unmarshal(data, &v); err != nil {
					b.Fatal(err)
				}
			}
			reportBlockRate(b, batch.Blocks())
		})
	}
}

// BenchmarkAppendBatch measures the encoder the simulator and the
// publisher tests use.
func BenchmarkAppendBatch(b *testing.B) {
	batch := benchBatch(4, 32, 16)
	for _, enc := range []Encoding{EncodingArray, EncodingMap} {
		b.Run(enc.String(), func(b *testing.B) {
			var buf []byte
			b.ReportAllocs()
			for range b.N {
				var err error
				if buf, err = AppendBatch(buf[:0], batch, enc); err != nil {
					b.Fatal(err)
				}
			}
			reportBlockRate(b, batch.Blocks())
		})
	}
}
