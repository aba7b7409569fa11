package tokenizer

import (
	"fmt"
	"reflect"
	"slices"
	"sync"
	"testing"
)

// hasPointers reports whether values of t hold pointers the collector
// must follow.
func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Map, reflect.String, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

func TestLoadedTablesHoldNoPointersInTheirElements(t *testing.T) {
	t.Parallel()
	// Each table is a few slices whose elements the collector never scans;
	// a pointer in any element type would make it scan them all.
	for _, typ := range []reflect.Type{
		reflect.TypeFor[strTable](), reflect.TypeFor[pairTable](), reflect.TypeFor[byteStrings](),
		reflect.TypeFor[wordShard](),
	} {
		for i := range typ.NumField() {
			f := typ.Field(i)
			if f.Type.Kind() == reflect.Slice && hasPointers(f.Type.Elem()) {
				t.Errorf("%s.%s holds %s, whose elements have pointers", typ.Name(), f.Name, f.Type)
			}
		}
	}
	tok := loadTiny(t, Options{})
	if tok.model.pending != nil {
		t.Error("the loaded model keeps its load-time token slices")
	}
}

func TestTablesFindWhatWasPutAndNothingElse(t *testing.T) {
	t.Parallel()
	const n = 5000
	st, pt := newStrTable(n, 8*n), newPairTable(n)
	for i := range n {
		st.put(fmt.Appendf(nil, "w%d", i), uint32(i))
		pt.put(pairKey(uint32(i), uint32(i+1)), merge{rank: uint32(i), id: uint32(2 * i)})
	}
	st.put([]byte("w7"), 99) // a second put keeps the first id
	pt.put(pairKey(7, 8), merge{rank: 1})
	pt.put(pairKey(0, 0), merge{rank: 5, id: 6})
	for i := range n {
		if id, ok := st.get(fmt.Sprintf("w%d", i)); !ok || id != uint32(i) {
			t.Fatalf("get(w%d) = %d, %v", i, id, ok)
		}
		if m, ok := pt.get(pairKey(uint32(i), uint32(i+1))); !ok || m != (merge{rank: uint32(i), id: uint32(2 * i)}) {
			t.Fatalf("pair %d = %+v, %v", i, m, ok)
		}
		if _, ok := st.get(fmt.Sprintf("x%d", i)); ok {
			t.Fatalf("found x%d, never put", i)
		}
		if _, ok := pt.get(pairKey(uint32(i+1), uint32(i))); ok && i > 0 {
			t.Fatalf("found the reversed pair %d", i)
		}
	}
	if m, ok := pt.get(pairKey(0, 0)); !ok || m.rank != 5 {
		t.Fatalf("pair (0, 0) = %+v, %v", m, ok)
	}
	if _, ok := st.get(""); ok {
		t.Fatal("found the empty string, never put")
	}
}

func TestWordCacheAnswersRightOrNotAtAllWhileShardsClear(t *testing.T) {
	t.Parallel()
	c := newWordCache(wordShards * 4) // four words a shard: clears often
	idsOf := func(w int) []uint32 {
		return []uint32{uint32(w), uint32(w) * 3, uint32(w) + 7}[:1+w%3]
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20000 {
				w := (i*7 + g) % 300
				word := fmt.Sprintf("word-%d", w)
				got, ok := c.appendIDs([]uint32{42}, word)
				if ok && !slices.Equal(got, append([]uint32{42}, idsOf(w)...)) {
					t.Errorf("%s: got %v, want 42 then %v", word, got, idsOf(w))
					return
				}
				if !ok {
					c.put(word, idsOf(w))
				}
			}
		})
	}
	wg.Wait()
	c.put("long", make([]uint32, maxCachedWord+1))
	if _, ok := c.appendIDs(nil, "long"); ok {
		t.Error("cached more ids than a word may have")
	}
}
