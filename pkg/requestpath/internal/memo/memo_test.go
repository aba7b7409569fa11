package memo

import (
	"sync"
	"testing"
)

func TestAKeysValueIsMadeOnceAndShared(t *testing.T) {
	made := 0
	m := New(8, func(k string) *string { made++; v := k + "!"; return &v })
	a, b := m.Get("x"), m.Get("x")
	if a != b || *a != "x!" || made != 1 {
		t.Fatalf("got %p %q and %p, made %d times; want one value x!, made once", a, *a, b, made)
	}
}

func TestAFullMapForgetsEverythingBeforeKeepingANewKey(t *testing.T) {
	made := map[int]int{}
	m := New(3, func(k int) int { made[k]++; return k * 10 })
	for k := range 3 {
		m.Get(k)
	}
	if got := m.Get(3); got != 30 || m.Len() != 1 {
		t.Fatalf("Get(3) = %d with %d kept; want 30 with 1 kept", got, m.Len())
	}
	if m.Get(0); made[0] != 2 {
		t.Fatalf("key 0 made %d times; want it made again after the map was cleared", made[0])
	}
}

func TestConcurrentGetsAgreeOnEachKey(t *testing.T) {
	m := New(1024, func(k int) int { return k + 1 })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 200 {
				if v := m.Get((k + g) % 100); v != (k+g)%100+1 {
					t.Errorf("Get(%d) = %d", (k+g)%100, v)
					return
				}
			}
		}()
	}
	wg.Wait()
}
