package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
)

// maxUsageBody bounds how much of a non-streamed response is kept to read
// its usage; a larger response is passed through without accounting.
const maxUsageBody = 8 << 20

// ErrProtocol is wrapped by errors about a stream that breaks the ext_proc
// protocol (messages out of order, an unsupported body mode).
var ErrProtocol = errors.New("ext_proc protocol violation")

// errEmptySubset: a subset hint that is present but names nothing leaves no
// endpoint eligible, which is a 503, never "any endpoint".
var errEmptySubset = errors.New("no ready endpoint: the subset hint names no endpoint")

// stream is one HTTP request's ext_proc exchange. Its methods run on the
// stream's own goroutine, one message at a time.
type stream struct {
	s   *Server
	ps  extprocv3.ExternalProcessor_ProcessServer
	ctx context.Context

	reqMode, respMode filterv3.ProcessingMode_BodySendMode
	observe           bool // observability mode: Envoy expects no answers

	in       director.Input
	mem      *requestMemory // pooled memory in.IDBuf and in.Candidates are in
	body     []byte
	answered bool // the request path has been answered (pick or refusal)
	result   string

	pick          *director.Pick
	served        director.Served
	respStreaming bool
	sse           openai.SSEUsageScanner
	respBuf       []byte
	respOverflow  bool
	finished      bool
}

func newStream(s *Server, ps extprocv3.ExternalProcessor_ProcessServer) *stream {
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if s.o.DefaultMode == Buffered {
		mode = filterv3.ProcessingMode_BUFFERED
	}
	return &stream{s: s, ps: ps, ctx: ps.Context(), reqMode: mode, respMode: mode, result: resultCancelled}
}

func (st *stream) run() error {
	st.s.m.active.Inc()
	defer func() {
		st.finish()
		st.releaseMemory()
		st.s.m.active.Dec()
		st.s.m.streams.WithLabelValues(st.result).Inc()
	}()
	for {
		req, err := st.ps.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if c := status.Code(err); c == codes.Canceled || c == codes.DeadlineExceeded {
				return nil
			}
			st.result = resultError
			return fmt.Errorf("extproc: receive: %w", err)
		}
		done, err := st.handle(req)
		if err != nil {
			st.result = resultError
			if st.s.failLog.Allow() {
				st.s.log.LogAttrs(st.ctx, slog.LevelWarn, "ext_proc stream failed", slog.Any("error", err))
			}
			if errors.Is(err, ErrProtocol) {
				return status.Error(codes.InvalidArgument, err.Error())
			}
			return err
		}
		if done {
			return nil
		}
	}
}

// handle processes one message; done means the stream is over (an
// immediate response was sent).
func (st *stream) handle(req *extprocv3.ProcessingRequest) (done bool, err error) {
	if pc := req.GetProtocolConfig(); pc != nil {
		st.reqMode, st.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
	}
	st.observe = req.GetObservabilityMode()
	switch r := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return st.requestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return st.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return st.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return false, st.responseHeaders(req, r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		return false, st.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		st.finish()
		return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
	case nil:
		// A message carrying only flow-control fields needs no answer.
		return false, nil
	}
	return false, fmt.Errorf("%w: unknown request message %T", ErrProtocol, req.Request)
}

