package testkit

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATS is an embedded nats-server on loopback that a test can restart on
// the same port and store, as a NATS pod restart would.
type NATS struct {
	Server *server.Server
	// Port is the client port, kept across restarts.
	Port int
	// InProcess makes Connect use an in-process connection instead of TCP.
	InProcess bool
	dir       string
	options   func(*server.Options)
}

// NATSOptions shape a NATS server.
type NATSOptions struct {
	// JetStream enables JetStream with a store in a temporary directory.
	JetStream bool
	// InProcess: see NATS.InProcess.
	InProcess bool
	// Configure, when set, edits the server options before each start
	// (accounts, users, authorization).
	Configure func(*server.Options)
}

// StartNATS starts a server that lives until the test ends.
func StartNATS(t testing.TB, o NATSOptions) *NATS {
	t.Helper()
	n := &NATS{InProcess: o.InProcess, options: o.Configure}
	if o.JetStream {
		n.dir = t.TempDir()
	}
	n.start(t)
	n.Port = n.Server.Addr().(*net.TCPAddr).Port
	t.Cleanup(n.shutdown)
	return n
}

func (n *NATS) start(t testing.TB) {
	t.Helper()
	opts := &server.Options{
		Host:                  "127.0.0.1",
		Port:                  n.Port,
		NoLog:                 true,
		NoSigs:                true,
		MaxPayload:            8 << 20,
		DisableShortFirstPing: true,
	}
	if n.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	if n.dir != "" {
		opts.JetStream = true
		opts.StoreDir = n.dir
	}
	if n.options != nil {
		n.options(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("new NATS server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(WaitLimit) {
		t.Fatal("NATS server not ready")
	}
	n.Server = s
}

func (n *NATS) shutdown() {
	n.Server.Shutdown()
	n.Server.WaitForShutdown()
}

// Stop shuts the server down, as a NATS pod that died would be; Start
// brings it back.
func (n *NATS) Stop() { n.shutdown() }

// Start starts a new server on the stopped one's port and store.
func (n *NATS) Start(t testing.TB) {
	t.Helper()
	n.start(t)
}

// Restart is Stop then Start.
func (n *NATS) Restart(t testing.TB) {
	t.Helper()
	n.Stop()
	n.Start(t)
}

// URL is the server's client URL.
func (n *NATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.Port) }

// Connect is a client that reconnects forever and quickly, closed when the
// test ends; opts are added to (and may override) its defaults.
func (n *NATS) Connect(t testing.TB, name string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(20 * time.Millisecond),
		nats.ReconnectJitter(0, 0),
		// The default handler prints slow-consumer errors to stderr.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	}
	if n.InProcess {
		all = append(all, nats.InProcessServer(n.Server))
	}
	nc, err := nats.Connect(n.URL(), append(all, opts...)...)
	if err != nil {
		t.Fatalf("connect to NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}
