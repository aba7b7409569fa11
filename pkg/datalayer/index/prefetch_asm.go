//go:build amd64 || arm64

package index

// prefetch asks the processor to bring the cache line at each of addrs
// closer, without waiting for any. It reads nothing as far as Go is
// concerned (no value comes back, and a prefetch of any address, mapped or
// not, cannot fault), so an address that is stale or that another
// goroutine is writing is no data race. One call takes many: a call from
// Go costs the caller its registers.
//
//go:noescape
func prefetch(addrs []uintptr)