func (st *stream) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) (bool, error) {
	if st.in.Headers != nil {
		return false, fmt.Errorf("%w: request headers sent twice", ErrProtocol)
	}
	st.in.Headers = headerMap(h.GetHeaders())
	st.in.Path = st.in.Headers[":path"]
	subset, err := subsetHint(req.GetMetadataContext())
	if errors.Is(err, errEmptySubset) {
		return st.refuse(http.StatusServiceUnavailable, err)
	}
	if err != nil {
		return st.refuse(http.StatusBadRequest, err)
	}
	st.in.Subset = subset

	if h.GetEndOfStream() || st.reqMode == filterv3.ProcessingMode_NONE {
		// No body will come (or none will be shown to us): route as the
		// upstream EPP does, to any ready endpoint of the subset.
		pick, err := st.s.d.PickAny(st.ctx, &st.in)
		if err != nil {
			return st.refuse(director.StatusOf(err), err)
		}
		st.picked(pick)
		return false, st.send(&extprocv3.ProcessingResponse{
			Response:        headersResponse(st.mutation(pick, -1)),
			DynamicMetadata: destinationMetadata(pick),
		})
	}
	if n, err := strconv.Atoi(st.in.Headers["content-length"]); err == nil && n > st.s.o.MaxBodyBytes {
		// Refused before a byte of the body is read.
		return st.refuse(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body of %d bytes exceeds the limit of %d bytes", n, st.s.o.MaxBodyBytes))
	}
	switch st.reqMode {
	case filterv3.ProcessingMode_FULL_DUPLEX_STREAMED:
		// The header answer carries the destination, so it waits for the body.
		return false, nil
	case filterv3.ProcessingMode_BUFFERED, filterv3.ProcessingMode_BUFFERED_PARTIAL:
		// Envoy holds the body until the headers are answered; the
		// destination then rides on the body's answer.
		return false, st.send(&extprocv3.ProcessingResponse{Response: headersResponse(nil)})
	}
	return false, fmt.Errorf("%w: request body mode %s is not supported; use FULL_DUPLEX_STREAMED or BUFFERED", ErrProtocol, st.reqMode)
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.in.Headers == nil || st.answered {
		return false, fmt.Errorf("%w: request body outside the request phase", ErrProtocol)
	}
	if len(st.body)+len(b.GetBody()) > st.s.o.MaxBodyBytes {
		return st.refuse(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body exceeds the limit of %d bytes", st.s.o.MaxBodyBytes))
	}
	if st.body == nil {
		// Size the buffer once from Content-Length, when it is believable.
		if n, err := strconv.Atoi(st.in.Headers["content-length"]); err == nil && n > 0 && n <= st.s.o.MaxBodyBytes {
			st.body = make([]byte, 0, n)
		}
	}
	st.body = append(st.body, b.GetBody()...)
	buffered := st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if b.GetEndOfStream() || buffered {
		// A buffered body is whole in one message even when trailers follow.
		return st.route(b.GetEndOfStream())
	}
	return false, nil
}

func (st *stream) requestTrailers() (bool, error) {
	if st.in.Headers == nil {
		return false, fmt.Errorf("%w: request trailers before headers", ErrProtocol)
	}
	if !st.answered {
		// Trailers are how a body with trailers says it is complete.
		if done, err := st.route(false); done || err != nil {
			return done, err
		}
	}
	return false, st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}})
}

// route runs the director on the complete body and answers Envoy. eos says
// whether the body ended the request (no trailers follow).
func (st *stream) route(eos bool) (bool, error) {
	st.s.m.bodyBytes.Observe(float64(len(st.body)))
	st.in.Body = st.body
	st.takeMemory()
	pick, err := st.s.d.HandleRequest(st.ctx, &st.in)
	if err != nil {
		return st.refuse(director.StatusOf(err), err)
	}
	body := st.body
	st.picked(pick)
	mut := st.mutation(pick, len(body))
	md := destinationMetadata(pick)
	if st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Buffered: exactly one answer per message; headers are still held,
		// so the body's answer may mutate them.
		return false, st.send(&extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true},
			}},
			DynamicMetadata: md,
		})
	}
	if err := st.send(&extprocv3.ProcessingResponse{Response: headersResponse(mut), DynamicMetadata: md}); err != nil {
		return false, err
	}
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), maxChunk)
		last := n == len(body)
		if err := st.send(StreamedBody(false, body[:n], last && eos)); err != nil {
			return false, err
		}
		body = body[n:]
	}
	return false, nil
}

func (st *stream) picked(p *director.Pick) {
	st.pick = p
	st.answered = true
	st.result = resultRouted
	st.served.Endpoint = p.Targets[0]
	// The body is in the pick's request now; the stream need not keep it.
	st.body = nil
}

