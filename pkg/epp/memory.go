package epp

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
)

// The memory the index may take, as sizing rules: the index gets half of
// what the process may use, at BytesPerHolding per holding. 57 bytes per
// holding is measured (docs/benchmarks.md, BenchmarkIndexMemory); the rest
// is room for a stream's handle map to double and for the batch in flight.
const (
	BytesPerHolding  = 96
	indexMemoryShare = 2
	// fallbackMemory is what the process is assumed to have when neither
	// GOMEMLIMIT nor a container limit says.
	fallbackMemory = 4 << 30
	// maxQueuedShare bounds the consumer's queued payloads at a sixteenth
	// of memory.
	maxQueuedShare = 16
	// bodyMemoryShare is the request bodies' share of memory, at their
	// decoded size (openai.DecodedBytesPerBodyByte): an eighth, for
	// ext_proc and for the proxy each.
	bodyMemoryShare = 8
	// streamMemoryShare and BytesPerStream bound ext_proc's open streams:
	// a sixteenth of memory, at 32 KiB a stream (its goroutine's stack,
	// gRPC's stream state, the header map; TestNeverEndingBodiesAndHeader
	// OnlyStreamsStayWithinTheBudget measures 25 to 29 KiB a stream, both
	// ends of it counted).
	streamMemoryShare = 16
	BytesPerStream    = 32 << 10
	// connMemoryShare bounds ext_proc's open connections: a sixty-fourth
	// of memory at extproc.ConnBytes a connection, at least minConns.
	connMemoryShare = 64
	minConns        = 64
)

// RequestPathBudgets are the request path's default bounds for a process
// that may use memory bytes: the body bytes ext_proc (and the proxy) may
// hold, at least one largest body at its decoded size, and the streams
// ext_proc may hold open. For the chart's 2 GiB: 256 MiB and 4096 streams.
func RequestPathBudgets(memory int64, maxBodyBytes int) (bodyBytes int64, streams int) {
	bodyBytes = max(memory/bodyMemoryShare, int64(maxBodyBytes)*openai.DecodedBytesPerBodyByte)
	streams = int(max(memory/streamMemoryShare/BytesPerStream, 256))
	return bodyBytes, streams
}

// ExtProcConns is the default bound on ext_proc's open connections for a
// process that may use memory bytes. For the chart's 2 GiB: 256.
func ExtProcConns(memory int64) int {
	return int(max(memory/connMemoryShare/extproc.ConnBytes, minConns))
}

// MemoryBudget is the memory the process may use and where that figure
// comes from: GOMEMLIMIT when set, else the container's cgroup limit, else
// a fixed fallback.
func MemoryBudget() (bytes int64, source string) {
	if lim := debug.SetMemoryLimit(-1); lim > 0 && lim < math.MaxInt64 {
		return lim, "GOMEMLIMIT"
	}
	if lim, ok := cgroupLimit(); ok {
		return lim, "cgroup"
	}
	return fallbackMemory, "default"
}

// cgroupLimit reads the memory limit of the process's cgroup, v2 first
// (memory.max), then v1 (memory.limit_in_bytes); ok is false when there is
// none (a v1 "unlimited" is a number near 2^63).
func cgroupLimit() (int64, bool) {
	for _, path := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		data, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := strings.TrimSpace(string(data))
		if s == "max" {
			return 0, false
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// DefaultMaxHoldings is the index's holding bound for a process that may
// use memory bytes.
func DefaultMaxHoldings(memory int64) int {
	return int(max(memory/indexMemoryShare/BytesPerHolding, 1<<16))
}
