//go:build !amd64 && !arm64

package index

// prefetch does nothing where no prefetch instruction is wired up.
func prefetch(addrs []uintptr) {}
