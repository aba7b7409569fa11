// Package envoy drives an ext_proc server over a real gRPC stream the
// way Envoy's ext_proc filter does in FULL_DUPLEX_STREAMED or BUFFERED body
// mode: request headers, the body cut into chunks at chosen byte
// boundaries, optional trailers; then, when given an upstream, the
// response headers, body and trailers (or, when the upstream cannot be
// reached, Envoy's own 503 local reply). It checks the server's answers
// against what Envoy accepts and hands back what Envoy would have done
// with them: the destination, the mutated body, the immediate response.
// Beside it stands Floor, an ext_proc server that does the least the
// protocol allows, against which benchmarks measure what routing costs,
// and the same server spending a fixed amount of CPU a request, which
// calibrates that measure.
package envoy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// ErrEnvoyWouldReject is wrapped by errors about answers Envoy would not
// accept (out of order, the wrong kind, a body answer in the wrong shape).
var ErrEnvoyWouldReject = errors.New("answer Envoy would reject")

// Request is one HTTP request as Envoy would present it.
type Request struct {
	Method string // POST when empty
	Path   string
	// ContentType defaults to application/json when there is a body.
	ContentType string
	// RequestID is sent as x-request-id when set.
	RequestID string
	// Headers are further request headers.
	Headers map[string]string
	Body    []byte
	// Splits are the byte offsets at which Body is cut into chunks; when
	// nil, Chunks (at least 1) cuts it into that many nearly equal pieces.
	Splits []int
	Chunks int
	// Subset is sent as the envoy.lb.subset_hint metadata, as a list, or
	// as one comma-separated string when SubsetAsString is set.
	Subset         []string
	SubsetAsString bool
	// Trailers sends request trailers after the body (whose last chunk
	// then does not end the stream).
	Trailers bool
	// Mode is the body mode announced in protocol_config and followed.
	Mode extproc.BodyMode
}

// Response is what the upstream answered, to be fed back through the server.
type Response struct {
	Status      int
	ContentType string
	// Parts are the body's chunks as they arrive; Reader, when set, is read
	// instead, each read becoming one chunk (a live HTTP response body).
	Parts  [][]byte
	Reader io.Reader
	// Served is reported as x-gateway-destination-endpoint-served metadata.
	Served   string
	Trailers bool
}

// Upstream sends the routed request to target and returns its response.
// headers carry the server's mutations.
type Upstream func(ctx context.Context, target, path string, headers map[string]string, body []byte) (*Response, error)

// Result is what Envoy would have done with the server's answers.
type Result struct {
	// Destination is the x-gateway-destination-endpoint header set;
	// MetadataDestination the envoy.lb dynamic metadata's value.
	Destination         string
	MetadataDestination string
	// SetHeaders are every header the server set on the request;
	// RemovedHeaders those it removed (Envoy sends neither the client's
	// value nor any).
	SetHeaders      map[string]string
	RemovedHeaders  []string
	ClearRouteCache bool
	// Body is the request body as the server passed it on.
	Body []byte
	// Immediate is the server's immediate response, if it refused.
	Immediate *extprocv3.ImmediateResponse
	// ResponseBody is the response body as the server passed it on.
	ResponseBody []byte
	// ResponseChunks counts response body chunks passed back.
	ResponseChunks int
	// Status is the response status the client got: the upstream's, or
	// 503 when Envoy answered itself because the upstream failed
	// (UpstreamErr then says how).
	Status      int
	UpstreamErr error
}

