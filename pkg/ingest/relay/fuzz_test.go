package relay

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/events"
)

// splitFrames turns fuzz input into ZeroMQ frames: 0xff bytes separate them.
func splitFrames(data []byte) [][]byte { return bytes.Split(data, []byte{0xff}) }

func frameSeed(frames ...[]byte) []byte { return bytes.Join(frames, []byte{0xff}) }

func seqBytes(seq uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], seq)
	return b[:]
}

func FuzzParseFrame(f *testing.F) {
	f.Add(frameSeed([]byte("kv@topic"), []byte{0, 0, 0, 0, 0, 0, 0, 7}, []byte{0x93, 0x01}))
	f.Add(frameSeed([]byte(""), []byte{1}, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		m, err := parseFrame(frames)
		if err != nil {
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("error %v does not wrap ErrMalformedFrame", err)
			}
			return
		}
		if binary.BigEndian.Uint64(frames[1]) != m.seq || !bytes.Equal(m.payload, frames[2]) {
			t.Fatalf("parsed %+v from %q", m, frames)
		}
	})
}

func FuzzParseReplay(f *testing.F) {
	f.Add(frameSeed([]byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 3}, []byte{0x90}))
	f.Add(frameSeed([]byte{}, []byte("kv@t"), []byte{0xff - 1, 0, 0, 0, 0, 0, 0, 3}, []byte{0x90}))
	f.Add(frameSeed([]byte("x"), []byte{1}))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := splitFrames(data)
		seq, payload, err := parseReplay(frames)
		if err != nil {
			if !errors.Is(err, ErrMalformedFrame) {
				t.Fatalf("error %v does not wrap ErrMalformedFrame", err)
			}
			return
		}
		if seq != binary.BigEndian.Uint64(frames[len(frames)-2]) || !bytes.Equal(payload, frames[len(frames)-1]) {
			t.Fatalf("parsed seq %d payload %q from %q", seq, payload, frames)
		}
	})
}

// FuzzMirror feeds arbitrary payloads, as the relay receives them, through
// the decoder into the mirror: nothing may panic, the mirror's bookkeeping
// must hold, and its snapshot must rebuild exactly its held set.
func FuzzMirror(f *testing.F) {
	for _, h := range []string{
		// vLLM's own examples: one BlockStored in array form and map form.
		"93cb3ff80000000000009198ab426c6f636b53746f72656491cf0102030405060708c0940102030404c0a3475055c000",
		"93cb3ff80000000000009188a474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf0102030405060708b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a6504a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c000",
	} {
		b, _ := hex.DecodeString(h)
		f.Add(b, b)
	}
	bm := newBatchMaker(1, 4, 3)
	for i := 0; i < 4; i++ {
		a, _ := events.AppendBatch(nil, bm.batch(), events.EncodingArray)
		b, _ := events.AppendBatch(nil, bm.batch(), events.EncodingMap)
		f.Add(a, b)
	}
	f.Fuzz(func(t *testing.T, first, second []byte) {
		m := NewMirror(8)
		m.Reset("fuzz")
		var d events.Decoder
		var b events.Batch
		for seq, payload := range [][]byte{first, second} {
			if err := d.Decode(payload, &b); err != nil {
				m.Apply(uint64(seq), nil, 4, 0)
				continue
			}
			m.Apply(uint64(seq), &b, 4, 0)
			m.checkInvariants(t)
		}
		checkSnapshotRoundTrip(t, m, 512)
	})
}

// FuzzStateFiles reads arbitrary bytes as a checkpoint and as a journal,
// as a relay reads back its state directory: neither may panic, a
// checkpoint that decodes must restore a mirror whose bookkeeping holds,
// and a journal yields records only up to its first bad one.
func FuzzStateFiles(f *testing.F) {
	m := NewMirror(0)
	m.Reset("fuzz")
	bm := newBatchMaker(2, 4, 3)
	var journal []byte
	for seq := uint64(0); seq < 4; seq++ {
		b := bm.batch()
		data, _ := events.AppendBatch(nil, b, events.EncodingArray)
		m.Apply(seq, b, 4, 0)
		journal = appendRecord(journal, recBatch, batchRecordHead(seq, 4, 0), data)
	}
	journal = appendRecord(journal, recPosition, []byte(`{"reset":false,"position":{"Instance":"fuzz","Seq":3,"Valid":true}}`))
	var ckpt bytes.Buffer
	pos, blocks, _ := m.capture()
	if _, err := encodeCheckpoint(&ckpt, checkpointHeader{Endpoint: "10.0.0.7:8000", Pod: "p", Position: pos}, blocks, 256); err != nil {
		f.Fatal(err)
	}
	f.Add(ckpt.Bytes())
	f.Add(journal)
	f.Add([]byte(checkpointMagic + "\x00\x00\x00\x02{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		if h, chunks, err := decodeCheckpoint(data); err == nil {
			r := NewMirror(16)
			r.restore(h.Position, chunks)
			r.checkInvariants(t)
		}
		recs, _ := readJournal(data)
		for _, rec := range recs {
			if rec.kind != recBatch && rec.kind != recPosition {
				t.Fatalf("record of kind %d read back", rec.kind)
			}
		}
	})
}
