// Package gateway is what Envoy does in front of an endpoint picker, as a
// library: an HTTP listener for clients and, for each request, an ext_proc
// stream to one host of an ext_proc cluster (round-robin over the hosts
// passing their gRPC health checks), exchanged in the processing modes the
// Gateway API Inference Extension's Envoy configuration sets (headers and
// trailers sent, both bodies FULL_DUPLEX_STREAMED, failure_mode_allow
// false); the picker's mutations and immediate responses applied; the
// request forwarded to the endpoint the picker named in
// x-gateway-destination-endpoint (or the envoy.lb metadata), trying a
// comma-separated list in order; and the answer streamed back through the
// response phases. Envoy's own local replies stand where Envoy answers
// itself: 503 when the upstream cannot be reached, 500 when the ext_proc
// stream fails.
//
// Exchange is the protocol core alone, which pkg/testkit/envoy drives in
// tests, checking every answer against what Envoy accepts.
package gateway

import (
	"context"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// Request is one HTTP request as Envoy presents it to the ext_proc server.
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
	// Header holds further response headers (lower-case names).
	Header map[string]string
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

// Downstream receives the response as Envoy passes it to its client: the
// status and headers once the server has answered the response headers
// (its mutations applied), then each body chunk as the server passed it
// on. Without one, the exchange gathers the body in Result.ResponseBody.
type Downstream interface {
	WriteHeader(status int, header map[string]string) error
	WriteBody(chunk []byte) error
}

// Result is what Envoy did with the server's answers.
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
	// Tried are the targets the request was sent to, in order; Served the
	// one that answered ("" when none did).
	Tried  []string
	Served string
	// ResponseBody is the response body as the server passed it on (not
	// kept when a Downstream takes it).
	ResponseBody []byte
	// ResponseChunks counts response body chunks passed back.
	ResponseChunks int
	// HeadersSent says the response's headers reached the Downstream: an
	// error after that can only cut the response. Complete says its whole
	// body did: the request is done, whatever the stream's end.
	HeadersSent, Complete bool
	// Status is the response status the client got: the upstream's, or
	// 503 when Envoy answered itself because no upstream could be reached
	// (UpstreamErr then says how; NoDestination when none was named).
	Status        int
	UpstreamErr   error
	NoDestination bool
}

// Local reply bodies, as Envoy writes them.
const (
	// UpstreamFailureBody answers a request whose upstream connection
	// failed or was reset before the response headers.
	UpstreamFailureBody = "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
	// NoHealthyUpstreamBody answers a request routed to no endpoint the
	// original-destination cluster can use.
	NoHealthyUpstreamBody = "no healthy upstream"
)

// Exchange runs one request through the ext_proc server behind c in the
// order Envoy's filter does; with a nil upstream it stops after the request
// phase. An error opening the stream wraps ErrStreamOpen.
func Exchange(ctx context.Context, c extprocv3.ExternalProcessorClient, req Request, up Upstream, down Downstream) (*Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ps, err := c.Process(ctx)
	if err != nil {
		return nil, fmt.Errorf("gateway: %w: %w", ErrStreamOpen, err)
	}
	ex := &exchange{ps: ps, req: req, down: down, res: &Result{SetHeaders: map[string]string{}, Body: make([]byte, 0, len(req.Body))}}
	done, err := ex.requestPhase()
	if err != nil && !ex.answered && status.Code(err) == codes.Unavailable {
		// The server never answered and the transport says it was not
		// there (refused, or gone before reading): as a stream that could
		// not be opened, it may be tried elsewhere, as Envoy's retry
		// policy on connect failure and refused streams does.
		return ex.res, fmt.Errorf("gateway: %w: %w", ErrStreamOpen, err)
	}
	if err != nil || done {
		return ex.res, err
	}
	if up != nil {
		resp := ex.forward(ctx, up)
		if resp == nil {
			return ex.res, fmt.Errorf("gateway: upstream: %w", ctx.Err())
		}
		ex.res.Status = resp.Status
		if err := ex.responsePhase(resp); err != nil {
			return ex.res, err
		}
		ex.res.Complete = true
	}
	if err := ps.CloseSend(); err != nil {
		return ex.res, fmt.Errorf("gateway: close: %w", err)
	}
	if m, err := ps.Recv(); !errors.Is(err, io.EOF) {
		return ex.res, fmt.Errorf("%w: after the exchange, got %v, %v; want the stream's end", ErrEnvoyWouldReject, m, err)
	}
	return ex.res, nil
}

// forward sends the routed request to its targets in order, as the
// original-destination cluster with a fallback list does: the next target
// only when the last could not be reached. When none answers, Envoy's
// router answers itself with a local reply that passes through the
// ext_proc filter's response phases. nil means ctx ended.
func (ex *exchange) forward(ctx context.Context, up Upstream) *Response {
	headers := requestHeaders(ex.req)
	for k, v := range ex.res.SetHeaders {
		headers[k] = v
	}
	for _, k := range ex.res.RemovedHeaders {
		delete(headers, k)
	}
	targets := Targets(ex.res.Destination)
	if len(targets) == 0 {
		targets = Targets(ex.res.MetadataDestination)
	}
	if len(targets) == 0 {
		ex.res.NoDestination = true
		return localReply(NoHealthyUpstreamBody)
	}
	for _, t := range targets {
		ex.res.Tried = append(ex.res.Tried, t)
		resp, err := up(ctx, t, ex.req.Path, headers, ex.res.Body)
		if err == nil {
			ex.res.Served, ex.res.UpstreamErr = t, nil
			return resp
		}
		if ctx.Err() != nil {
			return nil
		}
		ex.res.UpstreamErr = fmt.Errorf("gateway: upstream %s: %w", t, err)
	}
	return localReply(UpstreamFailureBody)
}

