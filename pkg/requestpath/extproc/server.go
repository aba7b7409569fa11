// Package extproc is the Envoy External Processing (ext_proc v3) server
// through which a gateway asks kvroute where each inference request goes.
// It speaks the Gateway API Inference Extension's endpoint picker protocol:
// the request body is gathered, the director picks, and the answer travels
// back both as the x-gateway-destination-endpoint header and as envoy.lb
// dynamic metadata; on the way back the response is passed through
// unchanged while its usage is read for accounting. A request without a
// body (a GET of /v1/models) goes, as upstream routes it, to a random ready
// endpoint within the subset hint.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/tap"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/internal/memo"
)

// Health service names, as the upstream EPP registers them.
const (
	HealthLiveness  = "liveness"
	HealthReadiness = "readiness"
	HealthExtProc   = "envoy.service.ext_proc.v3.ExternalProcessor"
)

// DefaultMaxBodyBytes bounds a request body when Options leave it zero.
const DefaultMaxBodyBytes = 16 << 20

// maxChunk is the largest body chunk sent back to Envoy: its docs recommend
// no more than 64 KiB per StreamedBodyResponse.
const maxChunk = 64 << 10

// BodyMode is how Envoy sends a body, when it does not say so itself in the
// stream's protocol_config.
type BodyMode int

const (
	// FullDuplexStreamed is the upstream EPP's mode: chunks arrive as they
	// come and go back as StreamedBodyResponses.
	FullDuplexStreamed BodyMode = iota
	// Buffered: Envoy sends the whole body in one message and waits for one
	// answer.
	Buffered
)

// Options configure a Server. The zero value listens on :9002 with a
// self-signed certificate, serves health on the same port and on none other,
// takes bodies up to 16 MiB, holds the Default* limits, and is always ready.
//
// What the server holds for its clients beyond the body budget is
// bounded by these options (docs/security.md states the sum): per
// connection, ConnBytes; per stream, its state, its header list (at most
// MaxHeaderListBytes), its window (WindowBytes) and, while a message
// larger than the window arrives, that message (at most MaxMessageBytes).
type Options struct {
	// Addr is the ext_proc listen address (":9002" when empty; port 0
	// picks a free one).
	Addr string
	// HealthAddr, when set, also serves the gRPC health service in
	// plaintext on its own listener, as upstream's --grpc-health-port does.
	// Health is always served on Addr as well.
	HealthAddr string
	// MaxBodyBytes bounds a request body; a larger one is refused with 413.
	MaxBodyBytes int
	// MaxInFlightBytes bounds the request bodies held at once over all
	// streams, each charged DecodedBytesPerBodyByte times its size while
	// it is routed, and the response bodies kept to read their usage
	// (DefaultMaxInFlightBytes when zero). A request past it is refused
	// with 503. Bodies still arriving in chunks may take half of it. It
	// must hold one body of MaxBodyBytes at its decoded size.
	MaxInFlightBytes int64
	// MaxStreams bounds the streams open at once over all connections
	// (DefaultMaxStreams when zero); one more ends at once with
	// ResourceExhausted.
	MaxStreams int
	// MaxStreamsPerConn is the streams one connection may have open, as
	// HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS (DefaultMaxStreamsPerConn
	// when zero).
	MaxStreamsPerConn int
	// BodyTimeout bounds a stream's request phase, from its start to its
	// request body's end (DefaultBodyTimeout when zero): past it the
	// request is answered 408 and the stream ends with DeadlineExceeded.
	// The response phase has no bound of the server's: responses stream
	// for as long as generation takes.
	BodyTimeout time.Duration
	// MaxConns bounds the connections open at once on Addr
	// (DefaultMaxConns when zero): one more is closed as soon as it is
	// accepted, before its TLS handshake.
	MaxConns int
	// WindowBytes is each stream's HTTP/2 receive window, fixed
	// (DefaultWindowBytes when zero; gRPC takes no less than 64 KiB): the
	// bytes a client may send on a stream before the server reads them.
	// A fixed window turns off gRPC's bandwidth-delay estimation, which
	// would grow every stream's window to 16 MiB.
	WindowBytes int
	// MaxMessageBytes bounds one gRPC message from Envoy, which gRPC
	// gathers whole before the server sees it. When zero: a body chunk
	// (at most DefaultMaxChunkBytes, Envoy's default buffer limit, or
	// MaxBodyBytes if less) plus MessageRoomBytes; with DefaultMode
	// Buffered, MaxBodyBytes plus MessageRoomBytes, as the whole body
	// comes in one message.
	MaxMessageBytes int
	// IdleTimeout closes a connection that has had no stream open for
	// that long (HTTP/2 GOAWAY; DefaultIdleTimeout when zero).
	IdleTimeout time.Duration
	// EmitEndpointScores adds every scored endpoint's weighted score to
	// the envoy.lb dynamic metadata, under
	// x-gateway-destination-endpoint-scores (address → score), as
	// upstream's --emit-endpoint-scores does. The scheduler must keep its
	// scores (scheduling.Options.KeepScores).
	EmitEndpointScores bool
	// DefaultMode is the body mode assumed when Envoy's first message
	// carries no protocol_config (older Envoys).
	DefaultMode BodyMode
	// Plaintext serves without TLS. Otherwise CertFile and KeyFile are
	// used, or, when they are empty, a self-signed certificate made at start.
	Plaintext         bool
	CertFile, KeyFile string
	// ClientCAFile turns on mutual TLS: only clients (gateways) whose
	// certificate this CA signed may open a stream. The key pair and the
	// CA are read again when their files change.
	ClientCAFile string
	// Ready gates the readiness health services; nil means always ready.
	Ready func() bool
	// ReadyPoll is how often Ready is asked (1s when zero).
	ReadyPoll time.Duration
	// ShutdownGrace bounds a graceful stop before streams are cut (5s when zero).
	ShutdownGrace time.Duration
	Logger        *slog.Logger
	// Registerer takes the server's metrics; nil means don't register.
	Registerer prometheus.Registerer
}

