package readmostly_test

import (
	"fmt"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer/readmostly"
)

func TestGetOrAddKeepsOneValueAKeyUpToTheLimit(t *testing.T) {
	t.Parallel()
	var l readmostly.List[string, *int]
	made := 0
	newV := func() *int { made++; v := made; return &v }
	a := l.GetOrAdd("a", 2, newV)
	if again := l.GetOrAdd("a", 2, newV); again != a || made != 1 {
		t.Fatalf("a again: %p (made %d), want %p made once", again, made, a)
	}
	b := l.GetOrAdd("b", 2, newV)
	if b == a || *b != 2 {
		t.Fatalf("b = %d, want a value of its own", *b)
	}
	// Full: c's value is its own each time, and not kept.
	c1, c2 := l.GetOrAdd("c", 2, newV), l.GetOrAdd("c", 2, newV)
	if c1 == c2 || made != 4 {
		t.Fatalf("c beyond the limit: %p, %p (made %d), want two values of their own", c1, c2, made)
	}
	if _, ok := l.Get("c"); ok {
		t.Fatal("c kept beyond the limit")
	}
	if got, ok := l.Get("b"); !ok || got != b {
		t.Fatalf("Get(b) = %v, %v", got, ok)
	}
}

// Readers racing with additions see each key's one value (run with -race).
func TestConcurrentReadersAndAdditionsAgree(t *testing.T) {
	t.Parallel()
	var l readmostly.List[int, string]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 100 {
				k := (g + i) % 20
				if v := l.GetOrAdd(k, 0, func() string { return fmt.Sprint(k) }); v != fmt.Sprint(k) {
					t.Errorf("key %d: %q", k, v)
				}
			}
		})
	}
	wg.Wait()
	for k := range 20 {
		if v, ok := l.Get(k); !ok || v != fmt.Sprint(k) {
			t.Errorf("Get(%d) = %q, %v", k, v, ok)
		}
	}
}
