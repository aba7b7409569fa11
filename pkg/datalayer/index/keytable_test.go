package index

import (
	"maps"
	"math/rand/v2"
	"testing"
)

// checkKeyTable compares t with the model and checks that every key is
// reachable from its home slot without crossing an empty one.
func checkKeyTable(tb testing.TB, t *keyTable, model map[uint64]uint64) {
	tb.Helper()
	if t.len() != len(model) {
		tb.Fatalf("len %d, model holds %d", t.len(), len(model))
	}
	for k, want := range model {
		if got, ok := t.get(k); !ok || got != want {
			tb.Fatalf("get(%#x) = %#x, %v; want %#x", k, got, ok, want)
		}
	}
	if got := maps.Collect(t.all()); !maps.Equal(got, model) {
		tb.Fatalf("all() yields %d keys unlike the model's %d", len(got), len(model))
	}
	if n := len(t.slots); n > 0 {
		mask := uint64(n - 1)
		for i, s := range t.slots {
			if s.key == 0 {
				continue
			}
			for j := t.home(s.key) & mask; j != uint64(i); j = (j + 1) & mask {
				if t.slots[j].key == 0 {
					tb.Fatalf("key %#x in slot %d lies past an empty slot %d", s.key, i, j)
				}
			}
		}
		// The zero key is kept aside, in no slot.
		slotted := len(model)
		if _, ok := model[0]; ok {
			slotted--
		}
		if slotted*keyTableMaxLoadDen > n*keyTableMaxLoadNum {
			tb.Fatalf("%d keys in %d slots: over the maximum load", slotted, n)
		}
	}
}

func TestKeyTableFollowsAMap(t *testing.T) {
	t.Parallel()
	for _, space := range []uint64{8, 64, 4096} {
		rng := rand.New(rand.NewPCG(space, 1))
		tab, model := newKeyTable(), map[uint64]uint64{}
		for i := range 20000 {
			// Keys from a small space, zero included, so that the same
			// keys come back: updates, removals of absent keys, regrowth.
			k := rng.Uint64N(space)
			if rng.IntN(2) == 0 {
				k = k<<40 | k // keys that differ only in high bits
			}
			switch op := rng.IntN(10); {
			case op < 6:
				v := rng.Uint64()
				tab.set(k, v)
				model[k] = v
			default:
				tab.del(k)
				delete(model, k)
			}
			if i%97 == 0 {
				checkKeyTable(t, &tab, model)
			}
		}
		for k := range model {
			tab.del(k)
			delete(model, k)
		}
		checkKeyTable(t, &tab, model)
		if len(tab.slots) > keyTableMinSlots {
			t.Errorf("empty table kept %d slots", len(tab.slots))
		}
	}
}

// TestKeyTableRunsWrapAndShiftBack fills one table with keys of chosen
// homes, so that runs cross the end of the array and removal in the middle
// of a run must move later keys back past the wrap.
func TestKeyTableRunsWrapAndShiftBack(t *testing.T) {
	t.Parallel()
	tab, model := newKeyTable(), map[uint64]uint64{}
	tab.resize(64)
	mask := uint64(63)
	byHome := map[uint64][]uint64{}
	for k := uint64(1); len(byHome[62]) < 3 || len(byHome[63]) < 3 || len(byHome[0]) < 2; k++ {
		if h := tab.home(k) & mask; h >= 62 || h == 0 {
			byHome[h] = append(byHome[h], k)
		}
	}
	for _, h := range []uint64{62, 63, 0} {
		for _, k := range byHome[h][:2] {
			tab.set(k, k*3)
			model[k] = k * 3
		}
	}
	checkKeyTable(t, &tab, model)
	for _, k := range []uint64{byHome[62][0], byHome[63][1], byHome[0][0]} {
		tab.del(k)
		delete(model, k)
		checkKeyTable(t, &tab, model)
	}
}

// FuzzKeyTable runs operations read from the input against a map.
func FuzzKeyTable(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0, 0, 0, 128, 0, 129, 0, 130, 1, 0, 1, 128})
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, model := newKeyTable(), map[uint64]uint64{}
		for i := 0; i+1 < len(data); i += 2 {
			op, b := data[i], data[i+1]
			k := uint64(b&63) | uint64(b>>6)<<60
			if op%3 == 2 {
				tab.del(k)
				delete(model, k)
			} else {
				tab.set(k, uint64(op))
				model[k] = uint64(op)
			}
		}
		checkKeyTable(t, &tab, model)
	})
}

// BenchmarkKeyTableGet reads random keys of a large table, as a request's
// lookup does: mostly cache misses.
func BenchmarkKeyTableGet(b *testing.B) {
	const n = 1 << 20
	tab := newKeyTable()
	keys := make([]uint64, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range keys {
		keys[i] = rng.Uint64() | 1
		tab.set(keys[i], uint64(i))
	}
	m := make(map[uint64]uint64, n)
	for i, k := range keys {
		m[k] = uint64(i)
	}
	b.Run("keyTable", func(b *testing.B) {
		var sum uint64
		for i := 0; b.Loop(); i++ {
			v, _ := tab.get(keys[(i*7919)&(n-1)])
			sum += v
		}
		b.ReportMetric(100*float64(tab.len())/float64(len(tab.slots)), "%load")
		_ = sum
	})
	b.Run("map", func(b *testing.B) {
		var sum uint64
		for i := 0; b.Loop(); i++ {
			sum += m[keys[(i*7919)&(n-1)]]
		}
		_ = sum
	})
}