// BufferPool is the gRPC buffer pool the server uses; a client streaming
// large bodies benefits from it too (grpc/experimental.WithBufferPool).
func BufferPool() mem.BufferPool { return sharedPool }

// ServerOptions are the gRPC options every ext_proc server is built with,
// credentials aside: the benchmarks' do-nothing floor (pkg/testkit/envoy)
// is built with them too, so that the two differ only in what they do.
func ServerOptions() []grpc.ServerOption {
	return append([]grpc.ServerOption{
		experimental.BufferPool(BufferPool()),
		grpc.NumStreamWorkers(uint32(streamWorkersPerCPU * runtime.GOMAXPROCS(0))),
	}, windowOptions(DefaultWindowBytes)...)
}

// Server is the ext_proc gRPC server.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	d       director.Handler
	o       Options
	log     *slog.Logger
	m       *metrics
	grpc    *grpc.Server
	ln      net.Listener
	hgrpc   *grpc.Server
	hln     net.Listener
	health  *health.Server
	ranOnce sync.Once
	// failLog bounds the lines failed streams write: clients decide how
	// many fail.
	failLog *rate.Limiter

	// dests are the answer messages naming each destination (destination).
	dests *memo.Map[string, destination]

	budget  *budget
	streams *semaphore.Weighted
	workers workers
}

