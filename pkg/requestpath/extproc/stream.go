package extproc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
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
	// observing is observe for the body deadline's goroutine.
	observing atomic.Bool

	in   director.Input
	mem  *requestMemory // pooled memory in.IDBuf and in.Candidates are in
	body []byte
	// bodyBuf is the pooled buffer a chunked body is gathered in (nil for
	// a body whole in one message): BufferPool's, given back with the
	// request's other memory (releaseMemory).
	bodyBuf  *[]byte
	answered bool // the request path has been answered (pick or refusal)
	result   string

	pick          *director.Pick
	served        director.Served
	respStreaming bool
	sse           openai.SSEUsageScanner
	respBuf       []byte
	respOverflow  bool
	finished      bool

	// ans is the request path's answer with the destination, made once
	// per stream (mutation).
	ans answer

	// held is what the stream is charged in the server's budget: its
	// gathered body (at its decoded size while it is routed) and its
	// kept response.
	held int64
	// gathering is the part of held that is a body still arriving.
	gathering int64
	// phase races the body deadline for the request phase's answer.
	phase requestPhase
}

// answer is the messages of the answer that carries the destination: a
// stream sends it once, and it is made in the stream's own memory rather
// than from a dozen allocations. What depends only on the targets (their
// header and the envoy.lb metadata) is shared (Server.destination).
type answer struct {
	resp    extprocv3.ProcessingResponse
	headers extprocv3.ProcessingResponse_RequestHeaders
	hr      extprocv3.HeadersResponse
	cr      extprocv3.CommonResponse
	mut     extprocv3.HeaderMutation
	set     [6]*corev3.HeaderValueOption
	opts    [5]corev3.HeaderValueOption
	vals    [5]corev3.HeaderValue
	// rm is the headers removed; rank holds the rank header's bytes.
	rm   [3]string
	rank [8]byte
	// raw holds the request id's and the Content-Length's bytes.
	raw [64]byte
	// body passes the body's first chunk on (most bodies are one).
	body streamedAnswer
}

// streamedAnswer is the messages of StreamedBody's answer in the request
// phase, to be made in memory that is sent once.
type streamedAnswer struct {
	resp extprocv3.ProcessingResponse
	rb   extprocv3.ProcessingResponse_RequestBody
	br   extprocv3.BodyResponse
	cr   extprocv3.CommonResponse
	bm   extprocv3.BodyMutation
	sr   extprocv3.BodyMutation_StreamedResponse
	sbr  extprocv3.StreamedBodyResponse
}

// streamed is StreamedBody(false, chunk, eos) made in a.
func (a *streamedAnswer) streamed(chunk []byte, eos bool) *extprocv3.ProcessingResponse {
	a.sbr.Body, a.sbr.EndOfStream = chunk, eos
	a.sr.StreamedResponse = &a.sbr
	a.bm.Mutation = &a.sr
	a.cr.BodyMutation = &a.bm
	a.br.Response = &a.cr
	a.rb.RequestBody = &a.br
	a.resp.Response = &a.rb
	return &a.resp
}

func newStream(s *Server, ps extprocv3.ExternalProcessor_ProcessServer) *stream {
	mode := filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	if s.o.DefaultMode == Buffered {
		mode = filterv3.ProcessingMode_BUFFERED
	}
	return &stream{s: s, ps: ps, ctx: ps.Context(), reqMode: mode, respMode: mode, result: resultCancelled}
}

func (st *stream) run() (err error) {
	st.s.m.active.Inc()
	defer func() {
		// A bug on the request path ends its stream, not the process:
		// gRPC recovers no handler's panic, and every other stream would
		// go with it. The cleanup below then gives back what it held.
		if r := recover(); r != nil {
			st.result = resultError
			err = status.Error(codes.Internal, "extproc: internal error")
			if st.s.failLog.Allow() {
				st.s.log.LogAttrs(st.ctx, slog.LevelError, "ext_proc stream panicked",
					slog.Any("panic", r), slog.String("stack", string(debug.Stack())))
			}
		}
		st.finish()
		st.releaseMemory()
		st.s.budget.gather(&st.gathering, 0)
		st.s.budget.charge(&st.held, 0)
		st.s.m.active.Dec()
		st.s.m.ended(st.result)
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
		if errors.Is(err, errExpired) {
			return nil // the deadline answered and ends the stream
		}
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
	if o := req.GetObservabilityMode(); o != st.observe {
		st.observe = o
		st.observing.Store(o)
	}
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
		if !st.phase.end() {
			return true, errExpired
		}
		pick, err := st.s.d.PickAny(st.ctx, &st.in)
		if err != nil {
			return st.refuse(director.StatusOf(err), err)
		}
		st.picked(pick)
		return false, st.send(st.headersAnswer(pick, -1))
	}
	if n, err := strconv.Atoi(st.in.Headers["content-length"]); err == nil && n > st.s.o.MaxBodyBytes {
		// Refused before a byte of the body is read.
		st.s.m.refused(refusedBodySize)
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
		return false, st.send(&extprocv3.ProcessingResponse{Response: headersResponse()})
	}
	return false, fmt.Errorf("%w: request body mode %s is not supported; use FULL_DUPLEX_STREAMED or BUFFERED", ErrProtocol, st.reqMode)
}

