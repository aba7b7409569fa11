package proxy

import (
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
)

// Defaults of the server limits Options leave zero.
const (
	// DefaultReadTimeout bounds reading a request, headers and body: a
	// client that trickles its body is cut off.
	DefaultReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a non-streamed response, generation
	// included; streamed responses (SSE) are bounded by the client and the
	// model server alone.
	DefaultWriteTimeout = 10 * time.Minute
	// DefaultIdleTimeout closes kept-alive connections idle this long.
	DefaultIdleTimeout = 90 * time.Second
	// DefaultMaxConcurrent bounds the requests in flight.
	DefaultMaxConcurrent = 1024
	// DefaultMaxInFlightBytes bounds the request bodies (and the
	// response bodies kept to read their usage) held in memory at once.
	DefaultMaxInFlightBytes = 256 << 20
)

// Why the proxy refused a request it could not take; the reason label of
// kvroute_proxy_refused_total.
const (
	refusedConcurrency = "concurrency"
	refusedBodyBytes   = "body_bytes"
	refusedMethod      = "method"
	refusedContentType = "content_type"
)

// errBudget: the request's body would take the proxy past the bytes it
// may hold.
var errBudget = errors.New("request bodies in flight over the limit")

// limits are the server's bounds on what clients may hold of it.
type limits struct {
	maxConcurrent int64
	active        atomic.Int64
	bytes         *semaphore.Weighted
	maxBytes      int64
	inFlight      prometheus.Gauge
}

func newLimits(o Options, inFlight prometheus.Gauge) *limits {
	return &limits{maxConcurrent: int64(o.MaxConcurrent), bytes: semaphore.NewWeighted(o.MaxInFlightBytes), maxBytes: o.MaxInFlightBytes, inFlight: inFlight}
}

// enter admits one more request, unless MaxConcurrent are in flight.
func (l *limits) enter() bool {
	if l.active.Add(1) > l.maxConcurrent {
		l.active.Add(-1)
		return false
	}
	return true
}

func (l *limits) leave() { l.active.Add(-1) }

// hold takes n bytes of the in-flight budget, without waiting.
func (l *limits) hold(n int64) bool {
	if n <= 0 {
		return true
	}
	if !l.bytes.TryAcquire(n) {
		return false
	}
	l.inFlight.Add(float64(n))
	return true
}

func (l *limits) release(n int64) {
	if n > 0 {
		l.bytes.Release(n)
		l.inFlight.Sub(float64(n))
	}
}

// readChunk is the step in which a body of unknown length is read and
// charged to the budget.
const readChunk = 64 << 10

// readBody reads r's body, at most maxBody bytes, charging what it holds
// to the budget; held is what the caller must release, error or not.
func (l *limits) readBody(w http.ResponseWriter, r *http.Request, maxBody int64) (body []byte, held int64, err error) {
	if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
		return nil, 0, nil
	}
	src := http.MaxBytesReader(w, r.Body, maxBody)
	if n := r.ContentLength; n > 0 {
		if n > maxBody {
			return nil, 0, &http.MaxBytesError{Limit: maxBody}
		}
		if !l.hold(n) {
			return nil, 0, errBudget
		}
		body = make([]byte, n)
		if _, err := io.ReadFull(src, body); err != nil {
			return nil, n, err
		}
		return body, n, nil
	}
	for {
		if len(body) == cap(body) {
			step := int64(min(max(len(body), readChunk), int(maxBody)+1))
			if !l.hold(step) {
				return nil, held, errBudget
			}
			held += step
			body = append(body, make([]byte, step)...)[:len(body)]
		}
		n, err := src.Read(body[len(body):cap(body)])
		body = body[:len(body)+n]
		if err == io.EOF {
			return body, held, nil
		}
		if err != nil {
			return nil, held, err
		}
	}
}

// admitMethod says whether the method suits the path: GET and HEAD for
// the model list, POST for everything else.
func admitMethod(r *http.Request) (allow string, ok bool) {
	if r.URL.Path == "/v1/models" || strings.HasPrefix(r.URL.Path, "/v1/models/") {
		return "GET, HEAD", r.Method == http.MethodGet || r.Method == http.MethodHead
	}
	return http.MethodPost, r.Method == http.MethodPost
}

// admitContentType accepts a JSON body, or one that says nothing of its
// type (as curl's -d without -H sends form-encoded: that one is refused).
func admitContentType(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return fmt.Errorf("Content-Type %q does not parse: %w", truncate(ct), err)
	}
	if mt != "application/json" {
		return fmt.Errorf("Content-Type %s is not application/json", truncate(mt))
	}
	return nil
}

func truncate(s string) string { return director.Echo(s) }
