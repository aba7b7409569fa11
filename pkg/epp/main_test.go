package epp

import (
	"os"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit"
)

// TestMain lets a benchmark's NATS server run in a process of its own
// (testkit.StartNATSProcess): this binary, started again, is that process.
func TestMain(m *testing.M) {
	testkit.MainNATS()
	os.Exit(m.Run())
}