func (st *stream) requestBody(b *extprocv3.HttpBody) (bool, error) {
	if st.in.Headers == nil || st.answered {
		return false, fmt.Errorf("%w: request body outside the request phase", ErrProtocol)
	}
	n := len(st.body) + len(b.GetBody())
	if n > st.s.o.MaxBodyBytes {
		st.s.m.refused(refusedBodySize)
		return st.refuse(http.StatusRequestEntityTooLarge,
			fmt.Errorf("request body exceeds the limit of %d bytes", st.s.o.MaxBodyBytes))
	}
	buffered := st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED
	whole := b.GetEndOfStream() || buffered
	// Charged before the memory is taken: what gather may allocate at most.
	need := max(st.held, st.gatherNeeds(b.GetBody(), n, whole))
	if !whole && !st.s.budget.gather(&st.gathering, need) {
		return st.refuseBudget()
	}
	if !st.s.budget.charge(&st.held, need) {
		st.s.budget.gather(&st.gathering, 0)
		return st.refuseBudget()
	}
	st.gather(b.GetBody(), whole)
	st.s.budget.charge(&st.held, int64(cap(st.body)))
	if !whole {
		st.s.budget.gather(&st.gathering, int64(cap(st.body)))
	}
	if whole {
		// A buffered body is whole in one message even when trailers follow.
		return st.route(b.GetEndOfStream())
	}
	return false, nil
}

// gather adds a chunk of the request body; whole says the chunk ends it
// (a buffered body is whole in one message, even when trailers follow).
// A body that is whole in its first message is kept as gRPC decoded it:
// that memory is the message's own and nothing else holds it, so it is
// not copied. Chunks are gathered into one buffer, which parsing needs:
// taken from BufferPool, sized once from Content-Length when it is
// believable (a body that outgrows it moves to memory of its own, and
// the pooled buffer still goes back).
// gatherNeeds is the most memory gather may hold once chunk makes the
// body n bytes.
func (st *stream) gatherNeeds(chunk []byte, n int, whole bool) int64 {
	if st.body == nil {
		if whole {
			return int64(cap(chunk))
		}
		if cl, err := strconv.Atoi(st.in.Headers["content-length"]); err == nil && cl > 0 && cl <= st.s.o.MaxBodyBytes {
			// BufferPool's buffer for it.
			return int64(max(n, 1<<max(tier(cl), minTier)))
		}
	}
	if n <= cap(st.body) {
		return int64(cap(st.body))
	}
	// append at most doubles what it outgrows, rounded to a size class.
	return int64(max(n, 2*cap(st.body))) + 8<<10
}

// refuseBudget refuses a request whose body the budget cannot hold now.
func (st *stream) refuseBudget() (bool, error) {
	st.s.m.refused(refusedBodyBytes)
	return st.refuse(http.StatusServiceUnavailable, fmt.Errorf(
		"%w: ext_proc holds its limit of %d bytes of request bodies (charged at %d× their size; half of it for bodies still arriving); retry",
		errBudget, st.s.budget.max, DecodedBytesPerBodyByte))
}

