//go:build unix

package testkit

import (
	"syscall"
	"time"
)

// CPUTime is the process's CPU time so far. Benchmarks report work per
// CPU-second beside work per wall-second, since on a shared machine the wall
// clock also counts time spent waiting for a core.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
