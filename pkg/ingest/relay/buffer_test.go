package relay

import (
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/pkg/events"
)

func TestOutboxKeepsOrderAndDropsTheOldest(t *testing.T) {
	t.Parallel()
	item := func(seq uint64, size int) outItem {
		return outItem{origin: events.Origin{Seq: seq}, payload: make([]byte, size)}
	}
	tests := []struct {
		name       string
		maxBatches int
		maxBytes   int
		do         func(o *outbox)
		want       []uint64
		dropped    float64
	}{
		{"batches within bounds come out in order", 10, 1000, func(o *outbox) {
			for s := uint64(0); s < 5; s++ {
				o.push(item(s, 10))
			}
		}, []uint64{0, 1, 2, 3, 4}, 0},
		{"past the batch bound the oldest go", 3, 1000, func(o *outbox) {
			for s := uint64(0); s < 5; s++ {
				o.push(item(s, 10))
			}
		}, []uint64{2, 3, 4}, 2},
		{"past the byte bound the oldest go", 10, 25, func(o *outbox) {
			for s := uint64(0); s < 5; s++ {
				o.push(item(s, 10))
			}
		}, []uint64{3, 4}, 3},
		{"one batch larger than the byte bound is still kept", 10, 5, func(o *outbox) {
			o.push(item(0, 10))
		}, []uint64{0}, 0},
		{"a batch put back goes first", 10, 1000, func(o *outbox) {
			o.push(item(0, 1))
			o.push(item(1, 1))
			it, _ := o.pop()
			o.push(item(2, 1))
			o.unpop(it)
		}, []uint64{0, 1, 2}, 0},
		{"a batch put back into a full buffer is the oldest, so it goes", 2, 1000, func(o *outbox) {
			o.push(item(0, 1))
			it, _ := o.pop()
			o.push(item(1, 1))
			o.push(item(2, 1))
			o.unpop(it)
		}, []uint64{1, 2}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, _ := newMetrics(nil)
			o := newOutbox(tc.maxBatches, tc.maxBytes, m)
			tc.do(o)
			var got []uint64
			for {
				it, ok := o.pop()
				if !ok {
					break
				}
				got = append(got, it.origin.Seq)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("out came %v, want %v", got, tc.want)
			}
			if d := value(m.dropped.WithLabelValues(dropBufferFull)); d != tc.dropped {
				t.Fatalf("dropped %v, want %v", d, tc.dropped)
			}
			if n, b := o.depth(); n != 0 || b != 0 {
				t.Fatalf("empty outbox reports %d batches, %d bytes", n, b)
			}
		})
	}
}
