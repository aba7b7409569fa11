package events

import (
	"errors"
	"testing"
)

// FuzzDecode feeds the decoder arbitrary bytes, seeded with the golden
// vectors. Whatever the input, Decode must not panic and must either fail
// with ErrMalformed or return a batch that
//   - is the same whether decoded fresh or into a reused Decoder and Batch,
//   - encodes in both forms, and decodes back to itself (the events it
//     skipped aside).
func FuzzDecode(f *testing.F) {
	vectors := loadGoldenVectors(f)
	for _, v := range vectors {
		f.Add(v.payload)
	}
	// A batch with every field set, decoded first so that reuse is tested
	// against leftovers.
	dirty := vectors[0].payload
	for _, v := range vectors {
		if v.name == "canon-map-all-fields" {
			dirty = v.payload
		}
	}

	f.Fuzz(func(t *testing.T, data []byte) {
		fresh, err := Decode(data)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode error %v does not wrap ErrMalformed", err)
			}
			return
		}

		var d Decoder
		var reused Batch
		if err := d.Decode(dirty, &reused); err != nil {
			t.Fatalf("seed batch: %v", err)
		}
		if err := d.Decode(data, &reused); err != nil {
			t.Fatalf("Decode into a reused batch failed (%v) where a fresh one did not", err)
		}
		if diff := batchDiff(&reused, fresh); diff != "" {
			t.Fatalf("reused batch differs from a fresh one: %s", diff)
		}

		want := *fresh
		want.Skipped = 0
		// Of the fields kept but not acted on, only what the events hold is
		// written again.
		want.Ignored = [NumIgnored]int{}
		for i := range fresh.Events {
			if fresh.Events[i].Locality != LocalityUnspecified {
				want.Ignored[IgnoredLocality]++
			}
			if fresh.Events[i].Ownership != "" {
				want.Ignored[IgnoredOwnership]++
			}
		}
		for _, enc := range []Encoding{EncodingArray, EncodingMap} {
			out, err := AppendBatch(nil, fresh, enc)
			if err != nil {
				t.Fatalf("a decoded batch does not encode in %s form: %v", enc, err)
			}
			back, err := Decode(out)
			if err != nil {
				t.Fatalf("%s form does not decode: %v\n%x", enc, err, out)
			}
			if diff := batchDiff(back, &want); diff != "" {
				t.Fatalf("%s form round trip changed the batch: %s", enc, diff)
			}
		}
	})
}
