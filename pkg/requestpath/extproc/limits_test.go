package extproc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// perStreamSlack is what an open stream may hold beyond the body budget:
// its goroutines' stacks, gRPC's stream state and its receive buffer, the
// header map, at both ends (the test is client and server). Measured at
// 21 to 29 KiB a stream on loopback.
const perStreamSlack = 48 << 10

// openStream opens a raw stream, sends its request headers (with the
// body mode), and returns it with the function that ends it.
func openStream(t *testing.T, c *envoy.Client, contentLength string) (extprocv3.ExternalProcessor_ProcessClient, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ps, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := headersOnly("/v1/completions")
	if contentLength != "" {
		hs := h.GetRequestHeaders().Headers
		hs.Headers = append(hs.Headers, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(contentLength)})
	}
	if err := ps.Send(h); err != nil {
		cancel()
		t.Fatal(err)
	}
	return ps, cancel
}

// checkRefusal fails unless m is an immediate response with code whose
// body names the limit.
func checkRefusal(t *testing.T, m *extprocv3.ProcessingResponse, code int32, limit string) {
	t.Helper()
	ir := m.GetImmediateResponse()
	if ir == nil {
		t.Fatalf("got %v, want an immediate %d", m, code)
	}
	if got := int32(ir.GetStatus().GetCode()); got != code || !strings.Contains(string(ir.GetBody()), limit) {
		t.Fatalf("refused with %d %s, want %d naming %q", got, ir.GetBody(), code, limit)
	}
}

// Clients open streams whose bodies never end, in small chunks, and
// streams that send headers only. The bodies the server holds stay
// within half its budget (the half for bodies still arriving), the
// streams past it are refused with a 503 naming the limit, the heap grows
// by no more than the budget and a bound per stream, and a normal request
// sent meanwhile is routed.
func TestNeverEndingBodiesAndHeaderOnlyStreamsStayWithinTheBudget(t *testing.T) {
	const (
		budget    = 2 << 20
		chunk     = 1 << 10
		perBody   = 96 << 10 // each attacker's body, one byte short of its Content-Length
		charge    = 128 << 10
		holders   = budget / 2 / charge
		attackers = 100
		idle      = 200
	)
	_, c, reg := startServer(t, plainDirector(t, 2), extproc.Options{
		Plaintext: true, MaxBodyBytes: 128 << 10, MaxInFlightBytes: budget, MaxStreams: attackers + idle + 10,
	})
	ok, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: completion(tokens(1, 16), false)}, nil)
	if err != nil || ok.Immediate != nil {
		t.Fatalf("before the attack: %v %v", ok, err)
	}
	before := testkit.LiveHeap()

	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for range idle {
		_, cancel := openStream(t, c, "")
		cancels = append(cancels, cancel)
	}
	// An attacker answered (refused) ends its stream on the client side
	// too, so that the heap measured below is the server's streams and
	// not the test's leftovers of the refused ones.
	type answer struct {
		m      *extprocv3.ProcessingResponse
		cancel context.CancelFunc
	}
	answers := make(chan answer, attackers)
	var wg sync.WaitGroup
	buf := []byte(strings.Repeat(" ", chunk))
	for range attackers {
		ps, cancel := openStream(t, c, strconv.Itoa(perBody+1))
		cancels = append(cancels, cancel)
		go func() {
			if m, err := ps.Recv(); err == nil {
				answers <- answer{m, cancel}
			}
		}()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sent := 0; sent < perBody; sent += chunk {
				if ps.Send(bodyChunk(buf, false)) != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	testkit.WaitFor(t, "the bodies past the budget to be refused", func() error {
		refused := testkit.Value(t, reg, "kvroute_extproc_refused_total", "reason", "body_bytes")
		open := testkit.Value(t, reg, "kvroute_extproc_active_streams")
		if refused != attackers-holders || open != idle+holders {
			return fmt.Errorf("%v refused for their bytes and %v streams open, want %v and %v", refused, open, attackers-holders, idle+holders)
		}
		return nil
	})
	for range attackers - holders {
		a := <-answers
		checkRefusal(t, a.m, 503, "limit of 2097152 bytes")
		a.cancel()
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight"); got != holders*charge {
		t.Errorf("%v bytes in flight, want %d bodies' %d", got, holders, charge)
	}
	grown := testkit.LiveHeap() - before
	const open = idle + holders
	t.Logf("%d bodies held, %d refused, %d header-only streams: heap +%d KiB (%d B a stream beyond the bodies)",
		holders, attackers-holders, idle, grown>>10, (grown-holders*charge)/open)
	if limit := int64(budget + open*perStreamSlack); grown > limit {
		t.Errorf("heap grew by %d KiB with %d streams open, over the budget and %d KiB a stream (%d KiB)", grown>>10, open, perStreamSlack>>10, limit>>10)
	}

	// Meanwhile, a normal request whose body comes whole is served: the
	// half of the budget for bodies still arriving is spent, the other
	// half is not.
	normal := envoy.Request{Path: "/v1/completions", Body: completion(tokens(7, 64), false)}
	if res, err := c.Do(context.Background(), normal, nil); err != nil || res.Immediate != nil || res.Destination == "" {
		t.Fatalf("a normal request during the attack: %v %v", res, err)
	}
	// One in chunks waits for the attackers to go (BodyTimeout cuts
	// them off; here they leave).
	normal.Chunks = 4
	res, err := c.Do(context.Background(), normal, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkRefusal(t, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: res.Immediate}},
		503, "half of it for bodies still arriving")
	for _, c := range cancels {
		c()
	}
	testkit.WaitFor(t, "the attackers' budget to come back", func() error {
		if b := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight"); b != 0 {
			return fmt.Errorf("%v bytes in flight", b)
		}
		return nil
	})
	if res, err := c.Do(context.Background(), normal, nil); err != nil || res.Immediate != nil || res.Destination == "" {
		t.Fatalf("a normal request in chunks after the attack: %v %v", res, err)
	}
}

