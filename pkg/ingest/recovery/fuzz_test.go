package recovery

import (
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
)

// FuzzChunk feeds snapshot replies from the network through the checks a
// chunk passes before it is installed: header parsing, then decoding. No
// input may panic, and an accepted chunk's numbers must be in range.
func FuzzChunk(f *testing.F) {
	batch, _ := hex.DecodeString("93cb3ff80000000000009198ab426c6f636b53746f72656491cf0102030405060708c0940102030404c0a3475055c000")
	f.Add("10.0.0.7:8000", "12", "0", "1", "true", "inst-a", batch)
	f.Add("10.0.0.7:8000", "12", "3", "2", "true", "inst-a", batch)
	f.Add("10.0.0.7:8000", "18446744073709551615", "0", "65536", "false", "", []byte{})
	f.Add("[::1]:1", "-1", "x", "0", "maybe", "i", []byte{0x93, 0xcb})
	f.Add("host:0", "1", "0", "99999999999", "true", "i", []byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, endpoint, seq, index, total, exact, instance string, data []byte) {
		h := nats.Header{}
		h.Set(events.HeaderEndpoint, endpoint)
		h.Set(events.HeaderSeq, seq)
		h.Set(events.HeaderInstance, instance)
		h.Set(events.HeaderSnapshotChunk, index)
		h.Set(events.HeaderSnapshotChunks, total)
		h.Set(events.HeaderSnapshotExact, exact)
		c, err := parseChunk(&nats.Msg{Header: h, Data: data})
		if err != nil {
			return
		}
		if c.total < 1 || c.total > maxChunks || c.index < 0 || c.index >= c.total {
			t.Fatalf("accepted chunk %d of %d", c.index, c.total)
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
