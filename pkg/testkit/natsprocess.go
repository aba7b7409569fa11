package testkit

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// natsEnv marks a run of the test binary as a NATS server's process.
const natsEnv = "KVROUTE_TEST_NATS_PROCESS"

// NATSProcess is a nats-server on loopback in a process of its own (this
// test binary run again): its CPU is not the test's, as a NATS pod's is
// not an EPP's, so that a benchmark reading its own CPU (CPUTime) counts
// the clients' work alone.
type NATSProcess struct {
	child *Child
	url   string
}

type natsHello struct {
	URL string `json:"url"`
}

// StartNATSProcess starts a NATS server in a process of its own that
// lives until the test ends. The binary's TestMain must call MainNATS
// first.
func StartNATSProcess(tb testing.TB) *NATSProcess {
	tb.Helper()
	var h natsHello
	c := StartChild(tb, natsEnv, "1", &h)
	return &NATSProcess{child: c, url: h.URL}
}

// URL is the server's client URL.
func (p *NATSProcess) URL() string { return p.url }

// Pid is the server's process id.
func (p *NATSProcess) Pid() int { return p.child.Pid() }

// Stats are the server process's CPU, collector and allocation totals now.
func (p *NATSProcess) Stats() (ProcessStats, error) { return p.child.Stats() }

// MainNATS runs this process as a NATS server when it was started as one
// (StartNATSProcess), and returns at once otherwise.
func MainNATS() {
	if os.Getenv(natsEnv) == "" {
		return
	}
	if err := runNATS(); err != nil {
		fmt.Fprintln(os.Stderr, "NATS process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runNATS() error {
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		MaxPayload: 8 << 20, DisableShortFirstPing: true,
	})
	if err != nil {
		return err
	}
	go s.Start()
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	if !s.ReadyForConnections(WaitLimit) {
		return fmt.Errorf("not ready within %v", WaitLimit)
	}
	return ServeChild(os.Stdin, os.Stdout, natsHello{URL: s.ClientURL()}, func(op string, _ json.RawMessage) (any, error) {
		return nil, fmt.Errorf("no op %q", op)
	})
}
