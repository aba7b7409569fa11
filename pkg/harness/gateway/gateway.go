package gateway

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// HeaderExtProcHost names, on every response that passed an ext_proc
// host, the host (Host.Name) whose stream it was: how a client tells which
// EPP replica picked for it.
const HeaderExtProcHost = "x-gateway-extproc-host"

// DefaultMaxBodyBytes bounds a client's request body when
// Options.MaxBodyBytes is zero.
const DefaultMaxBodyBytes = 16 << 20

// chunkBytes is the size of the pieces a request body is sent to the
// ext_proc server in, as Envoy forwards what it reads.
const chunkBytes = 16 << 10

// Options configure a Gateway.
type Options struct {
	// Addr is the clients' listener (127.0.0.1:0 when empty); AdminAddr
	// serves /healthz, /readyz and /metrics (127.0.0.1:0 when empty).
	Addr, AdminAddr string
	// Hosts are the ext_proc cluster's first hosts (AddHost adds more).
	Hosts []Host
	// Endpoints, for a gateway without ext_proc hosts, are its upstream
	// cluster, used round-robin: a path to the engines that passes no EPP.
	Endpoints []string
	// Mode is the body mode announced and followed (FULL_DUPLEX_STREAMED,
	// the zero value, as the inference extension configures Envoy).
	Mode extproc.BodyMode
	// Health is the ext_proc cluster's health check.
	Health HealthCheck
	// OpenRetries is how many other hosts a stream that could not be
	// opened is tried on (the ext_proc grpc_service's retry_policy; none
	// by default, as in the inference extension's configurations).
	OpenRetries int
	// MaxBodyBytes bounds a client's request body (DefaultMaxBodyBytes
	// when zero); a larger one is answered 413.
	MaxBodyBytes int64
	// ConnectTimeout bounds an upstream connection's set-up (5s when zero).
	ConnectTimeout time.Duration
	Logger         *slog.Logger
}

// Gateway is an HTTP listener that routes each request as Envoy with the
// inference extension's ext_proc filter does (see the package comment).
type Gateway struct {
	o        Options
	m        *metrics
	c        *cluster // nil for a gateway without ext_proc
	up       Upstream
	rr       atomic.Uint64
	ln, aln  net.Listener
	srv, adm *http.Server
	done     chan struct{}

	failMu   sync.Mutex
	failures []Failure // the last maxRecentFailures, oldest first
}

// Failure is one exchange the gateway could not complete: the reason
// Envoy's access log would give for a local reply or a cut response.
type Failure struct {
	At         time.Time
	Host, Path string
	// Cut: the client had the response headers, so the response was
	// broken off rather than answered by the gateway.
	Cut bool
	Err string
}

// maxRecentFailures bounds the failures RecentFailures keeps.
const maxRecentFailures = 32

// RecentFailures returns the last exchanges that failed, oldest first: a
// client that saw a response cut or a 500 can read why.
func (g *Gateway) RecentFailures() []Failure {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	return append([]Failure(nil), g.failures...)
}

func (g *Gateway) recordFailure(f Failure) {
	g.failMu.Lock()
	defer g.failMu.Unlock()
	if len(g.failures) == maxRecentFailures {
		g.failures = append(g.failures[:0], g.failures[1:]...)
	}
	g.failures = append(g.failures, f)
}

