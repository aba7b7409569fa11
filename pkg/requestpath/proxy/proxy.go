// Package proxy is kvroute's standalone OpenAI-compatible HTTP proxy: for
// deployments without Envoy, it reads each request, asks the director where
// it goes, forwards it there (falling back to the next pick only when the
// connection cannot be made), and streams the response back unchanged while
// reading its usage for accounting.
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
)

// DefaultMaxBodyBytes bounds a request body when Options leave it zero.
const DefaultMaxBodyBytes = 16 << 20

// maxUsageBody bounds how much of a non-streamed response is kept to read
// its usage; a larger response is passed on without accounting.
const maxUsageBody = 8 << 20

// ErrAllTargetsDown is wrapped by the error of a request none of whose
// picked endpoints accepted a connection.
var ErrAllTargetsDown = errors.New("no picked endpoint accepted a connection")

// Options configure a Server. The zero value listens on :8080, takes
// bodies up to 16 MiB and forwards over plain HTTP.
type Options struct {
	// Addr is the listen address (":8080" when empty; port 0 picks one).
	Addr string
	// MaxBodyBytes bounds a request body; a larger one is refused with 413.
	MaxBodyBytes int64
	// Transport forwards requests; a clone of http.DefaultTransport without
	// environment proxies when nil.
	Transport http.RoundTripper
	// ShutdownGrace bounds a graceful stop before connections are cut (5s when zero).
	ShutdownGrace time.Duration
	// ReadTimeout bounds reading a request, body included; WriteTimeout a
	// non-streamed response; IdleTimeout a kept-alive connection between
	// requests. Zero means the Default* values; streamed responses have no
	// write bound of the proxy's.
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConcurrent bounds the requests in flight (DefaultMaxConcurrent
	// when zero); one more is refused with 429.
	MaxConcurrent int
	// MaxInFlightBytes bounds the request bodies, and the response bodies
	// kept to read their usage, held at once (DefaultMaxInFlightBytes when
	// zero); a request that would pass it is refused with 503. A body is
	// charged openai.DecodedBytesPerBodyByte times its size while it is
	// parsed and routed, its size after; the limit must hold one body of
	// MaxBodyBytes at its decoded size.
	MaxInFlightBytes int64
	// PrefillFailure is what a split request (one the director gives a
	// prefill pod) gets when its prefill leg fails: refused (the zero
	// value), or served decode-only; either is counted. PrefillTimeout
	// bounds the prefill leg (DefaultPrefillTimeout when zero).
	PrefillFailure PrefillFailure
	PrefillTimeout time.Duration
	Logger         *slog.Logger
	// Registerer takes the proxy's metrics; nil means don't register.
	Registerer prometheus.Registerer
}

// Server is the proxy.
type Server struct {
	d   director.Handler
	o   Options
	log *slog.Logger
	m   *metrics
	rp  *httputil.ReverseProxy
	ln  net.Listener
	srv *http.Server
	lim *limits
	// upstreamLog bounds the lines upstream failures write.
	upstreamLog *rate.Limiter
}

// New binds the listener, so that Addr is known before Run.
func New(d director.Handler, o Options) (*Server, error) {
	if d == nil {
		return nil, errors.New("proxy: a director is required")
	}
	if o.Addr == "" {
		o.Addr = ":8080"
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 5 * time.Second
	}
	if o.ReadTimeout <= 0 {
		o.ReadTimeout = DefaultReadTimeout
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = DefaultWriteTimeout
	}
	if o.IdleTimeout <= 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = DefaultMaxConcurrent
	}
	if o.MaxInFlightBytes <= 0 {
		o.MaxInFlightBytes = DefaultMaxInFlightBytes
	}
	if o.PrefillTimeout <= 0 {
		o.PrefillTimeout = DefaultPrefillTimeout
	}
	if o.MaxBodyBytes*openai.DecodedBytesPerBodyByte > o.MaxInFlightBytes {
		return nil, fmt.Errorf("proxy: a body of %d bytes (the body limit) is charged %d bytes while routed, more than the in-flight limit of %d: raise the limit or lower the body limit",
			o.MaxBodyBytes, o.MaxBodyBytes*openai.DecodedBytesPerBodyByte, o.MaxInFlightBytes)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Transport == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.Proxy = nil
		t.MaxIdleConnsPerHost = 64
		o.Transport = t
	}
	m := newMetrics(o.Registerer)
	s := &Server{d: d, o: o, log: o.Logger, m: m, lim: newLimits(o, m.bytesInFlight),
		upstreamLog: rate.NewLimiter(rate.Every(time.Second), 5)}
	s.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      &fallbackTransport{next: o.Transport, m: s.m, d: d},
		FlushInterval:  -1, // SSE events reach the client as the model server writes them
		ModifyResponse: s.modifyResponse,
		ErrorHandler:   s.upstreamError,
		ErrorLog:       slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug),
	}
	ln, err := net.Listen("tcp", o.Addr)
	if err != nil {
		return nil, fmt.Errorf("proxy: listen on %s: %w", o.Addr, err)
	}
	s.ln = ln
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: min(10*time.Second, o.ReadTimeout),
		ReadTimeout:       o.ReadTimeout,
		IdleTimeout:       o.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// Addr is the listener's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Run serves until ctx is done, then shuts down: requests in flight get