// UpstreamFailureBody is the body of Envoy's local reply when the
// upstream connection fails or is reset before the response headers.
const UpstreamFailureBody = "upstream connect error or disconnect/reset before headers. reset reason: connection failure"

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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ps, err := c.c.Process(ctx)
	if err != nil {
		return nil, fmt.Errorf("extproctest: open stream: %w", err)
	}
	ex := &exchange{ps: ps, req: req, res: &Result{SetHeaders: map[string]string{}, Body: make([]byte, 0, len(req.Body))}}
	done, err := ex.requestPhase()
	if err != nil || done {
		return ex.res, err
	}
	if up != nil {
		headers := requestHeaders(req)
		for k, v := range ex.res.SetHeaders {
			headers[k] = v
		}
		for _, k := range ex.res.RemovedHeaders {
			delete(headers, k)
		}
		target, _, _ := strings.Cut(ex.res.Destination, ",")
		resp, err := up(ctx, target, req.Path, headers, ex.res.Body)
		if err != nil {
			if ctx.Err() != nil {
				return ex.res, fmt.Errorf("extproctest: upstream %s: %w", target, err)
			}
			// Envoy's router answers with a local reply, which passes
			// through the ext_proc filter's response phases.
			ex.res.UpstreamErr = err
			resp = &Response{Status: http.StatusServiceUnavailable, ContentType: "text/plain",
				Parts: [][]byte{[]byte(UpstreamFailureBody)}}
		}
		ex.res.Status = resp.Status
		if err := ex.responsePhase(resp); err != nil {
			return ex.res, err
		}
	}
	if err := ps.CloseSend(); err != nil {
		return ex.res, fmt.Errorf("extproctest: close: %w", err)
	}
	if m, err := ps.Recv(); !errors.Is(err, io.EOF) {
		return ex.res, fmt.Errorf("%w: after the exchange, got %v, %v; want the stream's end", ErrEnvoyWouldReject, m, err)
	}
	return ex.res, nil
}

type exchange struct {
	ps  extprocv3.ExternalProcessor_ProcessClient
	req Request
	res *Result
}

func (ex *exchange) full() bool { return ex.req.Mode == extproc.FullDuplexStreamed }

func (ex *exchange) mode() filterv3.ProcessingMode_BodySendMode {
	if ex.full() {
		return filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	}
	return filterv3.ProcessingMode_BUFFERED
}

// requestPhase sends the request and reads the answers to it; done means
// the server refused with an immediate response.
func (ex *exchange) requestPhase() (done bool, err error) {
	req := ex.req
	bodyless := len(req.Body) == 0 && req.Method != "" && req.Method != http.MethodPost && !req.Trailers
	first := &extprocv3.ProcessingRequest{
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: headerMap(requestHeaders(req)), EndOfStream: bodyless,
		}},
		MetadataContext: subsetMetadata(req),
		ProtocolConfig:  &extprocv3.ProtocolConfiguration{RequestBodyMode: ex.mode(), ResponseBodyMode: ex.mode()},
	}
	var msgs []*extprocv3.ProcessingRequest
	if !bodyless {
		chunks := [][]byte{req.Body}
		if ex.full() {
			chunks = Split(req.Body, req.Splits, req.Chunks)
		}
		for i, c := range chunks {
			msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: c, EndOfStream: i == len(chunks)-1 && !req.Trailers},
			}})
		}
		if req.Trailers {
			msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
				RequestTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}},
			}})
		}
	}

	if !ex.full() {
		// Buffered: one message, one answer, in lockstep.
		if err := ex.ps.Send(first); err != nil {
			return false, fmt.Errorf("extproctest: send headers: %w", err)
		}
		r, err := ex.recv()
		if err != nil || ex.res.Immediate != nil {
			return true, err
		}
		if bodyless {
			return false, ex.takeHeaders(r)
		}
		if r.GetRequestHeaders() == nil {
			return false, fmt.Errorf("%w: want a request headers answer, got %T", ErrEnvoyWouldReject, r.Response)
		}
		for _, m := range msgs {
			if err := ex.ps.Send(m); err != nil {
				return false, fmt.Errorf("extproctest: send: %w", err)
			}
			r, err := ex.recv()
			if err != nil || ex.res.Immediate != nil {
				return true, err
			}
			switch {
			case m.GetRequestBody() != nil:
				if err := ex.takeBufferedBody(r); err != nil {
					return false, err
				}
			case r.GetRequestTrailers() == nil:
				return false, fmt.Errorf("%w: want a trailers answer, got %T", ErrEnvoyWouldReject, r.Response)
			}
		}
		return false, nil
	}

	// Full duplex: everything is sent without waiting, as the chunks arrive.
	var (
		wg      sync.WaitGroup
		sendErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for _, m := range append([]*extprocv3.ProcessingRequest{first}, msgs...) {
			if err := ex.ps.Send(m); err != nil {
				// io.EOF: the server ended the stream (a refusal); Recv tells why.
				if !errors.Is(err, io.EOF) {
					sendErr = err
				}
				return
			}
		}
	}()
	defer wg.Wait()

	r, err := ex.recv()
	if err != nil || ex.res.Immediate != nil {
		return true, err
	}
	if err := ex.takeHeaders(r); err != nil {
		return false, err
	}
	if !bodyless {
		for {
			r, err := ex.recv()
			if err != nil {
				return true, err
			}
			if ex.res.Immediate != nil {
				return true, fmt.Errorf("%w: an immediate response after the headers were answered", ErrEnvoyWouldReject)
			}
			if req.Trailers && r.GetRequestTrailers() != nil {
				break
			}
			sr := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return false, fmt.Errorf("%w: want a StreamedBodyResponse, got %v", ErrEnvoyWouldReject, r)
			}
			ex.res.Body = append(ex.res.Body, sr.GetBody()...)
			if sr.GetEndOfStream() {
				if req.Trailers {
					return false, fmt.Errorf("%w: body ended the stream although trailers follow", ErrEnvoyWouldReject)
				}
				break
			}
		}
	}
	wg.Wait()
	if sendErr != nil {
		return false, fmt.Errorf("extproctest: send: %w", sendErr)
	}
	return false, nil
}