// Start listens and serves until Close.
func Start(o Options) (*Gateway, error) {
	if o.Addr == "" {
		o.Addr = "127.0.0.1:0"
	}
	if o.AdminAddr == "" {
		o.AdminAddr = "127.0.0.1:0"
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if len(o.Hosts) > 0 && len(o.Endpoints) > 0 {
		return nil, errors.New("gateway: ext_proc hosts and a static upstream cluster are exclusive")
	}
	g := &Gateway{o: o, m: newMetrics(), done: make(chan struct{})}
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: o.ConnectTimeout}).DialContext,
		MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute,
	}
	g.up = HTTPUpstream(&http.Client{Transport: tr})
	if len(o.Endpoints) == 0 {
		g.c = &cluster{hc: o.Health.withDefaults(), m: g.m}
		for _, h := range o.Hosts {
			if err := g.c.add(h); err != nil {
				g.c.closeAll()
				return nil, err
			}
		}
	}
	var err error
	if g.ln, err = net.Listen("tcp", o.Addr); err != nil {
		g.closeHosts()
		return nil, fmt.Errorf("gateway: listen: %w", err)
	}
	if g.aln, err = net.Listen("tcp", o.AdminAddr); err != nil {
		_ = g.ln.Close()
		g.closeHosts()
		return nil, fmt.Errorf("gateway: admin listen: %w", err)
	}
	g.srv = &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(o.Logger.Handler(), slog.LevelDebug)}
	g.adm = &http.Server{Handler: g.admin(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(g.done)
		go func() { _ = g.adm.Serve(g.aln) }()
		if err := g.srv.Serve(g.ln); !errors.Is(err, http.ErrServerClosed) {
			o.Logger.Error("gateway: serve", "error", err)
		}
	}()
	return g, nil
}

// URL is the clients' base URL.
func (g *Gateway) URL() string { return "http://" + g.ln.Addr().String() }

// Addr is the clients' listener address.
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// AdminAddr serves /healthz, /readyz and /metrics.
func (g *Gateway) AdminAddr() string { return g.aln.Addr().String() }

// Registry holds the gateway's metrics.
func (g *Gateway) Registry() *prometheus.Registry { return g.m.reg }

// AddHost puts an ext_proc host in the cluster; it takes streams once its
// first health check passes.
func (g *Gateway) AddHost(h Host) error {
	if g.c == nil {
		return errors.New("gateway: a gateway without ext_proc takes no hosts")
	}
	return g.c.add(h)
}

// RemoveHost takes a host out of the cluster and closes its connections.
func (g *Gateway) RemoveHost(name string) error {
	if g.c == nil {
		return fmt.Errorf("gateway: %w: %s", ErrUnknownHost, name)
	}
	return g.c.remove(name)
}

// Hosts are the ext_proc cluster's hosts as it sees them now.
func (g *Gateway) Hosts() []HostStatus {
	if g.c == nil {
		return nil
	}
	return g.c.status()
}

// Close stops serving, cutting requests in flight, and closes the ext_proc
// connections.
func (g *Gateway) Close() error {
	err := g.srv.Close()
	_ = g.adm.Close()
	<-g.done
	g.closeHosts()
	return err
}

func (g *Gateway) closeHosts() {
	if g.c != nil {
		g.c.closeAll()
	}
}

