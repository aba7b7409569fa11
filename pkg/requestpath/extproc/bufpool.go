package extproc

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc/mem"
)

// tieredPool is the gRPC buffer pool of the ext_proc server: a sync.Pool
// for every power of two from 256 B to 16 MiB. gRPC's default pool jumps
// from 32 KiB to 1 MiB, so a 64 KiB body chunk would take a 1 MiB buffer,
// and it clears each buffer on every use: at 8k-token bodies, clearing was
// a fifth of the process's CPU. gRPC reads only the bytes it has written
// into a buffer, so an old buffer's contents are never seen, and this pool
// hands buffers out as they come back. (gRPC has such a "dirty" pool, but
// only internally.)
type tieredPool struct {
	tiers [maxTier - minTier + 1]sync.Pool
}

const (
	minTier = 8  // 256 B
	maxTier = 24 // 16 MiB
)

var (
	sharedPool                = &tieredPool{}
	_          mem.BufferPool = sharedPool
)

// tier is the smallest tier whose buffers hold n bytes.
func tier(n int) int {
	if n <= 1<<minTier {
		return minTier
	}
	return bits.Len(uint(n - 1))
}

// Get returns a buffer of length n; its contents are unspecified.
func (p *tieredPool) Get(n int) *[]byte {
	t := tier(n)
	if t > maxTier {
		b := make([]byte, n)
		return &b
	}
	if b, ok := p.tiers[t-minTier].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<t)
	return &b
}

// Put takes back a buffer that Get returned.
func (p *tieredPool) Put(b *[]byte) {
	c := cap(*b)
	t := tier(c)
	if c != 1<<t || t < minTier || t > maxTier {
		return // not one of ours: let the collector have it
	}
	p.tiers[t-minTier].Put(b)
}
