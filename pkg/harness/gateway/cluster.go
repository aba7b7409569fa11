package gateway

import (
	"context"
	"crypto/tls"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// Host is one ext_proc server of the gateway's ext_proc cluster: an EPP
// replica.
type Host struct {
	// Name labels the host in metrics and answers; ExtProcAddr when empty.
	Name        string
	ExtProcAddr string
	// HealthAddr serves the gRPC health service on a port of its own (the
	// EPP's --grpc-health-port); ExtProcAddr's own when empty.
	HealthAddr string
	// TLS dials ext_proc over TLS without verifying the certificate, as
	// the inference extension's Envoy configurations accept the EPP's
	// self-signed one; the health port is plaintext either way.
	TLS bool
}

// HealthCheck is the ext_proc cluster's active gRPC health check, as
// Envoy's grpc_health_check: a host is taken out after Unhealthy failed
// checks in a row and put back after Healthy passed ones. A host starts
// out of rotation until its first check passes.
type HealthCheck struct {
	// Interval between checks (1s when zero); Timeout of one (the
	// interval when zero).
	Interval, Timeout time.Duration
	// Unhealthy and Healthy thresholds (2 and 1 when zero).
	Unhealthy, Healthy int
	// Service is the health service name checked (the ext_proc service's
	// name, as the EPPs serve it, when empty).
	Service string
}

func (h HealthCheck) withDefaults() HealthCheck {
	if h.Interval <= 0 {
		h.Interval = time.Second
	}
	if h.Timeout <= 0 {
		h.Timeout = h.Interval
	}
	if h.Unhealthy <= 0 {
		h.Unhealthy = 2
	}
	if h.Healthy <= 0 {
		h.Healthy = 1
	}
	if h.Service == "" {
		h.Service = extproc.HealthExtProc
	}
	return h
}

// HostStatus is a host as the cluster sees it now.
type HostStatus struct {
	Host
	Healthy bool
	// Streams is how many ext_proc streams it has been given, Active how
	// many are open now.
	Streams, Active int64
}

type host struct {
	Host
	conn, hconn *grpc.ClientConn
	client      extprocv3.ExternalProcessorClient
	health      healthpb.HealthClient

	healthy         atomic.Bool
	streams, active atomic.Int64
	// passes and fails count checks in a row, on the checker's goroutine.
	passes, fails int

	stop context.CancelFunc
	done chan struct{}
}

// cluster is the ext_proc cluster: its hosts, round-robin over the
// healthy ones.
type cluster struct {
	hc  HealthCheck
	m   *metrics
	mu  sync.Mutex
	all []*host
	rr  atomic.Uint64
}

func dial(addr string, useTLS bool) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if useTLS {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the EPP's certificate is self-signed
	}
	return grpc.NewClient(addr, grpc.WithTransportCredentials(creds), experimental.WithBufferPool(extproc.BufferPool()))
}

// add dials h and starts checking its health.
func (c *cluster) add(h Host) error {
	if h.Name == "" {
		h.Name = h.ExtProcAddr
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, o := range c.all {
		if o.Name == h.Name {
			return fmt.Errorf("gateway: %w: %s", ErrHostExists, h.Name)
		}
	}
	conn, err := dial(h.ExtProcAddr, h.TLS)
	if err != nil {
		return fmt.Errorf("gateway: dial ext_proc host %s: %w", h.Name, err)
	}
	nh := &host{Host: h, conn: conn, hconn: conn, client: extprocv3.NewExternalProcessorClient(conn), done: make(chan struct{})}
	if h.HealthAddr != "" && h.HealthAddr != h.ExtProcAddr {
		if nh.hconn, err = dial(h.HealthAddr, false); err != nil {
			_ = conn.Close()
			return fmt.Errorf("gateway: dial health port of %s: %w", h.Name, err)
		}
	}
	nh.health = healthpb.NewHealthClient(nh.hconn)
	ctx, cancel := context.WithCancel(context.Background())
	nh.stop = cancel
	c.all = append(c.all, nh)
	c.m.hostHealthy(nh.Name, false)
	go c.check(ctx, nh)
	return nil
}

// remove takes the host out and closes its connections: streams still
// open on it end.
func (c *cluster) remove(name string) error {
	c.mu.Lock()
	i := slices.IndexFunc(c.all, func(h *host) bool { return h.Name == name })
	if i < 0 {
		c.mu.Unlock()
		return fmt.Errorf("gateway: %w: %s", ErrUnknownHost, name)
	}
	h := c.all[i]
	c.all = slices.Delete(c.all, i, i+1)
	c.mu.Unlock()
	h.close()
	c.m.forgetHost(name)
	return nil
}

func (h *host) close() {
	h.stop()
	<-h.done
	_ = h.conn.Close()
	if h.hconn != h.conn {
		_ = h.hconn.Close()
	}
}

func (c *cluster) closeAll() {
	c.mu.Lock()
	all := c.all
	c.all = nil
	c.mu.Unlock()
	for _, h := range all {
		h.close()
	}
}

// check runs h's health checks until ctx ends.
func (c *cluster) check(ctx context.Context, h *host) {
	defer close(h.done)
	t := time.NewTicker(c.hc.Interval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, c.hc.Timeout)
		r, err := h.health.Check(cctx, &healthpb.HealthCheckRequest{Service: c.hc.Service})
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			h.fails = 0
			h.passes++
			if !h.healthy.Load() && h.passes >= c.hc.Healthy {
				c.setHealthy(h, true)
			}
		} else {
			h.passes = 0
			h.fails++
			if h.healthy.Load() && h.fails >= c.hc.Unhealthy {
				c.setHealthy(h, false)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *cluster) setHealthy(h *host, ok bool) {
	if h.healthy.Swap(ok) != ok {
		c.m.hostHealthy(h.Name, ok)
	}
}

// eject takes a host whose stream could not be opened out of rotation at
// once (outlier detection on a local-origin failure); its health checks
// put it back.
func (c *cluster) eject(h *host) {
	c.setHealthy(h, false)
}

// pick is the next host round-robin over the healthy ones, skipping
// those in tried. Below half the hosts healthy, Envoy's panic threshold,
// every host is a candidate.
func (c *cluster) pick(tried []*host) (*host, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.all) == 0 {
		return nil, ErrNoHost
	}
	var healthy, candidates []*host
	for _, h := range c.all {
		if h.healthy.Load() {
			healthy = append(healthy, h)
		}
	}
	candidates = healthy
	if 2*len(healthy) < len(c.all) {
		candidates = c.all
	}
	if len(tried) > 0 {
		candidates = slices.DeleteFunc(slices.Clone(candidates), func(h *host) bool { return slices.Contains(tried, h) })
		if len(candidates) == 0 {
			return nil, ErrNoHost
		}
	}
	return candidates[int((c.rr.Add(1)-1)%uint64(len(candidates)))], nil
}

func (c *cluster) status() []HostStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]HostStatus, len(c.all))
	for i, h := range c.all {
		out[i] = HostStatus{Host: h.Host, Healthy: h.healthy.Load(), Streams: h.streams.Load(), Active: h.active.Load()}
	}
	return out
}