// ShutdownGrace to finish before their connections are closed.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("proxy: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.o.ShutdownGrace)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		_ = s.srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("proxy: serve: %w", err)
	}
	return nil
}

// Close releases the listener of a server that will never Run.
func (s *Server) Close() { _ = s.ln.Close() }

// exchange is one request's state, shared by the handler, the transport
// and the response hooks through the request context.
type exchange struct {
	// ctx is the client's request's.
	ctx    context.Context
	pick   *director.Pick
	body   []byte
	served director.Served
	lim    *limits

	mu sync.Mutex
	// held is the in-flight budget the request's body and kept response
	// take, released when it is accounted for.
	held     int64
	sse      *openai.SSEUsageScanner
	respBuf  []byte
	overflow bool
	// transfer names the prefill pod's hold of a split request, released
	// if the decode leg gets no answer; answered is set once it does.
	// refusedCode is what a split request was answered with when it got
	// no decode leg.
	transfer    *transferParams
	answered    bool
	refusedCode int
}

type exchangeKey struct{}

func exchangeOf(ctx context.Context) *exchange {
	ex, _ := ctx.Value(exchangeKey{}).(*exchange)
	return ex
}

// ServeHTTP routes and forwards one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.m.active.Inc()
	defer s.m.active.Dec()
	if !strings.HasPrefix(r.URL.Path, "/v1/") && !strings.HasPrefix(r.URL.Path, "/inference/v1/") {
		s.refuse(w, r, http.StatusNotFound, fmt.Errorf("no route for %s: kvroute serves the model server's API under /v1/ and /inference/v1/", truncate(r.URL.Path)))
		return
	}
	if allow, ok := admitMethod(r); !ok {
		w.Header().Set("Allow", allow)
		s.m.refused.WithLabelValues(refusedMethod).Inc()
		s.refuse(w, r, http.StatusMethodNotAllowed, fmt.Errorf("method %s not allowed on %s: use %s", truncate(r.Method), truncate(r.URL.Path), allow))
		return
	}
	if r.Method == http.MethodPost {
		if err := admitContentType(r); err != nil {
			s.m.refused.WithLabelValues(refusedContentType).Inc()
			s.refuse(w, r, http.StatusUnsupportedMediaType, err)
			return
		}
	}
	if !s.lim.enter() {
		s.m.refused.WithLabelValues(refusedConcurrency).Inc()
		w.Header().Set("Retry-After", "1")
		s.refuse(w, r, http.StatusTooManyRequests, fmt.Errorf("the proxy is serving its limit of %d concurrent requests; retry", s.o.MaxConcurrent))
		return
	}
	defer s.lim.leave()
	ex := &exchange{lim: s.lim, ctx: r.Context()}
	defer ex.releaseHeld()
	body, held, err := s.lim.readBody(w, r, s.o.MaxBodyBytes)
	ex.held = held
	if err != nil {
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			s.refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Errorf("request body exceeds the limit of %d bytes", tooBig.Limit))
		case errors.Is(err, errBudget):
			s.refuseBudget(w, r)
		default:
			s.refuse(w, r, http.StatusBadRequest, fmt.Errorf("read request body: %w", err))
		}
		return
	}
	// The body is read: from here the connection's read deadline would
	// only cut a long response short.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	in := &director.Input{Path: r.URL.RequestURI(), Headers: make(map[string]string, len(r.Header)), Body: body}
	for k, v := range r.Header {
		in.Headers[strings.ToLower(k)] = v[0]
	}
	if hint := r.Header.Get(director.HeaderSubsetHint); hint != "" {
		for _, a := range strings.Split(hint, ",") {
			if a = strings.TrimSpace(a); a != "" {
				in.Subset = append(in.Subset, a)
			}
		}
	}
	var pick *director.Pick
	if len(body) == 0 && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		pick, err = s.d.PickAny(r.Context(), in)
	} else {
		// Parsing makes more of the body than its bytes: charged for it
		// while it runs; the body alone stays held to be forwarded.
		decoded := int64(len(body)) * (openai.DecodedBytesPerBodyByte - 1)
		if !ex.hold(decoded) {
			s.refuseBudget(w, r)
			return
		}
		pick, err = s.d.HandleRequest(r.Context(), in)
		ex.unhold(decoded)
	}
	if err != nil {
		s.refuse(w, r, director.StatusOf(err), err)
		return
	}
	if pick.Request != nil && pick.Request.Stream {
		_ = rc.SetWriteDeadline(time.Time{})
	} else {
		_ = rc.SetWriteDeadline(time.Now().Add(s.o.WriteTimeout))
	}
	if pick.Body != nil {
		body = pick.Body // the model rewritten
	}
	ex.pick, ex.body = pick, body
	ex.served.Endpoint = pick.Targets[0]
	defer s.finish(ex)
	if pick.Prefill != "" && pick.Request != nil &&
		(pick.Request.API == request.APICompletions || pick.Request.API == request.APIChatCompletions) {
		// A split pick: the proxy runs the prefill leg, then sends the
		// decode leg as it sends any request. Other APIs have no legs to
		// split: the decode pod serves them whole.
		var ok bool
		if body, ok = s.split(w, r, ex); !ok {
			return
		}
		ex.body = body
	}
	r = r.WithContext(context.WithValue(r.Context(), exchangeKey{}, ex))
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	s.rp.ServeHTTP(w, r)
	ex.mu.Lock()
	unpulled := ex.transfer != nil && (!ex.answered || ex.served.Status >= 400)
	ex.mu.Unlock()
	if unpulled {
		// No decode pod served the request: none may have pulled the
		// blocks. (One that did leaves nothing to release, and the
		// release is refused harmlessly.)
		s.releaseHold(ex.transfer)
	}
}