func (st *stream) gather(chunk []byte, whole bool) {
	if st.body == nil {
		if whole {
			st.body = chunk
			return
		}
		if n, err := strconv.Atoi(st.in.Headers["content-length"]); err == nil && n > 0 && n <= st.s.o.MaxBodyBytes {
			st.bodyBuf = BufferPool().Get(n)
			st.body = (*st.bodyBuf)[:0]
		}
	}
	st.body = append(st.body, chunk...)
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
	if !st.phase.end() {
		return true, errExpired
	}
	st.s.budget.gather(&st.gathering, 0)
	st.s.m.bodyBytes.Observe(float64(len(st.body)))
	raw := int64(max(cap(st.body), len(st.body)))
	// Parsing makes more of the body than its bytes: charged for it
	// while it runs, and for what the request keeps after.
	if !st.s.budget.charge(&st.held, raw+int64(len(st.body))*(DecodedBytesPerBodyByte-1)) {
		return st.refuseBudget()
	}
	st.in.Body = st.body
	st.takeMemory()
	pick, err := st.s.d.HandleRequest(st.ctx, &st.in)
	st.s.budget.charge(&st.held, raw+4*int64(cap(st.in.IDBuf)))
	if err != nil {
		return st.refuse(director.StatusOf(err), err)
	}
	body := st.body
	if pick.Body != nil {
		body = pick.Body // the model rewritten
	}
	st.picked(pick)
	if st.reqMode != filterv3.ProcessingMode_FULL_DUPLEX_STREAMED {
		// Buffered: exactly one answer per message; headers are still held,
		// so the body's answer may mutate them.
		mut, md := st.mutation(pick, len(body))
		cr := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: true}
		if pick.Body != nil {
			cr.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: body}}
		}
		return false, st.send(&extprocv3.ProcessingResponse{
			Response:        &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}},
			DynamicMetadata: md,
		})
	}
	if err := st.send(st.headersAnswer(pick, len(body))); err != nil {
		return false, err
	}
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), maxChunk)
		last := n == len(body)
		var resp *extprocv3.ProcessingResponse
		if first {
			resp = st.ans.body.streamed(body[:n], last && eos)
		} else {
			// A message is not written once sent: the rest are made anew.
			resp = StreamedBody(false, body[:n], last && eos)
		}
		if err := st.send(resp); err != nil {
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
	if !st.phase.end() {
		return true, errExpired
	}
	st.answered = true
	st.result = resultRefused
	st.body = nil
	st.s.log.LogAttrs(st.ctx, slog.LevelDebug, "request refused",
		slog.Int("status", code), slog.String("path", st.in.Path), slog.Any("error", err))
	return true, st.send(immediateFor(st.in.Path, code, err))
}

// immediate is the ImmediateResponse refusing a request with code.
func immediate(code int, err error) *extprocv3.ProcessingResponse { return immediateFor("", code, err) }

// immediateFor is immediate in the error shape of the API path names.
func immediateFor(path string, code int, err error) *extprocv3.ProcessingResponse {
	hs := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if code == http.StatusServiceUnavailable || code == http.StatusTooManyRequests {
		hs = append(hs, setHeader("retry-after", "1"))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: &extprocv3.HeaderMutation{SetHeaders: hs},
			Body:    director.ErrorBodyFor(path, code, err),
			Details: "kvroute_" + strings.ReplaceAll(strings.ToLower(http.StatusText(code)), " ", "_"),
		},
	}}
}