// Streams past MaxStreams end at once with ResourceExhausted naming the
// limit; when one ends, another may open.
func TestStreamsPastTheCapAreRefusedWithResourceExhausted(t *testing.T) {
	t.Parallel()
	const limit = 20
	_, c, reg := startServer(t, plainDirector(t, 2), extproc.Options{Plaintext: true, MaxStreams: limit})
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for range limit {
		_, cancel := openStream(t, c, "")
		cancels = append(cancels, cancel)
	}
	testkit.WaitFor(t, "the streams to open", func() error {
		if n := testkit.Value(t, reg, "kvroute_extproc_active_streams"); n != limit {
			return fmt.Errorf("%v streams open, want %v", n, limit)
		}
		return nil
	})
	for range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		ps, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ps.Recv()
		cancel()
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "limit of 20") {
			t.Fatalf("a stream past the cap ended with %v, want ResourceExhausted naming the limit of 20", err)
		}
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_refused_total", "reason", "streams"); got != 5 {
		t.Errorf("refused_total{streams} = %v, want 5", got)
	}
	cancels[0]()
	testkit.WaitFor(t, "a stream to end", func() error {
		if n := testkit.Value(t, reg, "kvroute_extproc_active_streams"); n >= limit {
			return fmt.Errorf("%v streams open, want fewer than %v", n, limit)
		}
		return nil
	})
	res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: completion(tokens(1, 16), false)}, nil)
	if err != nil || res.Immediate != nil {
		t.Fatalf("once a stream ended, a request: %v %v", res, err)
	}
}

// One connection opens more streams than MaxStreamsPerConn: no more than
// that many are open on the server at once, and a request on another
// connection is served meanwhile.
func TestAConnectionHoldsNoMoreStreamsThanItsCap(t *testing.T) {
	t.Parallel()
	const perConn = 10
	s, c, reg := startServer(t, plainDirector(t, 2), extproc.Options{Plaintext: true, MaxStreamsPerConn: perConn})
	var cancels []context.CancelFunc
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()
	for range 3 * perConn {
		ctx, cancel := context.WithCancel(context.Background())
		cancels = append(cancels, cancel)
		// Past the cap, the client holds the stream back until the server
		// allows another.
		go func() {
			if ps, err := c.Process(ctx); err == nil {
				_ = ps.Send(headersOnly("/v1/completions"))
			}
		}()
	}
	testkit.WaitFor(t, "the connection's streams to open", func() error {
		if n := testkit.Value(t, reg, "kvroute_extproc_active_streams"); n != perConn {
			return fmt.Errorf("%v streams open, want %v", n, perConn)
		}
		return nil
	})
	other, err := envoy.Dial(s.Addr(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	res, err := other.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: completion(tokens(1, 16), false)}, nil)
	if err != nil || res.Immediate != nil {
		t.Fatalf("a request on another connection: %v %v", res, err)
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_active_streams"); got != perConn {
		t.Errorf("%v streams open, want the connection's cap of %d", got, perConn)
	}
}