// refuseBudget refuses a request whose body the budget cannot hold now.
func (s *Server) refuseBudget(w http.ResponseWriter, r *http.Request) {
	s.m.refused.WithLabelValues(refusedBodyBytes).Inc()
	w.Header().Set("Retry-After", "1")
	s.refuse(w, r, http.StatusServiceUnavailable, fmt.Errorf("%w: the proxy holds its limit of %d bytes of bodies (charged at %d× their size while routed); retry",
		errBudget, s.lim.maxBytes, openai.DecodedBytesPerBodyByte))
}

func (s *Server) refuse(w http.ResponseWriter, r *http.Request, code int, err error) {
	s.m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
	s.log.LogAttrs(context.Background(), slog.LevelDebug, "request refused", slog.Int("status", code), slog.Any("error", err))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(director.ErrorBodyFor(r.URL.Path, code, err))
}

// hold charges n more bytes to the exchange, without waiting.
func (ex *exchange) hold(n int64) bool {
	if !ex.lim.hold(n) {
		return false
	}
	ex.mu.Lock()
	ex.held += n
	ex.mu.Unlock()
	return true
}

// unhold gives back n bytes that hold charged.
func (ex *exchange) unhold(n int64) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.lim.release(n)
	ex.held -= n
}

// releaseHeld gives back the in-flight budget the exchange holds.
func (ex *exchange) releaseHeld() {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.lim.release(ex.held)
	ex.held = 0
}

// finish accounts for the response once, after the proxy has copied it (or
// given up, the client having gone).
func (s *Server) finish(ex *exchange) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.served.End = time.Now()
	if ex.sse != nil {
		ex.served.Usage, _ = ex.sse.Usage()
	} else if len(ex.respBuf) > 0 && !ex.overflow {
		if u, ok, err := openai.ParseUsage(ex.respBuf); err == nil && ok {
			ex.served.Usage = u
		}
	}
	ex.respBuf = nil
	code := ex.served.Status
	switch {
	case ex.refusedCode != 0:
		code = ex.refusedCode
	case code == 0:
		code = 499 // the client went away before any answer
	}
	s.m.requests.WithLabelValues(strconv.Itoa(code)).Inc()
	s.d.HandleResponse(ex.pick, ex.served)
}

func rewrite(pr *httputil.ProxyRequest) {
	ex := exchangeOf(pr.In.Context())
	pr.SetURL(&url.URL{Scheme: "http", Host: ex.pick.Targets[0]})
	pr.SetXForwarded()
	pr.Out.Header.Set(director.HeaderRequestID, ex.pick.Request.ID)
	pr.Out.Header.Del(director.HeaderSubsetHint)
	// The rank is the pick's to name, never the client's.
	if ex.pick.Rank >= 0 {
		pr.Out.Header.Set(datalayer.HeaderDataParallelRank, strconv.Itoa(ex.pick.Rank))
	} else {
		pr.Out.Header.Del(datalayer.HeaderDataParallelRank)
	}
}

