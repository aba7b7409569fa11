//go:build !unix

package scale

import "time"

// cpuTime is unknown here: the report's per-core figures read zero.
func cpuTime() time.Duration { return 0 }