func (ex *exchange) recv() (*extprocv3.ProcessingResponse, error) {
	r, err := ex.ps.Recv()
	if err != nil {
		return nil, fmt.Errorf("extproctest: receive: %w", err)
	}
	if ir := r.GetImmediateResponse(); ir != nil {
		ex.res.Immediate = ir
		// Envoy answers the client and abandons the stream; the server must
		// have ended it.
		if m, err := ex.ps.Recv(); !errors.Is(err, io.EOF) {
			return r, fmt.Errorf("%w: the stream went on after an immediate response: %v, %v", ErrEnvoyWouldReject, m, err)
		}
	}
	return r, nil
}

// takeHeaders reads the full-duplex (or bodyless) answer to the request
// headers: the destination in the header and in the metadata.
func (ex *exchange) takeHeaders(r *extprocv3.ProcessingResponse) error {
	hr := r.GetRequestHeaders()
	if hr == nil {
		return fmt.Errorf("%w: want a request headers answer first, got %T", ErrEnvoyWouldReject, r.Response)
	}
	return ex.takeCommon(hr.GetResponse(), r.GetDynamicMetadata())
}

func (ex *exchange) takeBufferedBody(r *extprocv3.ProcessingResponse) error {
	br := r.GetRequestBody()
	if br == nil {
		return fmt.Errorf("%w: want a request body answer, got %T", ErrEnvoyWouldReject, r.Response)
	}
	cr := br.GetResponse()
	ex.res.Body = ex.req.Body
	switch m := cr.GetBodyMutation().GetMutation().(type) {
	case nil:
	case *extprocv3.BodyMutation_Body:
		ex.res.Body = m.Body
	case *extprocv3.BodyMutation_ClearBody:
		ex.res.Body = nil
	default:
		return fmt.Errorf("%w: %T is not a buffered body mutation", ErrEnvoyWouldReject, m)
	}
	return ex.takeCommon(cr, r.GetDynamicMetadata())
}

