package extproc

import "testing"

func TestTieredPoolSizesAndReuse(t *testing.T) {
	t.Parallel()
	p := &tieredPool{}
	for _, n := range []int{0, 1, 256, 257, 16 << 10, 16<<10 + 1, 64 << 10, 1 << 24, 1<<24 + 1} {
		b := p.Get(n)
		if len(*b) != n {
			t.Fatalf("Get(%d) has length %d", n, len(*b))
		}
		c := cap(*b)
		switch {
		case n > 1<<maxTier && c != n:
			t.Fatalf("Get(%d) beyond the tiers has capacity %d", n, c)
		case n <= 1<<maxTier && (c < n || c&(c-1) != 0 || c < 1<<minTier || c >= 2*max(n, 1<<minTier)):
			t.Fatalf("Get(%d) has capacity %d, want the next power of two from 256", n, c)
		}
		p.Put(b)
	}
	// A buffer put back is handed out again, resized; one of a foreign
	// capacity is never pooled.
	b := p.Get(3000)
	(*b)[0] = 7
	p.Put(b)
	again := p.Get(4096)
	if cap(*again) != 4096 || len(*again) != 4096 {
		t.Fatalf("reused buffer len %d cap %d", len(*again), cap(*again))
	}
	foreign := make([]byte, 5000)
	p.Put(&foreign)
	if got := p.Get(5000); &(*got)[0] == &foreign[0] {
		t.Fatal("a buffer of foreign capacity was pooled")
	}
}
