// Package envoy drives an ext_proc server over a real gRPC stream the
// way Envoy's ext_proc filter does in FULL_DUPLEX_STREAMED or BUFFERED body
// mode: request headers, the body cut into chunks at chosen byte
// boundaries, optional trailers; then, when given an upstream, the
// response headers, body and trailers (or, when the upstream cannot be
// reached, Envoy's own 503 local reply). It checks the server's answers
// against what Envoy accepts and hands back what Envoy would have done
// with them: the destination, the mutated body, the immediate response.
// The exchange itself is pkg/harness/gateway's, which the simulator's
// gateway runs for every request.
// Beside it stands Floor, an ext_proc server that does the least the
// protocol allows, against which benchmarks measure what routing costs,
// and the same server spending a fixed amount of CPU a request, which
// calibrates that measure.
package envoy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// The exchange's types are the gateway's (pkg/harness/gateway): one
// implementation of Envoy's side of the protocol serves both.
type (
	// Request is one HTTP request as Envoy would present it.
	Request = gateway.Request
	// Response is what the upstream answered, to be fed back through the server.
	Response = gateway.Response
	// Upstream sends the routed request to target and returns its response.
	Upstream = gateway.Upstream
	// Result is what Envoy would have done with the server's answers.
	Result = gateway.Result
)

// ErrEnvoyWouldReject is wrapped by errors about answers Envoy would not
// accept (out of order, the wrong kind, a body answer in the wrong shape).
var ErrEnvoyWouldReject = gateway.ErrEnvoyWouldReject

// UpstreamFailureBody is the body of Envoy's local reply when the
// upstream connection fails or is reset before the response headers.
const UpstreamFailureBody = gateway.UpstreamFailureBody

// Client is a connection to an ext_proc server.
type Client struct {
	conn *grpc.ClientConn
	c    extprocv3.ExternalProcessorClient
}

// Dial connects to addr, over TLS without verifying the certificate (as
// Envoy is usually set up against the EPP's self-signed one) unless plaintext.
func Dial(addr string, plaintext bool) (*Client, error) {
	creds := insecure.NewCredentials()
	if !plaintext {
		creds = credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the server's certificate is self-signed
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), experimental.WithBufferPool(extproc.BufferPool()))
	if err != nil {
		return nil, fmt.Errorf("extproctest: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, c: extprocv3.NewExternalProcessorClient(conn)}, nil
}

// DialTLS connects to addr over TLS as cfg says: the gateway of a server
// that verifies its clients presents a certificate here.
func DialTLS(addr string, cfg *tls.Config) (*Client, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)), experimental.WithBufferPool(extproc.BufferPool()))
	if err != nil {
		return nil, fmt.Errorf("extproctest: dial %s: %w", addr, err)
	}
	return &Client{conn: conn, c: extprocv3.NewExternalProcessorClient(conn)}, nil
}

// Conn is the client's gRPC connection (for health checks).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Process opens a raw ext_proc stream, for tests that script it themselves.
func (c *Client) Process(ctx context.Context) (extprocv3.ExternalProcessor_ProcessClient, error) {
	return c.c.Process(ctx)
}

// Do runs one request through the server; with a nil upstream it stops
// after the request phase.
func (c *Client) Do(ctx context.Context, req Request, up Upstream) (*Result, error) {
	return gateway.Exchange(ctx, c.c, req, up, nil)
}

// Split cuts body at the offsets in splits (ascending, inside the body)
// or, when splits is nil, into n nearly equal chunks. An empty body is one
// empty chunk: Envoy still sends end of stream.
func Split(body []byte, splits []int, n int) [][]byte { return gateway.Split(body, splits, n) }

// HTTPUpstream is an Upstream that sends the request over HTTP with client,
// streaming the response body back as it arrives.
func HTTPUpstream(client *http.Client) Upstream { return gateway.HTTPUpstream(client) }