func (st *stream) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) error {
	hs := headerMap(h.GetHeaders())
	if code, err := strconv.Atoi(hs[":status"]); err == nil {
		st.served.Status = code
		if st.pick != nil {
			st.s.d.HandleHeaders(st.pick, code)
		}
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
		if st.pick != nil {
			st.s.d.HandleProgress(st.pick, st.sse.Events())
		}
	case b.GetEndOfStream() && st.respBuf == nil && !st.respOverflow && len(chunk) <= maxUsageBody &&
		st.s.budget.charge(&st.held, st.held+int64(len(chunk))):
		// The whole response in one message is read where it lies.
		st.respBuf = chunk
	case !st.respOverflow && len(st.respBuf)+len(chunk) <= maxUsageBody && st.keep(len(chunk)):
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

// releaseMemory returns the request's memory to memPool, and its gathered
// body to BufferPool, when the stream is over, once nothing can use the
// request any more: its response is handled (finish), and no producer the
// director ran can outlive it. A refused request's memory is left to the
// collector: PrepareData may have run.
//
// The body's bytes were also sent back to Envoy, but gRPC encodes a
// message before Send returns, and this server has no stats handler that
// could read a message later: once the stream is over nothing reads them.
// What the request parsed from the body holds none of its memory past
// routing: strings are copies, and the raw chat fields are read by the
// tokenizer within HandleRequest (a remote tokenizer sends a copy).
func (st *stream) releaseMemory() {
	m, ids, buf := st.mem, st.in.IDBuf, st.bodyBuf
	st.mem, st.in.IDBuf, st.in.Candidates, st.bodyBuf = nil, nil, nil, nil
	if st.pick == nil || st.pick.HeldAfterResponse() {
		return
	}
	st.in.Body = nil
	if buf != nil {
		BufferPool().Put(buf)
	}
	if m == nil {
		return
	}
	m.ids = nil
	if cap(ids) <= maxPooledIDs {
		m.ids = ids[:0]
	}
	memPool.Put(m)
}

// envoyUpstreamFailure begins the body of Envoy's local reply (503) when
// the upstream connection failed or was reset before the response headers
// ("upstream connect error or disconnect/reset before headers. reset
// reason: connection failure"); such a reply passes through ext_proc's
// response phases as the endpoint's own answer would.
var envoyUpstreamFailure = []byte("upstream connect error or disconnect/reset before headers")

// finish accounts for the response once, however the stream ends.
func (st *stream) finish() {
	if st.finished || st.pick == nil {
		return
	}
	st.finished = true
	st.served.End = time.Now()
	if st.respStreaming {
		st.served.Usage, _ = st.sse.Usage()
	} else if st.served.Status == http.StatusServiceUnavailable && bytes.HasPrefix(st.respBuf, envoyUpstreamFailure) {
		// Envoy's own answer when it could not reach the endpoint, or the
		// endpoint reset the stream before its headers.
		st.served.ConnFailed = true
	} else if len(st.respBuf) > 0 {
		if u, ok, err := openai.ParseUsage(st.respBuf); err == nil && ok {
			st.served.Usage = u
		}
	}
	st.respBuf = nil
	st.s.d.HandleResponse(st.pick, st.served)
}

// keep charges n more bytes of kept response to the budget, growing
// respBuf for them; false means the budget is spent, and the response
// goes unaccounted.
func (st *stream) keep(n int) bool {
	if cap(st.respBuf)-len(st.respBuf) >= n {
		return true
	}
	grow := max(n, cap(st.respBuf), 4096)
	if !st.s.budget.charge(&st.held, st.held+int64(grow)) {
		return false
	}
	st.respBuf = slices.Grow(st.respBuf, grow)
	return true
}

func (st *stream) send(r *extprocv3.ProcessingResponse) error {
	if st.observe {
		return nil
	}
	return st.phase.guard(func() error {
		if err := st.ps.Send(r); err != nil {
			return fmt.Errorf("extproc: send: %w", err)
		}
		return nil
	})
}

// mutation sets the destination, the request id and, for a body of
// bodyLen bytes (negative: none), its Content-Length; md is the envoy.lb
// metadata naming the same destination. It is made in st.ans, once per
// stream: the stream answers the request path once.
func (st *stream) mutation(p *director.Pick, bodyLen int) (mut *extprocv3.HeaderMutation, md *structpb.Struct) {
	a := &st.ans
	dest := st.s.destination(p.Targets)
	raw := append(a.raw[:0], p.Request.ID...)
	id := raw[:len(raw):len(raw)]
	a.vals[0].Key, a.vals[0].RawValue = director.HeaderRequestID, id
	a.opts[0].Header, a.opts[0].AppendAction = &a.vals[0], corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
	a.set[0], a.set[1] = dest.header, &a.opts[0]
	a.mut.SetHeaders = a.set[:2]
	if bodyLen >= 0 {
		cl := strconv.AppendInt(raw[len(raw):], int64(bodyLen), 10)
		a.vals[1].Key, a.vals[1].RawValue = "content-length", cl
		a.opts[1].Header, a.opts[1].AppendAction = &a.vals[1], corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		a.set[2] = &a.opts[1]
		a.mut.SetHeaders = a.set[:3]
	}
	st.disaggregation(p)
	if st.s.o.EmitEndpointScores {
		if scored := primaryScores(p); len(scored) > 0 {
			return &a.mut, scoresMetadata(dest.metadata, scored)
		}
	}
	return &a.mut, dest.metadata
}

// primaryScores are the scores of the primary profile's candidates.
func primaryScores(p *director.Pick) []framework.ScoredCandidate {
	if p.Result == nil {
		return nil
	}
	if r := p.Result.Profiles[p.Result.PrimaryProfile]; r != nil {
		return r.Scored
	}
	return nil
}

// scoresMetadata is the destination's envoy.lb metadata with
// x-gateway-destination-endpoint-scores added: each scored endpoint's
// address and weighted score. It is made anew for each request; dest is
// shared and left as it is.
func scoresMetadata(dest *structpb.Struct, scored []framework.ScoredCandidate) *structpb.Struct {
	lb := dest.GetFields()[director.MetadataDestination].GetStructValue()
	fields := make(map[string]*structpb.Value, len(lb.GetFields())+1)
	for k, v := range lb.GetFields() {
		fields[k] = v
	}
	scores := make(map[string]*structpb.Value, len(scored))
	for _, c := range scored {
		scores[c.Address] = structpb.NewNumberValue(c.Score)
	}
	fields[director.MetadataScores] = structpb.NewStructValue(&structpb.Struct{Fields: scores})
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		director.MetadataDestination: structpb.NewStructValue(&structpb.Struct{Fields: fields}),
	}}
}

