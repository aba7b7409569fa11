// Package readmostly is a keyed list read on every request and added to
// rarely: readers take no lock, and each addition is made to a copy, so
// that a reader holding the old list is never disturbed. It suits a few
// entries (a lookup is a scan), each added once and kept.
package readmostly

import (
	"sync"
	"sync/atomic"
)

// List maps keys to values. The zero List is empty and ready.
type List[K comparable, V any] struct {
	all atomic.Pointer[[]entry[K, V]]
	mu  sync.Mutex
}

type entry[K comparable, V any] struct {
	k K
	v V
}

// Get returns the value under k.
func (l *List[K, V]) Get(k K) (V, bool) {
	if all := l.all.Load(); all != nil {
		for i := range *all {
			if e := &(*all)[i]; e.k == k {
				return e.v, true
			}
		}
	}
	var zero V
	return zero, false
}

// GetOrAdd returns the value under k, else newV's, which it keeps under k
// while the list holds fewer than limit entries (limit 0: no bound);
// beyond that each call's value is its own. newV runs under the list's
// lock, once for each key kept.
func (l *List[K, V]) GetOrAdd(k K, limit int, newV func() V) V {
	if v, ok := l.Get(k); ok {
		return v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if v, ok := l.Get(k); ok {
		return v
	}
	v := newV()
	var old []entry[K, V]
	if p := l.all.Load(); p != nil {
		old = *p
	}
	if limit > 0 && len(old) >= limit {
		return v
	}
	next := make([]entry[K, V], len(old), len(old)+1)
	copy(next, old)
	next = append(next, entry[K, V]{k: k, v: v})
	l.all.Store(&next)
	return v
}