func (ex *exchange) takeCommon(cr *extprocv3.CommonResponse, md *structpb.Struct) error {
	for _, h := range cr.GetHeaderMutation().GetSetHeaders() {
		v := h.GetHeader().GetValue()
		if raw := h.GetHeader().GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		ex.res.SetHeaders[strings.ToLower(h.GetHeader().GetKey())] = v
	}
	for _, k := range cr.GetHeaderMutation().GetRemoveHeaders() {
		k = strings.ToLower(k)
		if _, set := ex.res.SetHeaders[k]; set {
			return fmt.Errorf("%w: header %s both set and removed", ErrEnvoyWouldReject, k)
		}
		ex.res.RemovedHeaders = append(ex.res.RemovedHeaders, k)
	}
	ex.res.Destination = ex.res.SetHeaders[director.HeaderDestination]
	ex.res.ClearRouteCache = cr.GetClearRouteCache()
	ex.res.MetadataDestination = md.GetFields()[director.MetadataDestination].GetStructValue().
		GetFields()[director.HeaderDestination].GetStringValue()
	if cl, ok := ex.res.SetHeaders["content-length"]; ok && ex.full() && len(ex.req.Body) > 0 {
		if n, err := strconv.Atoi(cl); err != nil || n < 0 {
			return fmt.Errorf("%w: content-length %q", ErrEnvoyWouldReject, cl)
		}
	}
	return nil
}

func (ex *exchange) responsePhase(resp *Response) error {
	hs := map[string]string{":status": strconv.Itoa(resp.Status)}
	if resp.ContentType != "" {
		hs["content-type"] = resp.ContentType
	}
	var parts func() ([]byte, bool, error)
	switch {
	case resp.Reader != nil:
		buf := make([]byte, 32<<10)
		parts = func() ([]byte, bool, error) {
			n, err := resp.Reader.Read(buf)
			if errors.Is(err, io.EOF) {
				return append([]byte(nil), buf[:n]...), true, nil
			}
			return append([]byte(nil), buf[:n]...), false, err
		}
	default:
		i := 0
		parts = func() ([]byte, bool, error) {
			if i >= len(resp.Parts) {
				return nil, true, nil
			}
			i++
			return resp.Parts[i-1], i == len(resp.Parts), nil
		}
	}
	var md *corev3.Metadata
	if resp.Served != "" {
		md = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
			director.MetadataDestination: {Fields: map[string]*structpb.Value{
				director.HeaderServed: structpb.NewStringValue(resp.Served),
			}},
		}}
	}
	if err := ex.ps.Send(&extprocv3.ProcessingRequest{
		Request:         &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: headerMap(hs)}},
		MetadataContext: md,
	}); err != nil {
		return fmt.Errorf("extproctest: send response headers: %w", err)
	}
	r, err := ex.ps.Recv()
	if err != nil {
		return fmt.Errorf("extproctest: receive: %w", err)
	}
	if r.GetResponseHeaders() == nil {
		return fmt.Errorf("%w: want a response headers answer, got %T", ErrEnvoyWouldReject, r.Response)
	}

	var whole []byte
	for {
		chunk, last, err := parts()
		if err != nil {
			return fmt.Errorf("extproctest: read upstream body: %w", err)
		}
		if !ex.full() {
			whole = append(whole, chunk...)
			if !last {
				continue
			}
			chunk = whole
		}
		// Each chunk is answered before the next is sent: a server that
		// held chunks back would stall here, as it would stall the client.
		if err := ex.ps.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: last && !resp.Trailers},
		}}); err != nil {
			return fmt.Errorf("extproctest: send response body: %w", err)
		}
		r, err := ex.ps.Recv()
		if err != nil {
			return fmt.Errorf("extproctest: receive: %w", err)
		}
		br := r.GetResponseBody()
		if br == nil {
			return fmt.Errorf("%w: want a response body answer, got %T", ErrEnvoyWouldReject, r.Response)
		}
		ex.res.ResponseChunks++
		if ex.full() {
			sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return fmt.Errorf("%w: want a StreamedBodyResponse for the response body", ErrEnvoyWouldReject)
			}
			ex.res.ResponseBody = append(ex.res.ResponseBody, sr.GetBody()...)
		} else {
			if br.GetResponse().GetBodyMutation() != nil {
				return fmt.Errorf("%w: the response body was mutated", ErrEnvoyWouldReject)
			}
			ex.res.ResponseBody = append(ex.res.ResponseBody, chunk...)
		}
		if last {
			break
		}
	}
	if resp.Trailers {
		if err := ex.ps.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}},
		}}); err != nil {
			return fmt.Errorf("extproctest: send response trailers: %w", err)
		}
		r, err := ex.ps.Recv()
		if err != nil {
			return fmt.Errorf("extproctest: receive: %w", err)
		}
		if r.GetResponseTrailers() == nil {
			return fmt.Errorf("%w: want a response trailers answer, got %T", ErrEnvoyWouldReject, r.Response)
		}
	}
	return nil
}