// disaggregation adds to st.ans's mutation the pods that prefill and
// encode the request for its decode pod (llm-d's P/D sidecar reads them)
// and the data-parallel rank it is pinned to (vLLM's API server reads
// it), and removes whichever of those headers the pick does not set, so
// that a client can name neither the pods the decode pod's sidecar sends
// its prefill or encoding to nor the rank its request runs on.
func (st *stream) disaggregation(p *director.Pick) {
	a := &st.ans
	n := len(a.mut.SetHeaders)
	rm := a.rm[:0]
	if p.Prefill != "" {
		a.vals[2].Key, a.vals[2].RawValue = director.HeaderPrefiller, []byte(p.Prefill)
		a.opts[2].Header, a.opts[2].AppendAction = &a.vals[2], corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		a.set[n] = &a.opts[2]
		n++
	} else {
		rm = append(rm, director.HeaderPrefiller)
	}
	if len(p.Encoders) > 0 {
		a.vals[3].Key, a.vals[3].RawValue = director.HeaderEncoders, []byte(strings.Join(p.Encoders, ","))
		a.opts[3].Header, a.opts[3].AppendAction = &a.vals[3], corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		a.set[n] = &a.opts[3]
		n++
	} else {
		rm = append(rm, director.HeaderEncoders)
	}
	if p.Rank >= 0 {
		a.vals[4].Key, a.vals[4].RawValue = datalayer.HeaderDataParallelRank, strconv.AppendInt(a.rank[:0], int64(p.Rank), 10)
		a.opts[4].Header, a.opts[4].AppendAction = &a.vals[4], corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
		a.set[n] = &a.opts[4]
		n++
	} else {
		rm = append(rm, datalayer.HeaderDataParallelRank)
	}
	a.mut.SetHeaders = a.set[:n]
	a.mut.RemoveHeaders = rm
}

// headersAnswer is the request headers' answer carrying the destination
// (see mutation), made in st.ans.
func (st *stream) headersAnswer(p *director.Pick, bodyLen int) *extprocv3.ProcessingResponse {
	a := &st.ans
	a.cr.HeaderMutation, a.resp.DynamicMetadata = st.mutation(p, bodyLen)
	a.cr.ClearRouteCache = true
	a.hr.Response = &a.cr
	a.headers.RequestHeaders = &a.hr
	a.resp.Response = &a.headers
	return &a.resp
}

func headersResponse() *extprocv3.ProcessingResponse_RequestHeaders {
	return &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}
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
func destinationMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		director.MetadataDestination: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			director.HeaderDestination: structpb.NewStringValue(dest),
		}}),
	}}
}

// destination is what an answer sending a request to some targets
// carries that depends on nothing else: their header and their envoy.lb
// metadata. Its messages are shared by every answer to those targets and
// never written once made (a message may be marshalled concurrently as
// long as nothing writes it).
type destination struct {
	header   *corev3.HeaderValueOption
	metadata *structpb.Struct
}

// maxDestinations bounds the destinations a Server keeps made: one per
// endpoint, or per combination with fallbacks.
const maxDestinations = 4096

// destination returns the shared messages naming targets, made on their
// first use.
func (s *Server) destination(targets []string) destination {
	return s.dests.Get(strings.Join(targets, ","))
}

// newDestination makes the messages naming dest, targets joined by commas.
func newDestination(dest string) destination {
	return destination{header: setHeader(director.HeaderDestination, dest), metadata: destinationMetadata(dest)}
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
