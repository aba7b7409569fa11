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

func TestCandidateStagedWritesArePublishedOnlyWhenCommittedUnderTheirKeys(t *testing.T) {
	t.Parallel()
	keys := func(c *Candidate, names ...string) map[string]any {
		out := map[string]any{}
		for _, k := range names {
			if v, ok := c.Get(k); ok {
				out[k] = v
			}
		}
		return out
	}
	for _, tt := range []struct {
		name      string
		published int // keys p0.. Put before the stage
		commit    bool
		want      map[string]any
	}{
		{name: "committed: declared keys are published and replace what they shadow, the rest are dropped",
			published: 3, commit: true, want: map[string]any{"p0": 0, "p1": "new", "p2": 2, "s0": "s0", "s1": "s1", "s2": "s2", "s3": "s3"}},
		{name: "committed beside a full inline store: the spilled keys are kept",
			published: 5, commit: true, want: map[string]any{"p0": 0, "p1": "new", "p2": 2, "p3": 3, "p4": 4, "s0": "s0", "s1": "s1", "s2": "s2", "s3": "s3"}},
		{name: "discarded: what was published before is as it was",
			published: 3, commit: false, want: map[string]any{"p0": 0, "p1": 1, "p2": 2}},
		{name: "discarded from an empty candidate: nothing is left",
			published: 0, commit: false, want: map[string]any{}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := NewCandidate(ep("e", "10.0.0.1:8000"), Metrics{}, StreamExact)
			for k := range tt.published {
				c.Put(fmt.Sprintf("p%d", k), k)
			}
			c.Stage()
			c.Put("p1", "new") // shadows p1 (when published)
			for k := range 4 {
				c.Put(fmt.Sprintf("s%d", k), "first")
				c.Put(fmt.Sprintf("s%d", k), fmt.Sprintf("s%d", k))
			}
			c.Put("undeclared", true)
			if v, _ := c.Get("p1"); v != "new" {
				t.Errorf("while staged, p1 reads %v, want the staged write", v)
			}
			if tt.commit {
				c.CommitStaged([]string{"p1", "s0", "s1", "s2", "s3"})
			} else {
				c.DiscardStaged()
			}
			got := keys(c, "p0", "p1", "p2", "p3", "p4", "s0", "s1", "s2", "s3", "undeclared")
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("after the stage: %v, want %v", got, tt.want)
			}
			// Outside a stage, a Put overwrites in place again.
			c.Put("p0", "again")
			if v, _ := c.Get("p0"); v != "again" {
				t.Errorf("p0 = %v after a Put outside the stage, want again", v)
			}
		})
	}
}

func TestPrefixCacheInfoIsReadWhetherPublishedAsAValueOrAPointer(t *testing.T) {
	t.Parallel()
	want := PrefixCacheInfo{MatchBlocks: 3, TotalBlocks: 5, BlockSizeTokens: 16, MatchTokens: 48, State: StreamExact, Exact: true}
	for _, tc := range []struct {
		name string
		put  any // nil: nothing published
		ok   bool
	}{
		{"a value", want, true},
		{"a pointer", &want, true},
		{"a nil pointer", (*PrefixCacheInfo)(nil), false},
		{"another type", 3, false},
		{"nothing", nil, false},
	} {
		c := NewCandidate(ep("e", "10.0.0.1:8000"), Metrics{}, StreamExact)
		if tc.put != nil {
			c.Put(PrefixCacheMatchInfoKey, tc.put)
		}
		got, ok := PrefixCacheInfoOf(c)
		if ok != tc.ok || (ok && got != want) || (!ok && got != PrefixCacheInfo{}) {
			t.Errorf("%s: got %+v, %v; want %+v, %v", tc.name, got, ok, want, tc.ok)
		}
	}
}
