package extproc_test

import (
	"os"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// TestMain lets the benchmarks' fleet run in a process of its own
// (fleet.Options.Process): this binary, started again, is that process.
func TestMain(m *testing.M) {
	fleet.Main()
	os.Exit(m.Run())
}
