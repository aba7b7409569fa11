//go:build unix

package tokenizer

import (
	"syscall"
	"time"
)

// cpuTime is the process's CPU time so far. Benchmarks report tokens per
// CPU-second beside tokens per wall-second, since on a shared machine the
// wall clock also counts time spent waiting for a core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