// refuse answers the request with an ImmediateResponse and ends the stream.
func (st *stream) refuse(code int, err error) (bool, error) {
	st.answered = true
	st.result = resultRefused
	st.body = nil
	st.s.log.LogAttrs(st.ctx, slog.LevelDebug, "request refused",
		slog.Int("status", code), slog.String("path", st.in.Path), slog.Any("error", err))
	resp := &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				setHeader("content-type", "application/json"),
			}},
			Body:    director.ErrorBody(code, err),
			Details: "kvroute_" + strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_"),
		},
	}}
	return true, st.send(resp)
}

func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	hs := headerMap(h.GetHeaders())
	if code, err := strconv.Atoi(hs[":status"]); err == nil {
		st.served.Status = code
	}
	st.respStreaming = strings.HasPrefix(strings.ToLower(hs["content-type"]), "text/event-stream")
	st.served.Streamed = st.respStreaming
	if served := servedEndpoint(req.GetMetadataContext()); served != "" {
		st.served.Endpoint = served
	}
	if h.GetEndOfStream() {
		st.finish()
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
}

func (st *stream) responseBody(b *extprocv3.HttpBody) error {
	chunk := b.GetBody()
	if len(chunk) > 0 && st.served.FirstByte.IsZero() {
		st.served.FirstByte = time.Now()
		if st.pick != nil {
			st.s.d.HandleFirstByte(st.pick)
		}
	}
	st.s.m.respBytes.Add(float64(len(chunk)))
	switch {
	case st.respStreaming:
		st.sse.Write(chunk)
	case b.GetEndOfStream() && st.respBuf == nil && !st.respOverflow && len(chunk) <= maxUsageBody:
		// The whole response in one message is read where it lies.
		st.respBuf = chunk
	case !st.respOverflow && len(st.respBuf)+len(chunk) <= maxUsageBody:
		st.respBuf = append(st.respBuf, chunk...)
	default:
		st.respOverflow, st.respBuf = true, nil
	}
	var resp *extprocv3.ProcessingResponse
	if st.respMode == filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		resp = StreamedBody(true, chunk, b.GetEndOfStream())
	} else {
		resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
			ResponseBody: &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{}}}}
	}
	if b.GetEndOfStream() {
		st.finish()
	}
	return st.send(resp)
}

// requestMemory is what a request's routing is made in that a later
// request can reuse: the prompt's token ids (an 8k-token prompt's are 32
// KiB) and the candidates (64 of them are 20 KiB), which would otherwise
// be garbage per request.
type requestMemory struct {
	ids   []uint32
	cands datalayer.CandidateSet
}

var memPool = sync.Pool{New: func() any { return new(requestMemory) }}

// maxPooledIDs bounds the id buffers memPool keeps (256 KiB of ids): a
// rare huge prompt's memory goes back to the collector.
const maxPooledIDs = 1 << 16

// takeMemory gives the request pooled memory for its token ids and
// candidates.
func (st *stream) takeMemory() {
	st.mem = memPool.Get().(*requestMemory)
	// Empty but not nil, so that the director hands back the ids' memory.
	st.in.IDBuf = st.mem.ids[:0:cap(st.mem.ids)]
	if st.in.IDBuf == nil {
		st.in.IDBuf = []uint32{}
	}
	st.in.Candidates = &st.mem.cands
}

// releaseMemory returns the request's memory to memPool when the stream is
// over, once nothing can use the request any more: its response is handled
// (finish), and no producer the director ran can outlive it. A refused
// request's memory is left to the collector: PrepareData may have run.
func (st *stream) releaseMemory() {
	m, ids := st.mem, st.in.IDBuf
	st.mem, st.in.IDBuf, st.in.Candidates = nil, nil, nil
	if m == nil || st.pick == nil || st.pick.HeldAfterResponse() {
		return
	}
	m.ids = nil
	if cap(ids) <= maxPooledIDs {
		m.ids = ids[:0]
	}
	memPool.Put(m)
}

