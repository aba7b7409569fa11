package extproc

import (
	"context"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// What gRPC holds for a client before the server sees its messages, and
// the bounds on it. Every figure here is read from grpc-go's transport
// (internal/transport, rpc_util.go): a stream's DATA frames wait in its
// receive buffer until the handler reads them, within the stream's
// flow-control window; a message is read frame by frame into a list of
// buffers (never allocated whole from its announced length), and when
// the handler asks for a message longer than the window, gRPC opens the
// window by the message's length, so a message in progress holds up to
// MaxMessageBytes on top of the window. The connection's window is
// returned to the client as frames arrive, whether or not they are
// read: it bounds nothing the server holds.
const (
	// DefaultWindowBytes is HTTP/2's initial window, and gRPC's least.
	DefaultWindowBytes = 64 << 10
	minWindowBytes     = 64 << 10
	maxWindowBytes     = 16 << 20
	// connWindowPerStreamWindow sizes the connection's window: room for
	// that many streams' windows in flight at once, as it costs no memory.
	connWindowPerStreamWindow = 16

	// DefaultMaxChunkBytes bounds a body chunk in FULL_DUPLEX_STREAMED
	// mode: Envoy's default per_connection_buffer_limit_bytes, the most it
	// holds of a body before passing it on.
	DefaultMaxChunkBytes = 1 << 20
	// MessageRoomBytes is what a ProcessingRequest may carry beside its
	// body: headers, attributes, metadata.
	MessageRoomBytes = 64 << 10

	// MaxHeaderListBytes bounds a stream's gRPC request headers as HTTP/2
	// counts them (names, values, 32 bytes a field): gRPC's default is
	// 16 MiB, held for the stream's life. Envoy sends a few hundred bytes.
	MaxHeaderListBytes = 16 << 10
	// connBufferBytes are a connection's read and write buffers each
	// (gRPC's defaults, stated so that the bound is).
	connBufferBytes = 32 << 10
	// ConnBytes is what an open connection holds without any stream:
	// its read and write buffers, HPACK tables, framer, TLS records and
	// the goroutines that read, write and keep it alive: 43 KiB measured
	// in plaintext, 54 KiB with TLS, the client's end counted too.
	ConnBytes = 128 << 10

	// DefaultMaxConns bounds the connections open at once: Envoy opens
	// one per worker thread, and another each MaxStreamsPerConn streams.
	DefaultMaxConns = 256
	// DefaultIdleTimeout closes connections with no stream open; Envoy
	// opens a new one when it next needs it.
	DefaultIdleTimeout = 2 * time.Minute
	// handshakeTimeout bounds a connection's TLS handshake and HTTP/2
	// preface (gRPC's default is 120 s).
	handshakeTimeout = 10 * time.Second
	// keepaliveTime and keepaliveTimeout reclaim connections whose peer
	// went away without closing them: a ping after that long without a
	// frame, the connection closed when it is not answered.
	keepaliveTime    = 2 * time.Minute
	keepaliveTimeout = 20 * time.Second
	// minPingInterval is the most often a client may ping (Envoy's
	// connection_keepalive, when set); more often, gRPC ends the
	// connection (GOAWAY too_many_pings).
	minPingInterval = 10 * time.Second
)

// DefaultMaxMessageBytes is the message bound for a body limit and the
// mode Envoy is assumed to send bodies in (Options.MaxMessageBytes).
func DefaultMaxMessageBytes(maxBodyBytes int, mode BodyMode) int {
	if maxBodyBytes <= 0 {
		maxBodyBytes = DefaultMaxBodyBytes
	}
	if mode == Buffered {
		return maxBodyBytes + MessageRoomBytes
	}
	return min(maxBodyBytes, DefaultMaxChunkBytes) + MessageRoomBytes
}

// windowOptions fix a stream's window at w and the connection's at
// connWindowPerStreamWindow times that.
func windowOptions(w int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(int32(w)),
		grpc.InitialConnWindowSize(int32(min(int64(w)*connWindowPerStreamWindow, math.MaxInt32))),
	}
}

// connOptions are the gRPC options that bound what a connection and its
// streams hold, from o's filled-in limits.
func connOptions(o Options) []grpc.ServerOption {
	return append(windowOptions(o.WindowBytes),
		grpc.MaxConcurrentStreams(uint32(o.MaxStreamsPerConn)),
		grpc.MaxRecvMsgSize(o.MaxMessageBytes),
		grpc.MaxHeaderListSize(MaxHeaderListBytes),
		grpc.ReadBufferSize(connBufferBytes),
		grpc.WriteBufferSize(connBufferBytes),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: o.IdleTimeout,
			Time:              keepaliveTime,
			Timeout:           keepaliveTimeout,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             minPingInterval,
			PermitWithoutStream: true,
		}),
	)
}

// limitListener closes, as soon as it is accepted, each connection past
// max open at once. netutil.LimitListener would instead leave it waiting
// in the kernel's backlog, where a client cannot tell a full server from
// a slow one.
type limitListener struct {
	net.Listener
	max  int64
	open atomic.Int64
	// m counts connections and refusals; nil counts nothing.
	m *metrics
}

func newLimitListener(ln net.Listener, max int, m *metrics) *limitListener {
	return &limitListener{Listener: ln, max: int64(max), m: m}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.max {
			l.open.Add(-1)
			_ = c.Close()
			if l.m != nil {
				l.m.refused(refusedConns)
			}
			continue
		}
		if l.m != nil {
			l.m.conns.Inc()
		}
		return &limitedConn{Conn: c, l: l}, nil
	}
}

// limitedConn gives its slot back when it is first closed.
type limitedConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		c.l.open.Add(-1)
		if c.l.m != nil {
			c.l.m.conns.Dec()
		}
	})
	return c.Conn.Close()
}

// Bounds of the separate plaintext health listener (HealthAddr), which
// answers probes: short calls with requests of a few bytes.
const (
	healthMaxConns       = 32
	healthStreamsPerConn = 4
	healthMaxStreams     = 64
	healthMaxMessage     = 4 << 10
)

// admitUnder admits a new stream while fewer than the semaphore's weight
// are open, and gives its place back when gRPC ends the stream's
// context; past it, the stream ends with err before gRPC creates it.
func admitUnder(sem *semaphore.Weighted, refused func() error) tap.ServerInHandle {
	return func(ctx context.Context, _ *tap.Info) (context.Context, error) {
		if !sem.TryAcquire(1) {
			return ctx, refused()
		}
		context.AfterFunc(ctx, func() { sem.Release(1) })
		return ctx, nil
	}
}

// healthOptions are the health listener's gRPC options: the ext_proc
// server's bounds, scaled to probes.
func healthOptions(idle time.Duration) []grpc.ServerOption {
	streams := semaphore.NewWeighted(healthMaxStreams)
	return append(windowOptions(minWindowBytes),
		grpc.MaxConcurrentStreams(healthStreamsPerConn),
		grpc.MaxRecvMsgSize(healthMaxMessage),
		grpc.MaxHeaderListSize(MaxHeaderListBytes),
		grpc.ReadBufferSize(connBufferBytes),
		grpc.WriteBufferSize(connBufferBytes),
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: idle, Time: keepaliveTime, Timeout: keepaliveTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: minPingInterval, PermitWithoutStream: true}),
		grpc.InTapHandle(admitUnder(streams, func() error {
			return status.Errorf(codes.ResourceExhausted, "health streams over the limit of %d open at once", healthMaxStreams)
		})),
	)
}