// Split cuts body at the offsets in splits (ascending, inside the body)
// or, when splits is nil, into n nearly equal chunks. An empty body is one
// empty chunk: Envoy still sends end of stream.
func Split(body []byte, splits []int, n int) [][]byte {
	if splits == nil {
		n = max(1, min(n, len(body)))
		for i := 1; i < n; i++ {
			splits = append(splits, i*len(body)/n)
		}
	}
	var out [][]byte
	prev := 0
	for _, s := range splits {
		s = max(prev, min(s, len(body)))
		out = append(out, body[prev:s])
		prev = s
	}
	return append(out, body[prev:])
}

func requestHeaders(req Request) map[string]string {
	method := req.Method
	if method == "" {
		method = http.MethodPost
	}
	hs := map[string]string{":method": method, ":path": req.Path, ":scheme": "http", ":authority": "gateway"}
	if len(req.Body) > 0 {
		ct := req.ContentType
		if ct == "" {
			ct = "application/json"
		}
		hs["content-type"] = ct
		hs["content-length"] = strconv.Itoa(len(req.Body))
	}
	if req.RequestID != "" {
		hs[director.HeaderRequestID] = req.RequestID
	}
	for k, v := range req.Headers {
		hs[strings.ToLower(k)] = v
	}
	return hs
}

// headerMap encodes headers as current Envoys do: values in raw_value.
func headerMap(hs map[string]string) *corev3.HeaderMap {
	m := &corev3.HeaderMap{}
	for k, v := range hs {
		m.Headers = append(m.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	return m
}

func subsetMetadata(req Request) *corev3.Metadata {
	if req.Subset == nil {
		return nil
	}
	var v *structpb.Value
	if req.SubsetAsString {
		v = structpb.NewStringValue(strings.Join(req.Subset, ","))
	} else {
		vals := make([]*structpb.Value, len(req.Subset))
		for i, s := range req.Subset {
			vals[i] = structpb.NewStringValue(s)
		}
		v = structpb.NewListValue(&structpb.ListValue{Values: vals})
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		director.MetadataSubsetHint: {Fields: map[string]*structpb.Value{director.HeaderSubsetHint: v}},
	}}
}

// HTTPUpstream is an Upstream that sends the request over HTTP with client,
// streaming the response body back as it arrives. The response body is
// closed when ctx ends or the exchange has read it all.
func HTTPUpstream(client *http.Client) Upstream {
	return func(ctx context.Context, target, path string, headers map[string]string, body []byte) (*Response, error) {
		method := headers[":method"]
		req, err := http.NewRequestWithContext(ctx, method, "http://"+target+path, strings.NewReader(string(body)))
		if err != nil {
			return nil, err
		}
		for k, v := range headers {
			if strings.HasPrefix(k, ":") || k == "content-length" {
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		go func() { <-ctx.Done(); resp.Body.Close() }()
		return &Response{
			Status: resp.StatusCode, ContentType: resp.Header.Get("Content-Type"),
			Reader: resp.Body, Served: target,
		}, nil
	}
}