// finish accounts for the response once, however the stream ends.
func (st *stream) finish() {
	if st.finished || st.pick == nil {
		return
	}
	st.finished = true
	st.served.End = time.Now()
	if st.respStreaming {
		st.served.Usage, _ = st.sse.Usage()
	} else if len(st.respBuf) > 0 {
		if u, ok, err := openai.ParseUsage(st.respBuf); err == nil && ok {
			st.served.Usage = u
		}
	}
	st.respBuf = nil
	st.s.d.HandleResponse(st.pick, st.served)
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if st.observe {
		return nil
	}
	if err := st.ps.Send(r); err != nil {
		return fmt.Errorf("extproc: send: %w", err)
	}
	return nil
}

// mutation sets the destination, the request id and, for a body of
// bodyLen bytes (negative: none), its Content-Length.
func (st *stream) mutation(p *director.Pick, bodyLen int) *extprocv3.HeaderMutation {
	set := []*corev3.HeaderValueOption{
		setHeader(director.HeaderDestination, strings.Join(p.Targets, ",")),
		setHeader(director.HeaderRequestID, p.Request.ID),
	}
	if bodyLen >= 0 {
		set = append(set, setHeader("content-length", strconv.Itoa(bodyLen)))
	}
	return &extprocv3.HeaderMutation{SetHeaders: set}
}

func headersResponse(mut *extprocv3.HeaderMutation) *extprocv3.ProcessingResponse_RequestHeaders {
	cr := &extprocv3.CommonResponse{}
	if mut != nil {
		cr.HeaderMutation, cr.ClearRouteCache = mut, true
	}
	return &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}
}

// StreamedBody is the full-duplex answer passing chunk on: in the request
// phase or, when response is set, the response phase.
func StreamedBody(response bool, chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{
		BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
			StreamedResponse: &extprocv3.StreamedBodyResponse{Body: chunk, EndOfStream: eos},
		}},
	}}
	if response {
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// destinationMetadata is the envoy.lb dynamic metadata naming the same
// targets as the header: the protocol requires that the two agree.
func destinationMetadata(p *director.Pick) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		director.MetadataDestination: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			director.HeaderDestination: structpb.NewStringValue(strings.Join(p.Targets, ",")),
		}}),
	}}
}

// headerMap lower-cases names; Envoy sends values in raw_value (bytes) or,
// from older versions, in value.
func headerMap(hm *corev3.HeaderMap) map[string]string {
	hs := hm.GetHeaders()
	out := make(map[string]string, len(hs))
	for _, h := range hs {
		v := h.GetValue()
		if raw := h.GetRawValue(); len(raw) > 0 {
			v = string(raw)
		}
		out[strings.ToLower(h.GetKey())] = v
	}
	return out
}

// subsetHint reads the gateway's subset hint: a list of ip:port strings
// (each may itself be comma-separated) or one comma-separated string.
func subsetHint(md *corev3.Metadata) ([]string, error) {
	ns, ok := md.GetFilterMetadata()[director.MetadataSubsetHint]
	if !ok {
		return nil, nil
	}
	v, ok := ns.GetFields()[director.HeaderSubsetHint]
	if !ok {
		return nil, nil
	}
	var out []string
	add := func(s string) {
		for _, a := range strings.Split(s, ",") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		add(k.StringValue)
	case *structpb.Value_ListValue:
		for i, e := range k.ListValue.GetValues() {
			s, ok := e.GetKind().(*structpb.Value_StringValue)
			if !ok {
				return nil, fmt.Errorf("subset hint %s/%s: entry %d is not a string", director.MetadataSubsetHint, director.HeaderSubsetHint, i)
			}
			add(s.StringValue)
		}
	default:
		return nil, fmt.Errorf("subset hint %s/%s is neither a list nor a string", director.MetadataSubsetHint, director.HeaderSubsetHint)
	}
	if len(out) == 0 {
		// An explicit but empty subset allows nothing, never everything.
		return nil, errEmptySubset
	}
	return out, nil
}

// servedEndpoint is the endpoint the gateway reports having used, when it says.
func servedEndpoint(md *corev3.Metadata) string {
	ns, ok := md.GetFilterMetadata()[director.MetadataDestination]
	if !ok {
		return ""
	}
	return ns.GetFields()[director.HeaderServed].GetStringValue()
}
