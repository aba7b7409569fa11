// Package natsembed runs a NATS server inside the process: the standalone
// default of the EPP and the simulated fleet when no NATS URL is given, and
// the real server that tests talk to.
package natsembed

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configure an embedded server. The zero value listens on a random
// loopback port without JetStream.
type Options struct {
	// Host and Port of the client listener; Port 0 picks a random free port,
	// Port -1 disables the TCP listener (in-process connections only).
	Host string
	Port int
	// JetStream enables JetStream with its store in StoreDir (a temporary
	// directory, removed at Shutdown, when empty).
	JetStream bool
	StoreDir  string
	// MonitorPort, when non-zero, serves NATS monitoring (/varz, /connz, ...)
	// on Host; -1 picks a random port.
	MonitorPort int
	// ReadyTimeout bounds the wait for the server to accept connections
	// (default 10s).
	ReadyTimeout time.Duration
	// Name is the server's name (default "kvroute-embedded"); the members
	// of a cluster need names of their own.
	Name string
	// Cluster, when set, makes the server a member of a cluster.
	Cluster *Cluster
}

// Cluster joins a server to a NATS cluster: it listens for routes from the
// other members on Port and dials those in Routes. The members then pass
// each other's client URLs to their clients, which reconnect to any of them.
type Cluster struct {
	// Name is the cluster's name, the same on every member.
	Name string
	// Port is the route listener's, on the server's Host (0: a random port).
	Port int
	// Routes are the other members' route URLs (nats-route://host:port).
	Routes []string
}

// ErrNotReady is returned when the server does not accept connections in time.
var ErrNotReady = errors.New("embedded NATS server not ready")

// Server is a running embedded NATS server.
type Server struct {
	*server.Server
	tmpDir string
}

// Start starts a server and waits until it accepts connections.
func Start(o Options) (*Server, error) {
	if o.Host == "" {
		o.Host = "127.0.0.1"
	}
	port := o.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 10 * time.Second
	}
	if o.Name == "" {
		o.Name = "kvroute-embedded"
	}
	so := &server.Options{
		ServerName: o.Name,
		Host:       o.Host,
		Port:       port,
		DontListen: o.Port == -1,
		NoSigs:     true,
		NoLog:      true,
		JetStream:  o.JetStream,
		// Batches of a 32k-token prompt's blocks stay far below this, but a
		// burst of steps from a large engine can exceed NATS' 1 MiB default.
		MaxPayload: 8 << 20,
	}
	if o.MonitorPort != 0 {
		so.HTTPHost = o.Host
		so.HTTPPort = o.MonitorPort
		if o.MonitorPort == -1 {
			so.HTTPPort = server.RANDOM_PORT
		}
	}
	if c := o.Cluster; c != nil {
		so.Cluster = server.ClusterOpts{Name: c.Name, Host: o.Host, Port: c.Port}
		if c.Port == 0 {
			so.Cluster.Port = server.RANDOM_PORT
		}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil {
				return nil, fmt.Errorf("embedded NATS: route %q: %w", r, err)
			}
			so.Routes = append(so.Routes, u)
		}
	}
	s := &Server{}
	if o.JetStream {
		so.StoreDir = o.StoreDir
		if so.StoreDir == "" {
			dir, err := os.MkdirTemp("", "kvroute-nats-*")
			if err != nil {
				return nil, fmt.Errorf("embedded NATS: JetStream store: %w", err)
			}
			s.tmpDir, so.StoreDir = dir, dir
		}
	}
	ns, err := server.NewServer(so)
	if err != nil {
		s.cleanup()
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	s.Server = ns
	ns.Start()
	if !ns.ReadyForConnections(o.ReadyTimeout) {
		ns.Shutdown()
		s.cleanup()
		return nil, fmt.Errorf("%w after %s", ErrNotReady, o.ReadyTimeout)
	}
	return s, nil
}

// Shutdown stops the server, waits for it to finish, and removes a
// temporary JetStream store.
func (s *Server) Shutdown() {
	s.Server.Shutdown()
	s.Server.WaitForShutdown()
	s.cleanup()
}

func (s *Server) cleanup() {
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
	}
}