// A stream whose request body does not arrive within BodyTimeout is
// answered 408 naming the limit, then ended with DeadlineExceeded,
// whether it sent headers only or a body that never ends; its budget is
// given back.
func TestARequestPhasePastItsDeadlineIsAnswered408AndEnded(t *testing.T) {
	t.Parallel()
	_, c, reg := startServer(t, plainDirector(t, 2), extproc.Options{Plaintext: true, BodyTimeout: 50 * time.Millisecond})
	for _, withBody := range []bool{false, true} {
		ps, cancel := openStream(t, c, "")
		if withBody {
			if err := ps.Send(bodyChunk([]byte(`{"model":"m",`), false)); err != nil {
				t.Fatal(err)
			}
		}
		m, err := ps.Recv()
		if err != nil {
			t.Fatal(err)
		}
		checkRefusal(t, m, 408, "limit of 50ms")
		// The client sends more, as a hostile one would; the stream is
		// over all the same.
		_ = ps.Send(bodyChunk([]byte(`"prompt":[1]}`), true))
		_, err = ps.Recv()
		cancel()
		if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(status.Convert(err).Message(), "limit of 50ms") {
			t.Fatalf("after the 408 the stream ended with %v, want DeadlineExceeded naming the limit", err)
		}
	}
	testkit.WaitFor(t, "the streams to end and their budget to come back", func() error {
		open := testkit.Value(t, reg, "kvroute_extproc_active_streams")
		b := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight")
		if open != 0 || b != 0 {
			return fmt.Errorf("%v streams open and %v bytes in flight", open, b)
		}
		return nil
	})
	if got := testkit.Value(t, reg, "kvroute_extproc_refused_total", "reason", "body_timeout"); got != 2 {
		t.Errorf("refused_total{body_timeout} = %v, want 2", got)
	}
	// A request that comes in time is routed, and its response may last
	// longer than the deadline.
	ps, cancel := openStream(t, c, "")
	defer cancel()
	if err := ps.Send(bodyChunk(completion(tokens(1, 16), false), true)); err != nil {
		t.Fatal(err)
	}
	if m, err := ps.Recv(); err != nil || m.GetRequestHeaders() == nil {
		t.Fatalf("a request in time: %v %v", m, err)
	}
	time.Sleep(4 * 50 * time.Millisecond) // past the deadline, as a long generation is
	if err := ps.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true,
	}}}); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := ps.Recv()
		if err != nil {
			t.Fatalf("the response phase after the deadline: %v", err)
		}
		if m.GetResponseHeaders() != nil {
			break
		}
	}
	if err := ps.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("the stream's end: %v", err)
	}
}

// A body is charged ten times its size while it is parsed and routed,
// then what its request keeps. With requests held in their response
// phase, one after another, ext_proc admits as many 80 KiB bodies as
// leave room for the next one's decoded charge of 800 KiB (three in 1 MiB,
// fewer if their pooled token-id memory is large), not as many as their
// raw bytes would allow (twelve), and refuses the next with a 503 naming
// the limit and the multiple.
func TestABodyIsChargedAtItsDecodedSizeWhileRouted(t *testing.T) {
	t.Parallel()
	const budget, size = 1 << 20, 80 << 10
	_, c, reg := startServer(t, plainDirector(t, 2), extproc.Options{Plaintext: true, MaxBodyBytes: budget / 10, MaxInFlightBytes: budget})
	body := []byte(`{"model":"m","prompt":[1,2,3]` + strings.Repeat(" ", size) + `}`)
	admitted := 0
	for {
		ps, cancel := openStream(t, c, "")
		defer cancel()
		if err := ps.Send(bodyChunk(body, true)); err != nil {
			t.Fatal(err)
		}
		m, err := ps.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetRequestHeaders() != nil {
			admitted++
			if admitted > 3 {
				t.Fatalf("%d bodies of 80 KiB admitted into 1 MiB at ten times their size", admitted)
			}
			continue
		}
		checkRefusal(t, m, 503, "charged at 10× their size")
		break
	}
	if admitted == 0 {
		t.Fatal("no body admitted into an empty budget")
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight"); got < float64(admitted*size) || got > budget {
		t.Errorf("%v bytes in flight with %d requests held, want at least their bodies and at most the budget", got, admitted)
	}
	if _, err := extproc.New(plainDirector(t, 1), extproc.Options{Addr: "127.0.0.1:0", Plaintext: true, MaxBodyBytes: budget/10 + 1, MaxInFlightBytes: budget}); err == nil ||
		!strings.Contains(err.Error(), "charged") {
		t.Errorf("a body limit whose decoded charge exceeds the budget: %v, want an error", err)
	}
}
