package natscallout

import (
	"crypto/sha256"
	"sync"
	"time"
)

// reviewCache remembers the identities the API server vouched for, keyed
// by a hash of the token (the token itself is never kept), until each
// token expires. A client that reconnects is admitted from it without a
// review, so a flood of connects that spends the review budget does not
// lock out the clients already known.
type reviewCache struct {
	mu      sync.Mutex
	max     int
	entries map[[sha256.Size]byte]cached
}

type cached struct {
	id      Identity
	expires time.Time
}

func newReviewCache(max int) *reviewCache {
	return &reviewCache{max: max, entries: make(map[[sha256.Size]byte]cached)}
}

func tokenKey(token string) [sha256.Size]byte { return sha256.Sum256([]byte(token)) }

// get returns the identity reviewed for token, if it has not expired at now.
func (c *reviewCache) get(token string, now time.Time) (Identity, bool) {
	k := tokenKey(token)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[k]
	if !ok {
		return Identity{}, false
	}
	if !now.Before(e.expires) {
		delete(c.entries, k)
		return Identity{}, false
	}
	return e.id, true
}

// put remembers id for token until expires. When full it drops the
// expired entries, and then the one closest to its expiry: at most max
// entries are ever held.
func (c *reviewCache) put(token string, id Identity, expires, now time.Time) {
	if c.max <= 0 || !now.Before(expires) {
		return
	}
	k := tokenKey(token)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; !ok && len(c.entries) >= c.max {
		var soonest [sha256.Size]byte
		var soonestAt time.Time
		for ek, e := range c.entries {
			if !now.Before(e.expires) {
				delete(c.entries, ek)
				continue
			}
			if soonestAt.IsZero() || e.expires.Before(soonestAt) {
				soonest, soonestAt = ek, e.expires
			}
		}
		if len(c.entries) >= c.max {
			delete(c.entries, soonest)
		}
	}
	c.entries[k] = cached{id: id, expires: expires}
}

// forget drops token's entry: its pod is gone or left the pool.
func (c *reviewCache) forget(token string) {
	k := tokenKey(token)
	c.mu.Lock()
	delete(c.entries, k)
	c.mu.Unlock()
}

func (c *reviewCache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}