func localReply(body string) *Response {
	return &Response{Status: http.StatusServiceUnavailable, ContentType: "text/plain", Parts: [][]byte{[]byte(body)}}
}

// Targets splits a destination into its endpoints, in order: one
// host:port, or a comma-separated list of them, the first the pick and the
// rest its fallbacks. Empty entries are dropped; at most MaxTargets are
// kept.
func Targets(dest string) []string {
	var out []string
	for len(dest) > 0 && len(out) < MaxTargets {
		var t string
		t, dest, _ = strings.Cut(dest, ",")
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// MaxTargets bounds the fallback list a destination may name, so that a
// picker's answer cannot make one request try without end.
const MaxTargets = 8

type exchange struct {
	ps   extprocv3.ExternalProcessor_ProcessClient
	req  Request
	down Downstream
	res  *Result
	// answered: a message has come from the server.
	answered bool
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
			return false, fmt.Errorf("gateway: send headers: %w", err)
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
				return false, fmt.Errorf("gateway: send: %w", err)
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
		return false, fmt.Errorf("gateway: send: %w", sendErr)
	}
	return false, nil
}

func (ex *exchange) recv() (*extprocv3.ProcessingResponse, error) {
	r, err := ex.ps.Recv()
	if err != nil {
		return nil, fmt.Errorf("gateway: receive: %w", err)
	}
	ex.answered = true
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
		ex.res.SetHeaders[strings.ToLower(h.GetHeader().GetKey())] = headerValue(h.GetHeader())
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

// headerValue is a header's value as current Envoys carry it: raw_value,
// else value.
func headerValue(h *corev3.HeaderValue) string {
	if raw := h.GetRawValue(); len(raw) > 0 {
		return string(raw)
	}
	return h.GetValue()
}

func (ex *exchange) responsePhase(resp *Response) error {
	hs := map[string]string{}
	for k, v := range resp.Header {
		hs[strings.ToLower(k)] = v
	}
	hs[":status"] = strconv.Itoa(resp.Status)
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
		return fmt.Errorf("gateway: send response headers: %w", err)
	}
	r, err := ex.ps.Recv()
	if err != nil {
		return fmt.Errorf("gateway: receive: %w", err)
	}
	hr := r.GetResponseHeaders()
	if hr == nil {
		return fmt.Errorf("%w: want a response headers answer, got %T", ErrEnvoyWouldReject, r.Response)
	}
	if ex.down != nil {
		status := resp.Status
		mut := hr.GetResponse().GetHeaderMutation()
		for _, h := range mut.GetSetHeaders() {
			k := strings.ToLower(h.GetHeader().GetKey())
			v := headerValue(h.GetHeader())
			if k == ":status" {
				if n, err := strconv.Atoi(v); err == nil && n >= 200 && n <= 599 {
					status = n
				}
				continue
			}
			hs[k] = v
		}
		for _, k := range mut.GetRemoveHeaders() {
			delete(hs, strings.ToLower(k))
		}
		delete(hs, ":status")
		if err := ex.down.WriteHeader(status, hs); err != nil {
			return fmt.Errorf("gateway: write response headers: %w", err)
		}
		ex.res.HeadersSent = true
	}

	var whole []byte
	for {
		chunk, last, err := parts()
		if err != nil {
			return fmt.Errorf("gateway: %w: %w", ErrUpstreamCut, err)
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
			return fmt.Errorf("gateway: send response body: %w", err)
		}
		r, err := ex.ps.Recv()
		if err != nil {
			return fmt.Errorf("gateway: receive: %w", err)
		}
		br := r.GetResponseBody()
		if br == nil {
			return fmt.Errorf("%w: want a response body answer, got %T", ErrEnvoyWouldReject, r.Response)
		}
		ex.res.ResponseChunks++
		out := chunk
		if ex.full() {
			sr := br.GetResponse().GetBodyMutation().GetStreamedResponse()
			if sr == nil {
				return fmt.Errorf("%w: want a StreamedBodyResponse for the response body", ErrEnvoyWouldReject)
			}
			out = sr.GetBody()
		} else if br.GetResponse().GetBodyMutation() != nil {
			return fmt.Errorf("%w: the response body was mutated", ErrEnvoyWouldReject)
		}
		if ex.down != nil {
			if len(out) > 0 {
				if err := ex.down.WriteBody(out); err != nil {
					return fmt.Errorf("gateway: write response body: %w", err)
				}
			}
		} else {
			ex.res.ResponseBody = append(ex.res.ResponseBody, out...)
		}
		if last {
			break
		}
	}
	if resp.Trailers {
		if err := ex.ps.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{
			ResponseTrailers: &extprocv3.HttpTrailers{Trailers: &corev3.HeaderMap{}},
		}}); err != nil {
			return fmt.Errorf("gateway: send response trailers: %w", err)
		}
		r, err := ex.ps.Recv()
		if err != nil {
			return fmt.Errorf("gateway: receive: %w", err)
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
