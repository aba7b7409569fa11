// Package memo keeps what the request path makes from a key and then
// shares, such as a model pair's metric series or a destination's answer
// messages: made on first use, read under a read lock after that, and
// bounded.
package memo

import "sync"

// Map holds the values made from keys. It is safe for concurrent use.
type Map[K comparable, V any] struct {
	make func(K) V
	max  int

	mu sync.RWMutex
	m  map[K]V
}

// New returns a Map that makes a key's value with make and keeps at most
// max values.
func New[K comparable, V any](max int, make func(K) V) *Map[K, V] {
	return &Map[K, V]{make: make, max: max, m: map[K]V{}}
}

// Get returns k's value, made on its first use. When the Map already
// keeps max values, it forgets all of them before keeping k's: keys that
// come and go (endpoints replaced over days) are forgotten together, and
// those still in use are made again once. Two callers that miss at once
// may both make a value; the later one is kept.
func (c *Map[K, V]) Get(k K) V {
	c.mu.RLock()
	v, ok := c.m[k]
	c.mu.RUnlock()
	if ok {
		return v
	}
	v = c.make(k)
	c.mu.Lock()
	if len(c.m) >= c.max {
		clear(c.m)
	}
	c.m[k] = v
	c.mu.Unlock()
	return v
}

// Len is how many values the Map keeps.
func (c *Map[K, V]) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.m)
}
