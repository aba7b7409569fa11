package extproc_test

import (
	"os"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// TestMain lets the benchmarks' engines, EPPs and floor run in processes
// of their own (fleet.Options.EPPProcesses, envoy.StartFloorProcess): this
// binary, started again, is each of them.
func TestMain(m *testing.M) {
	fleet.Main()
	envoy.Main()
	os.Exit(m.Run())
}