func (g *Gateway) admin() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if g.c != nil {
			healthy := 0
			for _, h := range g.c.status() {
				if h.Healthy {
					healthy++
				}
			}
			if healthy == 0 {
				http.Error(w, "no healthy ext_proc host", http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/metrics", promhttp.HandlerFor(g.m.reg, promhttp.HandlerOpts{}))
	return mux
}

// ServeHTTP routes one client request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, g.o.MaxBodyBytes+1))
	switch {
	case err != nil:
		g.m.requests.WithLabelValues(OutcomeBadRequest).Inc()
		http.Error(w, "gateway: read request body: "+err.Error(), http.StatusBadRequest)
		return
	case int64(len(body)) > g.o.MaxBodyBytes:
		g.m.requests.WithLabelValues(OutcomeBadRequest).Inc()
		http.Error(w, "Payload Too Large", http.StatusRequestEntityTooLarge)
		return
	}
	if g.c == nil {
		g.serveDirect(w, r, body)
		return
	}
	req := Request{
		Method: r.Method, Path: r.URL.RequestURI(), ContentType: r.Header.Get("Content-Type"),
		Headers: map[string]string{}, Body: body, Chunks: len(body)/chunkBytes + 1, Mode: g.o.Mode,
	}
	for k, vs := range r.Header {
		k = strings.ToLower(k)
		if len(vs) == 0 || hopByHop[k] || k == "content-type" {
			continue
		}
		if k == director.HeaderSubsetHint {
			// As a route's metadata would carry it, not as a header.
			req.Subset = SubsetHint(vs[0])
			continue
		}
		req.Headers[k] = vs[0]
	}
	down := &downstream{w: w}
	var tried []*host
	for attempt := 0; ; attempt++ {
		h, err := g.c.pick(tried)
		if err != nil {
			// No host to open a stream on: the ext_proc call fails, and
			// with failure_mode_allow false so does the request.
			g.m.requests.WithLabelValues(OutcomeExtProcError).Inc()
			g.localReply(w, http.StatusInternalServerError, "")
			return
		}
		down.host = h.Name
		h.streams.Add(1)
		g.m.streams.WithLabelValues(h.Name).Inc()
		act := g.m.active.WithLabelValues(h.Name)
		h.active.Add(1)
		act.Inc()
		res, err := Exchange(r.Context(), h.client, req, g.up, down)
		h.active.Add(-1)
		act.Dec()
		if errors.Is(err, ErrStreamOpen) && r.Context().Err() == nil {
			g.m.streamErrors.WithLabelValues(h.Name, StreamErrOpen).Inc()
			g.c.eject(h)
			tried = append(tried, h)
			if attempt < g.o.OpenRetries {
				continue
			}
		}
		g.finish(w, r, h, res, err)
		return
	}
}

// finish answers what the exchange left unanswered and counts its outcome.
func (g *Gateway) finish(w http.ResponseWriter, r *http.Request, h *host, res *Result, err error) {
	if err != nil && res != nil && res.Complete {
		// The client had its whole answer and left before the stream's
		// end was read.
		err = nil
	}
	if err != nil {
		if r.Context().Err() != nil {
			g.m.requests.WithLabelValues(OutcomeCancelled).Inc()
			return
		}
		switch {
		case errors.Is(err, ErrUpstreamCut):
			g.m.upstream.WithLabelValues(FailureReset).Inc()
		case errors.Is(err, ErrEnvoyWouldReject):
			g.m.streamErrors.WithLabelValues(h.Name, StreamErrProtocol).Inc()
		case !errors.Is(err, ErrStreamOpen):
			g.m.streamErrors.WithLabelValues(h.Name, StreamErrBroken).Inc()
		}
		cut := res != nil && res.HeadersSent
		g.o.Logger.Debug("gateway: exchange failed", "host", h.Name, "path", r.URL.Path, "cut", cut, "error", err)
		g.recordFailure(Failure{At: time.Now(), Host: h.Name, Path: r.URL.Path, Cut: cut, Err: err.Error()})
		if cut {
			g.m.requests.WithLabelValues(OutcomeCut).Inc()
			// The client must see the response broken, not ended: net/http
			// aborts the connection on this value and recovers it.
			panic(http.ErrAbortHandler)
		}
		g.m.requests.WithLabelValues(OutcomeExtProcError).Inc()
		w.Header().Set(HeaderExtProcHost, h.Name)
		g.localReply(w, http.StatusInternalServerError, "")
		return
	}
	switch {
	case res.Immediate != nil:
		g.m.requests.WithLabelValues(OutcomeRefused).Inc()
		ir := res.Immediate
		for _, hv := range ir.GetHeaders().GetSetHeaders() {
			w.Header().Set(hv.GetHeader().GetKey(), headerValue(hv.GetHeader()))
		}
		w.Header().Set(HeaderExtProcHost, h.Name)
		code := int(ir.GetStatus().GetCode())
		if code < 200 || code > 599 {
			code = http.StatusOK // Envoy's default for an immediate response without a status
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(ir.GetBody())))
		w.WriteHeader(code)
		_, _ = w.Write(ir.GetBody())
	case res.NoDestination:
		g.m.upstream.WithLabelValues(FailureNoDestination).Inc()
		g.m.requests.WithLabelValues(OutcomeUpstreamFailure).Inc()
	case res.Served == "":
		g.m.upstream.WithLabelValues(failureKind(res.UpstreamErr)).Inc()
		g.m.requests.WithLabelValues(OutcomeUpstreamFailure).Inc()
	default:
		g.m.requests.WithLabelValues(OutcomeServed).Inc()
	}
}

