//go:build !unix

package tokenizer

import "time"

// cpuTime is unknown here; the CPU-time metrics then read zero.
func cpuTime() time.Duration { return 0 }
