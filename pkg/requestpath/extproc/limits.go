package extproc

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/pkg/requestpath/openai"
)

// Defaults of the limits Options leave zero.
const (
	// DefaultMaxInFlightBytes bounds the request bodies held at once,
	// charged at their decoded size (DecodedBytesPerBodyByte).
	DefaultMaxInFlightBytes = 256 << 20
	// DefaultMaxStreams bounds the streams open at once, over all
	// connections.
	DefaultMaxStreams = 8192
	// DefaultMaxStreamsPerConn is the HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS
	// the server announces: Envoy opens another connection past it; a
	// client that ignores it has its streams refused (REFUSED_STREAM)
	// before they cost a goroutine.
	DefaultMaxStreamsPerConn = 1024
	// DefaultBodyTimeout bounds a stream's request phase: from the
	// stream's start to its request body's end.
	DefaultBodyTimeout = 30 * time.Second
)

// DecodedBytesPerBodyByte is what a request body is charged per byte
// while it is routed (openai.DecodedBytesPerBodyByte).
const DecodedBytesPerBodyByte = openai.DecodedBytesPerBodyByte

// Why ext_proc refused a stream or a request; the reason label of
// kvroute_extproc_refused_total.
const (
	refusedConns      = "conns"
	refusedStreams    = "streams"
	refusedBodyBytes  = "body_bytes"
	refusedBodySize   = "body_size"
	refusedBodyTimout = "body_timeout"
)

// errBudget: holding the request's body would take ext_proc past the
// bytes it may hold.
var errBudget = errors.New("request bodies in flight over the limit")

// errExpired: the stream's request phase outlived BodyTimeout and was
// answered by the server; the stream's own goroutine must send nothing.
var errExpired = errors.New("request phase expired")

// budget is the bytes of request bodies ext_proc holds, over all streams.
// Bodies still arriving in chunks may take only half of it: bodies that
// never end cannot take the room of bodies that arrive whole and are
// routed at once.
type budget struct {
	sem       *semaphore.Weighted
	max       int64
	gathering atomic.Int64
	m         *metrics
}

func newBudget(max int64, m *metrics) *budget {
	return &budget{sem: semaphore.NewWeighted(max), max: max, m: m}
}

// gather moves a stream's share of the gathering half from *g to want
// bytes: false (and *g unchanged) when that half is spent.
func (b *budget) gather(g *int64, want int64) bool {
	d := want - *g
	if d > 0 && b.gathering.Add(d) > b.max/2 {
		b.gathering.Add(-d)
		return false
	}
	if d < 0 {
		b.gathering.Add(d)
	}
	*g = want
	return true
}

// charge moves a stream's charge from *held to want bytes without
// waiting: false (and *held unchanged) when the budget cannot take it.
func (b *budget) charge(held *int64, want int64) bool {
	switch d := want - *held; {
	case d > 0:
		if !b.sem.TryAcquire(d) {
			return false
		}
		b.m.bytesInFlight.Add(float64(d))
	case d < 0:
		b.sem.Release(-d)
		b.m.bytesInFlight.Sub(float64(-d))
	}
	*held = want
	return true
}

// Phases of a stream's request path, for the body deadline: the stream's
// goroutine and the deadline race to end the request phase, and the
// winner alone answers it.
const (
	phaseRequest  int32 = iota // gathering the request: the deadline runs
	phaseAnswered              // the stream's goroutine answers
	phaseExpired               // the deadline answered (408)
)

// requestPhase is a stream's deadline state. Until the phase ends, the
// stream's sends hold mu, so that the deadline's answer never crosses
// one of them on the wire.
type requestPhase struct {
	mu    sync.Mutex
	phase atomic.Int32
}

// end ends the request phase for the stream's own goroutine: false when
// the deadline has already answered.
func (p *requestPhase) end() bool {
	if p.phase.Load() == phaseAnswered {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.phase.CompareAndSwap(phaseRequest, phaseAnswered) || p.phase.Load() == phaseAnswered
}

// expire ends the request phase for the deadline: false when the
// stream's goroutine ended it first. On true, send runs under mu.
func (p *requestPhase) expire(send func()) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.phase.CompareAndSwap(phaseRequest, phaseExpired) {
		return false
	}
	send()
	return true
}

// guard runs send unless the deadline answered first.
func (p *requestPhase) guard(send func() error) error {
	if p.phase.Load() == phaseAnswered {
		return send()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.phase.Load() == phaseExpired {
		return errExpired
	}
	return send()
}

// timeoutResponse is the 408 that answers a request whose body did not
// arrive within BodyTimeout.
func timeoutResponse(limit time.Duration) *extprocv3.ProcessingResponse {
	return immediate(http.StatusRequestTimeout, fmt.Errorf("the request body did not arrive within the limit of %s", limit))
}

// streamsExhausted is the status refusing a stream past MaxStreams.
func streamsExhausted(limit int) error {
	return status.Errorf(codes.ResourceExhausted, "ext_proc streams over the limit of %d open at once", limit)
}

// bodyDeadline is the status ending a stream whose request phase
// outlived BodyTimeout, after its 408.
func bodyDeadline(limit time.Duration) error {
	return status.Errorf(codes.DeadlineExceeded, "request body not complete within the limit of %s", limit)
}

// workers run streams on goroutines that keep the stacks they grew, as
// gRPC's stream workers do: Process's own goroutine only waits on the
// stream and its deadline.
type workers struct {
	ch chan func()
	wg sync.WaitGroup
}

func (w *workers) start(n int) {
	w.ch = make(chan func())
	for range n {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			for f := range w.ch {
				f()
			}
		}()
	}
}

// do runs f on an idle worker, else on a goroutine of its own.
func (w *workers) do(f func()) {
	select {
	case w.ch <- f:
	default:
		go f()
	}
}

// stop ends the workers once no more work can come.
func (w *workers) stop() {
	if w.ch != nil {
		close(w.ch)
		w.wg.Wait()
	}
}
