package datalayer

import (
	"fmt"
	"testing"
)

func TestCandidateKeepsEveryKeyItIsGiven(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 3, 4, 9} {
		t.Run(fmt.Sprintf("%d keys, each set twice, read back with their last values", n), func(t *testing.T) {
			t.Parallel()
			c := NewCandidate(ep("e", "10.0.0.1:8000"), Metrics{}, StreamExact)
			for round := range 2 {
				for k := range n {
					c.Put(fmt.Sprintf("k%d", k), round*100+k)
				}
			}
			for k := range n {
				if v, ok := c.Get(fmt.Sprintf("k%d", k)); !ok || v != 100+k {
					t.Errorf("k%d = %v, %v; want %d", k, v, ok, 100+k)
				}
			}
			if v, ok := c.Get("absent"); ok {
				t.Errorf("absent key read as %v", v)
			}
		})
	}
}

func TestCandidatePutOfAFewKeysDoesNotAllocate(t *testing.T) {
	base := NewCandidate(ep("e", "10.0.0.1:8000"), Metrics{}, StreamExact)
	var c Candidate
	var v any = []uint64{1}
	// The default configuration's producers publish four keys per
	// candidate: the block keys, the prefix match, and the latency
	// prediction and its input. Each run starts from an empty candidate,
	// so that every Put is a new key.
	allocs := testing.AllocsPerRun(100, func() {
		base.StageInto(&c)
		c.Put("a", v)
		c.Put("b", v)
		c.Put("c", v)
		c.Put("d", v)
		_, _ = c.Get("b")
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run of four Puts of new keys, want 0", allocs)
	}
}
