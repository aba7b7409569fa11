package datalayer

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
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
	c := NewCandidate(ep("e", "10.0.0.1:8000"), Metrics{}, StreamExact)
	var v any = []uint64{1}
	allocs := testing.AllocsPerRun(100, func() {
		c.Put("a", v)
		c.Put("b", v)
		c.Put("c", v)
		_, _ = c.Get("b")
	})
	if allocs != 0 {
		t.Errorf("%v allocations per run of three Puts, want 0", allocs)
	}
}

func TestGraphPublishesOnlyDeclaredKeysHoweverManyAreStaged(t *testing.T) {
	t.Parallel()
	// More keys than a candidate keeps inline, declared and not, from two
	// producers, the second reading the first's through its staging view.
	first := &keyProducer{name: "first", produces: produces("A", "B", "C", "D"), produce: func(_ context.Context, cands []*Candidate) error {
		for i, c := range cands {
			for k, key := range []string{"A", "B", "undeclared", "C", "D"} {
				c.Put(key, i*10+k)
			}
		}
		return nil
	}}
	second := derive("second", "E", func(in []int) int { return in[0] + in[1] }, "A", "D")
	g, err := BuildGraph([]plugin.Plugin{second, first})
	if err != nil {
		t.Fatal(err)
	}
	cands := testCandidates(5)
	if err := g.Run(context.Background(), time.Second, &request.Request{}, cands); err != nil {
		t.Fatal(err)
	}
	for i, c := range cands {
		for key, want := range map[string]int{"A": i * 10, "B": i*10 + 1, "C": i*10 + 3, "D": i*10 + 4, "E": 2*i*10 + 4} {
			if got, ok := getInt(c, key); !ok || got != want {
				t.Errorf("candidate %d: %s = %d, %v; want %d", i, key, got, ok, want)
			}
		}
		if v, ok := c.Get("undeclared"); ok {
			t.Errorf("candidate %d: an undeclared key was published (%v)", i, v)
		}
	}
}