// localReply answers as Envoy answers itself.
func (g *Gateway) localReply(w http.ResponseWriter, code int, body string) {
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}

// serveDirect routes round-robin over the static upstream cluster, with no
// ext_proc.
func (g *Gateway) serveDirect(w http.ResponseWriter, r *http.Request, body []byte) {
	if len(g.o.Endpoints) == 0 {
		g.m.upstream.WithLabelValues(FailureNoDestination).Inc()
		g.m.requests.WithLabelValues(OutcomeUpstreamFailure).Inc()
		g.localReply(w, http.StatusServiceUnavailable, NoHealthyUpstreamBody)
		return
	}
	target := g.o.Endpoints[int((g.rr.Add(1)-1)%uint64(len(g.o.Endpoints)))]
	hs := map[string]string{":method": r.Method}
	for k, vs := range r.Header {
		if len(vs) > 0 {
			hs[strings.ToLower(k)] = vs[0]
		}
	}
	resp, err := g.up(r.Context(), target, r.URL.RequestURI(), hs, body)
	if err != nil {
		if r.Context().Err() != nil {
			g.m.requests.WithLabelValues(OutcomeCancelled).Inc()
			return
		}
		g.m.upstream.WithLabelValues(failureKind(err)).Inc()
		g.m.requests.WithLabelValues(OutcomeUpstreamFailure).Inc()
		g.localReply(w, http.StatusServiceUnavailable, UpstreamFailureBody)
		return
	}
	d := &downstream{w: w}
	h := map[string]string{}
	for k, v := range resp.Header {
		h[k] = v
	}
	if resp.ContentType != "" {
		h["content-type"] = resp.ContentType
	}
	_ = d.WriteHeader(resp.Status, h)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Reader.Read(buf)
		if n > 0 {
			if werr := d.WriteBody(buf[:n]); werr != nil {
				g.m.requests.WithLabelValues(OutcomeCancelled).Inc()
				return
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if r.Context().Err() != nil {
				g.m.requests.WithLabelValues(OutcomeCancelled).Inc()
				return
			}
			g.m.upstream.WithLabelValues(FailureReset).Inc()
			g.m.requests.WithLabelValues(OutcomeCut).Inc()
			g.recordFailure(Failure{At: time.Now(), Host: target, Path: r.URL.Path, Cut: true,
				Err: fmt.Errorf("gateway: %w: %w", ErrUpstreamCut, err).Error()})
			panic(http.ErrAbortHandler) // as above: the client must see it cut
		}
	}
	g.m.requests.WithLabelValues(OutcomeServed).Inc()
}

// downstream is the client's side of an exchange: each chunk is flushed
// as it comes, so that a streamed answer's first token is not held.
type downstream struct {
	w    http.ResponseWriter
	host string
}

func (d *downstream) WriteHeader(status int, header map[string]string) error {
	h := d.w.Header()
	for k, v := range header {
		if hopByHop[k] || strings.HasPrefix(k, ":") {
			continue
		}
		h.Set(k, v)
	}
	if d.host != "" {
		h.Set(HeaderExtProcHost, d.host)
	}
	d.w.WriteHeader(status)
	if f, ok := d.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

func (d *downstream) WriteBody(chunk []byte) error {
	if _, err := d.w.Write(chunk); err != nil {
		return err
	}
	if f, ok := d.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

// SubsetHint reads a client's subset hint header: endpoints separated by
// commas, empty entries dropped, at most MaxSubset kept. A hint naming
// nothing is an empty, not a nil, subset: it allows no endpoint.
func SubsetHint(v string) []string {
	out := []string{}
	for len(v) > 0 && len(out) < MaxSubset {
		var t string
		t, v, _ = strings.Cut(v, ",")
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// MaxSubset bounds the endpoints a subset hint carries to the EPP.
const MaxSubset = 256