func (s *Server) modifyResponse(resp *http.Response) error {
	ex := exchangeOf(resp.Request.Context())
	ex.mu.Lock()
	ex.served.Status = resp.StatusCode
	ex.answered = true
	s.d.HandleHeaders(ex.pick, resp.StatusCode)
	if strings.HasPrefix(strings.ToLower(resp.Header.Get("Content-Type")), "text/event-stream") {
		ex.sse = &openai.SSEUsageScanner{}
		ex.served.Streamed = true
	}
	ex.mu.Unlock()
	resp.Header.Set(director.HeaderServed, ex.served.Endpoint)
	resp.Body = &observedBody{rc: resp.Body, ex: ex, d: s.d}
	return nil
}

func (s *Server) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	ex := exchangeOf(r.Context())
	if r.Context().Err() != nil {
		return // the client is gone; there is no one to answer
	}
	code := http.StatusBadGateway
	if ex != nil {
		ex.mu.Lock()
		if ex.served.Status == 0 {
			ex.served.Status = code
		}
		ex.served.ConnFailed = true
		ex.mu.Unlock()
	}
	if s.upstreamLog.Allow() {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "upstream failed", slog.Any("error", err))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(director.ErrorBodyFor(r.URL.Path, code, err))
}

// observedBody reads the usage and the first byte's time off a response
// body as the proxy copies it to the client, holding back nothing.
type observedBody struct {
	rc io.ReadCloser
	ex *exchange
	d  director.Handler
}

func (b *observedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && b.ex.ctx.Err() == nil {
		// The endpoint broke the response off; the client is still there.
		b.ex.mu.Lock()
		b.ex.served.ConnFailed = true
		b.ex.mu.Unlock()
	}
	if n > 0 {
		ex := b.ex
		ex.mu.Lock()
		if ex.served.FirstByte.IsZero() {
			ex.served.FirstByte = time.Now()
			b.d.HandleFirstByte(ex.pick)
		}
		switch {
		case ex.sse != nil:
			ex.sse.Write(p[:n])
			b.d.HandleProgress(ex.pick, ex.sse.Events())
		case !ex.overflow && len(ex.respBuf)+n <= maxUsageBody && ex.keep(n):
			ex.respBuf = append(ex.respBuf, p[:n]...)
		default:
			ex.overflow, ex.respBuf = true, nil
		}
		ex.mu.Unlock()
	}
	return n, err
}

func (b *observedBody) Close() error { return b.rc.Close() }

// keep charges n more bytes of kept response to the in-flight budget;
// false means the budget is spent, and the response goes unaccounted.
// Called with ex.mu held.
func (ex *exchange) keep(n int) bool {
	if cap(ex.respBuf)-len(ex.respBuf) >= n {
		return true
	}
	grow := int64(max(n, cap(ex.respBuf), 4096))
	if !ex.lim.hold(grow) {
		return false
	}
	ex.held += grow
	ex.respBuf = slices.Grow(ex.respBuf, int(grow))
	return true
}

// fallbackTransport tries the pick's targets in order, moving on only when
// the request cannot have been served: a connection to the target could
// not be made, or a kept-alive connection turned out to be closed while the
// request was being written (EPIPE: the target never had all of it).
type fallbackTransport struct {
	next http.RoundTripper
	m    *metrics
	d    director.Handler
}

func (t *fallbackTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ex := exchangeOf(req.Context())
	if ex == nil {
		return t.next.RoundTrip(req)
	}
	var errs []error
	for i, target := range ex.pick.Targets {
		if i > 0 {
			req = req.Clone(req.Context())
			req.URL.Host, req.Host = target, target
			req.Body = io.NopCloser(bytes.NewReader(ex.body))
			t.m.fallbacks.Inc()
		}
		resp, err := t.next.RoundTrip(req)
		if err == nil {
			ex.mu.Lock()
			ex.served.Endpoint = target
			ex.mu.Unlock()
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", target, err))
		ex.mu.Lock()
		ex.served.Endpoint = target
		ex.mu.Unlock()
		if !notSent(err) || req.Context().Err() != nil {
			return nil, fmt.Errorf("forward to %s: %w", target, err)
		}
		if i < len(ex.pick.Targets)-1 {
			// The last target's failure is the response's own (finish).
			t.d.HandleUnreachable(ex.pick, target)
		}
	}
	return nil, fmt.Errorf("%w: %w", ErrAllTargetsDown, errors.Join(errs...))
}

// notSent reports whether err shows that a request never fully reached its
// target, so that sending it elsewhere cannot serve it twice.
func notSent(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return errors.Is(err, syscall.EPIPE)
}
