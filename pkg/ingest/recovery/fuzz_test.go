package recovery

import (
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
)

// FuzzChunk feeds snapshot replies from the network through the checks a
// chunk passes before it is installed: header parsing, then decoding. No
// input may panic, and an accepted chunk's numbers must be in range.
func FuzzChunk(f *testing.F) {
	batch, _ := hex.DecodeString("93cb3ff80000000000009198ab426c6f636b53746f72656491cf0102030405060708c0940102030404c0a3475055c000")
	f.Add("10.0.0.7:8000", "12", "0", "1", "true", "", "inst-a", batch)
	f.Add("10.0.0.7:8000", "12", "3", "2", "true", "exact", "inst-a", batch)
	f.Add("10.0.0.7:8000", "18446744073709551615", "0", "65536", "false", "partial", "", []byte{})
	f.Add("[::1]:1", "-1", "x", "0", "maybe", "inexact", "i", []byte{0x93, 0xcb})
	f.Add("host:0", "1", "0", "99999999999", "true", "partial", "i", []byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, endpoint, seq, index, total, exact, state, instance string, data []byte) {
		h := nats.Header{}
		h.Set(events.HeaderEndpoint, endpoint)
		h.Set(events.HeaderSeq, seq)
		h.Set(events.HeaderInstance, instance)
		h.Set(events.HeaderSnapshotChunk, index)
		h.Set(events.HeaderSnapshotChunks, total)
		h.Set(events.HeaderSnapshotExact, exact)
		if state != "" {
			h.Set(events.HeaderSnapshotState, state)
		}
		c, err := parseChunk(&nats.Msg{Header: h, Data: data})
		if err != nil {
			return
		}
		if c.total < 1 || c.total > maxChunks || c.index < 0 || c.index >= c.total {
			t.Fatalf("accepted chunk %d of %d", c.index, c.total)
		}
		if c.state != events.SnapshotExact && c.state != events.SnapshotPartial && c.state != events.SnapshotInexact {
			t.Fatalf("accepted chunk in state %q", c.state)
		}
		if b, err := events.Decode(data); err == nil {
			_ = cloneBatch(b)
		}
	})
}

func TestResultLabelsNameEveryOutcome(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, r := range results {
		if seen[r.label] {
			t.Errorf("label %q used twice", r.label)
		}
		seen[r.label] = true
		if got := resultLabel(r.err); got != r.label {
			t.Errorf("resultLabel(%v) = %q, want %q", r.err, got, r.label)
		}
	}
	if got := resultLabel(nil); got != "ok" {
		t.Errorf("resultLabel(nil) = %q, want ok", got)
	}
}

// FuzzSnapshot feeds two reply messages through the assembly of a
// snapshot, as they would come from a relay (or anyone who can answer the
// request), and installs what completes into a real index. No input may
// panic; an assembled snapshot is one stream's, with every chunk it
// announced, in order, within the byte bound.
func FuzzSnapshot(f *testing.F) {
	batch, _ := hex.DecodeString("93cb3ff80000000000009198ab426c6f636b53746f72656491cf0102030405060708c0940102030404c0a3475055c000")
	f.Add("12", "0", "2", "true", "inst-a", batch, "12", "1", "2", "true", "inst-a", batch)
	f.Add("12", "0", "1", "false", "inst-a", batch, "", "", "", "", "", []byte{})
	f.Add("12", "1", "2", "true", "inst-a", batch, "12", "0", "2", "true", "inst-a", batch)
	f.Add("12", "0", "2", "true", "inst-a", batch, "13", "1", "2", "true", "inst-b", []byte{0x93})
	f.Fuzz(func(t *testing.T, seq0, index0, total0, exact0, inst0 string, data0 []byte, seq1, index1, total1, exact1, inst1 string, data1 []byte) {
		const addr = "10.0.0.7:8000"
		msg := func(seq, index, total, exact, inst string, data []byte) *nats.Msg {
			h := nats.Header{}
			h.Set(events.HeaderEndpoint, addr)
			h.Set(events.HeaderSeq, seq)
			h.Set(events.HeaderInstance, inst)
			h.Set(events.HeaderBlockSize, "4")
			h.Set(events.HeaderSnapshotChunk, index)
			h.Set(events.HeaderSnapshotChunks, total)
			h.Set(events.HeaderSnapshotExact, exact)
			return &nats.Msg{Header: h, Data: data}
		}
		a := assembly{stream: events.Stream{Endpoint: addr}, maxBytes: 1 << 20}
		done := false
		for _, m := range []*nats.Msg{msg(seq0, index0, total0, exact0, inst0, data0), msg(seq1, index1, total1, exact1, inst1, data1)} {
			var err error
			if done, err = a.add(m); err != nil || done {
				break
			}
		}
		if !done {
			return
		}
		s := a.snap
		if len(s.chunks) != a.want || s.bytes > a.maxBytes || s.origin.Stream != a.stream {
			t.Fatalf("assembled %d of %d chunks, %d bytes, of %s", len(s.chunks), a.want, s.bytes, s.origin.Stream)
		}
		ix := index.New(index.Options{MaxHoldings: 1 << 12}, nil)
		ix.AddEndpoint(addr)
		_ = ix.InstallSnapshot(s.origin, s.chunks)
	})
}