// New binds the listeners (so Addr is known before Run) and prepares TLS.
func New(d director.Handler, o Options) (*Server, error) {
	if d == nil {
		return nil, errors.New("extproc: a director is required")
	}
	if o.Addr == "" {
		o.Addr = ":9002"
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.MaxInFlightBytes <= 0 {
		o.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxStreamsPerConn <= 0 {
		o.MaxStreamsPerConn = DefaultMaxStreamsPerConn
	}
	o.MaxStreamsPerConn = min(o.MaxStreamsPerConn, math.MaxUint32)
	if o.BodyTimeout <= 0 {
		o.BodyTimeout = DefaultBodyTimeout
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.WindowBytes <= 0 {
		o.WindowBytes = DefaultWindowBytes
	}
	o.WindowBytes = min(max(o.WindowBytes, minWindowBytes), maxWindowBytes)
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes(o.MaxBodyBytes, o.DefaultMode)
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if int64(o.MaxBodyBytes)*DecodedBytesPerBodyByte > o.MaxInFlightBytes {
		return nil, fmt.Errorf("extproc: a body of %d bytes (the body limit) is charged %d bytes, more than the in-flight limit of %d: raise the limit or lower the body limit",
			o.MaxBodyBytes, int64(o.MaxBodyBytes)*DecodedBytesPerBodyByte, o.MaxInFlightBytes)
	}
	if o.ReadyPoll <= 0 {
		o.ReadyPoll = time.Second
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{d: d, o: o, log: o.Logger, m: newMetrics(o.Registerer), health: health.NewServer(),
		failLog: rate.NewLimiter(rate.Every(time.Second), 5), dests: memo.New(maxDestinations, newDestination),
		streams: semaphore.NewWeighted(int64(o.MaxStreams))}
	s.budget = newBudget(o.MaxInFlightBytes, s.m)

	opts := append(ServerOptions(), connOptions(o)...)
	opts = append(opts, grpc.InTapHandle(s.admitStream()))
	if o.Plaintext && o.ClientCAFile != "" {
		return nil, errors.New("extproc: a client CA needs TLS: plaintext and mutual TLS exclude each other")
	}
	if !o.Plaintext {
		files, err := newTLSFiles(o, s.m.tlsReloads, o.Logger)
		if err != nil {
			return nil, fmt.Errorf("extproc: %w", err)
		}
		opts = append(opts, grpc.Creds(credentials.NewTLS(files.serverConfig())))
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("extproc: listen on %s: %w", o.Addr, err)
	}
	s.ln = newLimitListener(ln, o.MaxConns, s.m)
	if o.HealthAddr != "" {
		hln, err := net.Listen("tcp", o.HealthAddr)
		if err != nil {
			_ = s.ln.Close()
			return nil, fmt.Errorf("extproc: listen for health on %s: %w", o.HealthAddr, err)
		}
		s.hln = newLimitListener(hln, healthMaxConns, nil)
		s.hgrpc = grpc.NewServer(healthOptions(o.IdleTimeout)...)
		healthpb.RegisterHealthServer(s.hgrpc, s.health)
	}
	s.grpc = grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s.grpc, s)
	healthpb.RegisterHealthServer(s.grpc, s.health)

	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.setReady(false)
	return s, nil
}

// Addr is the ext_proc listener's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// HealthAddr is the separate health listener's address, or "" when there is none.
func (s *Server) HealthAddr() string {
	if s.hln == nil {
		return ""
	}
	return s.hln.Addr().String()
}

func (s *Server) setReady(ready bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(HealthReadiness, st)
	s.health.SetServingStatus(HealthExtProc, st)
}

// Run serves until ctx is done, then stops gracefully: streams in flight
// get ShutdownGrace to finish before they are cut. It may be called once.
func (s *Server) Run(ctx context.Context) error {
	ran := false
	s.ranOnce.Do(func() { ran = true })
	if !ran {
		return errors.New("extproc: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, 2)
	serve := func(g *grpc.Server, ln net.Listener, what string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				errs <- fmt.Errorf("extproc: %s server: %w", what, err)
				cancel()
			}
		}()
	}
	// Started before any stream can come; stopped once none can.
	s.workers.start(streamWorkersPerCPU * runtime.GOMAXPROCS(0))
	defer s.workers.stop()
	serve(s.grpc, s.ln, "ext_proc")
	if s.hgrpc != nil {
		serve(s.hgrpc, s.hln, "health")
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.pollReady(ctx) }()

	<-ctx.Done()
	s.health.Shutdown()
	s.stop(s.grpc)
	if s.hgrpc != nil {
		s.hgrpc.Stop()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// Close releases the listeners of a server that will never Run.
func (s *Server) Close() {
	_ = s.ln.Close()
	if s.hln != nil {
		_ = s.hln.Close()
	}
}

// stop lets streams finish within the grace period, then cuts them.
func (s *Server) stop(g *grpc.Server) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	t := time.NewTimer(s.o.ShutdownGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		g.Stop()
		<-done
	}
}

func (s *Server) pollReady(ctx context.Context) {
	check := func() {
		s.setReady(s.o.Ready == nil || s.o.Ready())
	}
	check()
	t := time.NewTicker(s.o.ReadyPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			check()
		}
	}
}

// admitStream admits a new stream of any method under the stream cap,
// before gRPC creates it: gRPC reads a unary call's request (a health
// check's) before any handler or interceptor runs, so a cap taken in a
// handler would leave those streams uncounted. The stream gives its
// place back when its context ends, as gRPC ends it for every stream it
// closes.
func (s *Server) admitStream() tap.ServerInHandle {
	return admitUnder(s.streams, func() error {
		s.m.refused(refusedStreams)
		return streamsExhausted(s.o.MaxStreams)
	})
}

// Process serves one HTTP request's ext_proc stream, within the stream
// cap (admitStream) and the body deadline.
//
// Refusals follow what Envoy does with them. A request the server cannot
// take (its body too large: 413; over the byte budget: 503; its body late:
// 408) is answered with an ImmediateResponse, which Envoy sends to the
// client as it is, whatever failure_mode_allow says. A stream past the
// stream cap ends with ResourceExhausted before any message is read: it
// costs nothing to refuse, and Envoy then fails the request (500), or,
// with failure_mode_allow, lets it through unrouted.
func (s *Server) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	st := newStream(s, ps)
	done := make(chan error, 1)
	s.workers.do(func() { done <- st.run() })
	t := time.NewTimer(s.o.BodyTimeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	// Envoy closes the stream once it has the 408; a client that does
	// not is cut off by the status, which ends the stream's Recv.
	if st.phase.expire(func() {
		if !st.observing.Load() {
			_ = ps.Send(timeoutResponse(s.o.BodyTimeout))
		}
	}) {
		s.m.refused(refusedBodyTimout)
		return bodyDeadline(s.o.BodyTimeout)
	}
	return <-done
}

// streamWorkersPerCPU sizes the server's pool of stream goroutines. Envoy
// opens one ext_proc stream per HTTP request; by default gRPC starts a
// goroutine for each, whose stack then grows, copied at each doubling,
// through the director's calls: several µs a request. A worker keeps the
// stack it grew. A stream that finds every worker busy gets a goroutine of
// its own, as without the pool.
const streamWorkersPerCPU = 8
