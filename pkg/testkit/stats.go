package testkit

import (
	"runtime/metrics"
	"time"
)

// ProcessStats are a process's running totals of CPU, collector work and
// allocation; a benchmark takes the difference over a stretch of work
// (Sub).
type ProcessStats struct {
	// CPU is user and system time (CPUTime).
	CPU time.Duration
	// GCCPU is the CPU the runtime counts as the collector's
	// (/cpu/classes/gc/total:cpu-seconds): the mark assists, the mark
	// workers' dedicated and idle time, and the pauses.
	GCCPU time.Duration
	// GCCycles are the collector cycles completed.
	GCCycles uint64
	// Allocs and AllocBytes are heap allocations, tiny ones included,
	// and their bytes.
	Allocs, AllocBytes uint64
}

// statNames are the runtime metrics ReadProcessStats samples, in the order
// it reads them.
var statNames = []string{
	"/cpu/classes/gc/total:cpu-seconds",
	"/gc/cycles/total:gc-cycles",
	"/gc/heap/allocs:objects",
	"/gc/heap/tiny/allocs:objects",
	"/gc/heap/allocs:bytes",
}

// ReadProcessStats reads this process's ProcessStats. Unlike
// runtime.ReadMemStats it does not stop the world.
func ReadProcessStats() ProcessStats {
	s := make([]metrics.Sample, len(statNames))
	for i, n := range statNames {
		s[i].Name = n
	}
	metrics.Read(s)
	return ProcessStats{
		CPU:        CPUTime(),
		GCCPU:      time.Duration(s[0].Value.Float64() * 1e9),
		GCCycles:   s[1].Value.Uint64(),
		Allocs:     s[2].Value.Uint64() + s[3].Value.Uint64(),
		AllocBytes: s[4].Value.Uint64(),
	}
}

// Sub is what s counts beyond an earlier reading o.
func (s ProcessStats) Sub(o ProcessStats) ProcessStats {
	return ProcessStats{
		CPU: s.CPU - o.CPU, GCCPU: s.GCCPU - o.GCCPU, GCCycles: s.GCCycles - o.GCCycles,
		Allocs: s.Allocs - o.Allocs, AllocBytes: s.AllocBytes - o.AllocBytes,
	}
}

// Add is the sum of s and o.
func (s ProcessStats) Add(o ProcessStats) ProcessStats {
	return ProcessStats{
		CPU: s.CPU + o.CPU, GCCPU: s.GCCPU + o.GCCPU, GCCycles: s.GCCycles + o.GCCycles,
		Allocs: s.Allocs + o.Allocs, AllocBytes: s.AllocBytes + o.AllocBytes,
	}
}
