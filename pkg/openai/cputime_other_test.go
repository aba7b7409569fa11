//go:build !unix

package openai

import "time"

// cpuTime is unknown here; benchmarks then skip their per-CPU-second metrics.
func cpuTime() time.Duration { return 0 }
