// Package testkit is what the tests of every package share: waiting for an
// observable condition instead of sleeping, loopback addresses, the
// process's CPU time and collector totals, the test binary run again as a
// server of its own (Child), metric values read from a registry, and an
// embedded NATS server that can be restarted on its port and store. Its
// subpackages are the larger rigs: an Envoy-like ext_proc client (envoy)
// and a whole EPP fed by simulated engines (fleet).
//
// Only tests and benchmarks import it; `make lint` fails if a package a
// binary links does.
package testkit

import (
	"bytes"
	"context"
	"errors"
	"net"
	"runtime"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// WaitLimit bounds every wait. It is a deadlock guard, not a timing
// assertion: on a loaded machine things take long, never this long.
const WaitLimit = 20 * time.Second

// WaitFor polls cond until it returns nil, failing the test after
// WaitLimit with what it waited for and cond's last error. The error says
// what cond saw ("applied 4 of 6 batches"), so a wait that times out
// explains itself instead of only saying that it did.
func WaitFor(t testing.TB, what string, cond func() error) {
	t.Helper()
	waitFor(t, what, WaitLimit, cond)
}

func waitFor(t testing.TB, what string, limit time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last saw: %v", limit, what, err)
			return // a Fatalf that does not stop the goroutine must not loop on
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// FreeAddr is a loopback address nothing listens on at the moment of the
// call, for a server that must be told its address before it starts.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// LogBuffer is a log sink that a component's goroutines and the test may
// use at once.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// SettledGoroutines waits for the number of goroutines to fall to target,
// or, with target 0, to stop changing, and returns it: a test compares the
// count after shutdown with the count before.
func SettledGoroutines(target int) int {
	n := runtime.NumGoroutine()
	for range 100 {
		if target > 0 && n <= target {
			return n
		}
		time.Sleep(20 * time.Millisecond)
		m := runtime.NumGoroutine()
		if target == 0 && m == n {
			return n
		}
		n = m
	}
	return n
}

// Go runs run with a context that ends when the test does, and waits for
// it to return then: the owner of a component's Run in a test. An error
// other than the context's own fails the test.
func Go(t testing.TB, what string, run func(ctx context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("%s: %v", what, err)
			}
		case <-time.After(WaitLimit):
			t.Errorf("%s did not return within %v of its context's end", what, WaitLimit)
		}
	})
}

// LiveHeap is the bytes of live heap objects, read after two collections:
// what sync.Pools (gRPC's buffers among them) hold survives one collection
// in their victim caches and is garbage only after the second.
func LiveHeap() int64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return int64(s[0].Value.Uint64())
}
