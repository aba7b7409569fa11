package fleet

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// childEnv carries a childSpec to the test binary run again as a fleet's
// process (Options.Process).
const childEnv = "KVROUTE_FLEET_PROCESS"

// childSpec is what the fleet's process needs to start its stand-ins.
type childSpec struct {
	Endpoints, BlockSize, GPUBlocks int
	Model                           string
	NATSURL, Namespace, Pool        string
}

// Main runs this process as a fleet's stand-ins or one of its EPPs when it
// was started as one (Options.Process, Options.EPPProcesses), and returns
// at once otherwise. A package whose tests
// use Options.Process calls it first in its TestMain.
func Main() {
	mainEPP()
	spec := os.Getenv(childEnv)
	if spec == "" {
		return
	}
	if err := runChild(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "fleet process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runChild starts the stand-ins spec asks for, writes their addresses as
// one JSON line to out, and serves until in ends (the parent closed it, or
// went away).
func runChild(spec string, in io.Reader, out io.Writer) error {
	var cs childSpec
	if err := json.Unmarshal([]byte(spec), &cs); err != nil {
		return fmt.Errorf("%s: %w", childEnv, err)
	}
	nc, err := nats.Connect(cs.NATSURL)
	if err != nil {
		return err
	}
	defer nc.Close()
	pub := events.NewPublisher(nc, cs.Namespace, cs.Pool)
	ctx, cancel := context.WithCancel(context.Background())
	var engines sync.WaitGroup
	failed := make(chan error, 1)
	fail := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	o := Options{Endpoints: cs.Endpoints, BlockSize: cs.BlockSize, GPUBlocks: cs.GPUBlocks, Model: cs.Model}
	var addrs []string
	for i := range o.Endpoints {
		ms, err := startServer(ctx, i, o, pub, &engines, fail)
		if err != nil {
			cancel()
			return err
		}
		defer ms.srv.Close()
		addrs = append(addrs, ms.Addr)
	}
	if err := json.NewEncoder(out).Encode(addrs); err != nil {
		cancel()
		return err
	}
	eof := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, in)
		close(eof)
	}()
	select {
	case <-eof:
	case err = <-failed:
	}
	cancel()
	engines.Wait()
	return err
}

// startProcess starts o's stand-ins in a process of their own, publishing
// to the NATS server at natsURL for namespace and pool, and returns their
// addresses; the process ends with the test.
func startProcess(t testing.TB, o Options, natsURL, namespace, pool string) []string {
	t.Helper()
	spec, err := json.Marshal(childSpec{
		Endpoints: o.Endpoints, BlockSize: o.BlockSize, GPUBlocks: o.GPUBlocks, Model: o.Model,
		NATSURL: natsURL, Namespace: namespace, Pool: pool,
	})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+string(spec))
	var logs testkit.LogBuffer
	cmd.Stderr = &logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("fleet process: %v\n%s", err, logs.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the fleet process did not stop within 10s of its stdin closing\n%s", logs.String())
		}
	})
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		t.Fatalf("fleet process: %v (is fleet.Main called from TestMain?)\n%s", err, logs.String())
	}
	var addrs []string
	if err := json.Unmarshal(line, &addrs); err != nil || len(addrs) != o.Endpoints {
		t.Fatalf("fleet process wrote %q, want %d addresses (%v)\n%s", line, o.Endpoints, err, logs.String())
	}
	return addrs
}
