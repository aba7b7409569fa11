package envoy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// floorEnv carries a floorSpec to the test binary run again as a floor's
// process (StartFloorProcess).
const floorEnv = "KVROUTE_FLOOR_PROCESS"

type floorSpec struct {
	Dest string
	Work time.Duration
}

type floorHello struct{ Addr string }

// FloorProcess is a Floor in a process of its own: the test binary run
// again, with nothing in its heap but the floor and its gRPC server. A
// benchmark measuring an EPP in a process of its own against it compares
// two processes alike but for the EPP: each pays its own collector for
// its own heap.
type FloorProcess struct {
	child *testkit.Child
	addr  string
}

// StartFloorProcess serves a working floor (StartWorkingFloor; work 0 is
// the plain floor) in a process of its own until the test ends. The
// binary's TestMain calls Main first.
func StartFloorProcess(tb testing.TB, dest string, work time.Duration) *FloorProcess {
	tb.Helper()
	spec, err := json.Marshal(floorSpec{Dest: dest, Work: work})
	if err != nil {
		tb.Fatal(err)
	}
	var hello floorHello
	c := testkit.StartChild(tb, floorEnv, string(spec), &hello)
	return &FloorProcess{child: c, addr: hello.Addr}
}

// Addr is the floor's listen address.
func (p *FloorProcess) Addr() string { return p.addr }

// Pid is the floor's process id.
func (p *FloorProcess) Pid() int { return p.child.Pid() }

// Stats are the floor process's CPU, collector and allocation totals now.
func (p *FloorProcess) Stats() (testkit.ProcessStats, error) { return p.child.Stats() }

// Main runs this process as a floor when it was started as one
// (StartFloorProcess), and returns at once otherwise. A package whose
// tests start floor processes calls it first in its TestMain.
func Main() {
	spec := os.Getenv(floorEnv)
	if spec == "" {
		return
	}
	if err := runFloor(spec); err != nil {
		fmt.Fprintln(os.Stderr, "floor process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runFloor(spec string) error {
	var fs floorSpec
	if err := json.Unmarshal([]byte(spec), &fs); err != nil {
		return fmt.Errorf("%s: %w", floorEnv, err)
	}
	// As the EPP's command does, so that both sides pool alike.
	experimental.SetDefaultBufferPool(extproc.BufferPool())
	f, err := listenFloor(fs.Dest, fs.Work)
	if err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(f.ln) }()
	err = testkit.ServeChild(os.Stdin, os.Stdout, floorHello{Addr: f.Addr()}, nil)
	f.srv.Stop()
	if serr := <-done; serr != nil && !errors.Is(serr, grpc.ErrServerStopped) && err == nil {
		err = serr
	}
	return err
}
