package envoy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// Floor is the least an ext_proc endpoint picker can do in
// FULL_DUPLEX_STREAMED mode: gather the body, answer the headers with a
// fixed destination (header and envoy.lb metadata), and pass the body back
// in chunks of at most 64 KiB, parsing nothing. It runs with the ext_proc
// server's own gRPC options (extproc.ServerOptions), so that a benchmark
// driving both with the same client and load measures what routing adds
// and nothing else. The response phase is passed through unchanged.
type Floor struct {
	extprocv3.UnimplementedExternalProcessorServer
	dest string
	srv  *grpc.Server
	ln   net.Listener
	// spins is how many rounds of spin a request costs before it is
	// answered (StartWorkingFloor).
	spins int
}

// StartFloor serves a Floor in plaintext on loopback, answering every
// request with dest, until the test ends.
func StartFloor(tb testing.TB, dest string) *Floor { return StartWorkingFloor(tb, dest, 0) }

// StartWorkingFloor serves a Floor that, once a request's body is whole,
// spends about work of CPU on the stream's goroutine before it answers, as
// routing does: a yardstick for the ratios to the floor, telling what a
// known amount of serial work per request moves them by on the machine at
// hand. The work is arithmetic on registers (no memory traffic), sized by
// spinsPerMicrosecond.
func StartWorkingFloor(tb testing.TB, dest string, work time.Duration) *Floor {
	tb.Helper()
	f, err := listenFloor(dest, work)
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.srv.Serve(f.ln) }()
	tb.Cleanup(func() {
		f.srv.Stop()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				tb.Errorf("floor: %v", err)
			}
		case <-time.After(10 * time.Second):
			tb.Error("floor did not stop within 10s")
		}
	})
	return f
}

// listenFloor makes a floor listening on a free loopback port, not yet
// serving.
func listenFloor(dest string, work time.Duration) (*Floor, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &Floor{dest: dest, srv: grpc.NewServer(extproc.ServerOptions()...), ln: ln}
	if work > 0 {
		f.spins = int(spinsPerMicrosecond() * float64(work) / float64(time.Microsecond))
	}
	extprocv3.RegisterExternalProcessorServer(f.srv, f)
	return f, nil
}

// Addr is the floor's listen address.
func (f *Floor) Addr() string { return f.ln.Addr().String() }

// Process serves one stream.
func (f *Floor) Process(ps extprocv3.ExternalProcessor_ProcessServer) error {
	// The body is gathered in a buffer from the ext_proc server's pool, as
	// the EPP's is, and given back when the stream ends.
	var body []byte
	var buf *[]byte
	defer func() {
		if buf != nil {
			extproc.BufferPool().Put(buf)
		}
	}()
	for {
		req, err := ps.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if errors.Is(ps.Context().Err(), context.Canceled) {
				return nil
			}
			return err
		}
		var out []*extprocv3.ProcessingResponse
		switch r := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			for _, h := range r.RequestHeaders.GetHeaders().GetHeaders() {
				if h.GetKey() == "content-length" {
					if n, err := strconv.Atoi(string(h.GetRawValue())); err == nil && n > 0 && n <= extproc.DefaultMaxBodyBytes {
						buf = extproc.BufferPool().Get(n)
						body = (*buf)[:0]
					}
				}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			if r.RequestBody.GetEndOfStream() {
				if f.spins > 0 {
					spin(f.spins)
				}
				out = f.answer(body)
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			out = append(out, extproc.StreamedBody(true, r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream()))
		default:
			return fmt.Errorf("floor: %T is not served", req.Request)
		}
		for _, m := range out {
			if err := ps.Send(m); err != nil {
				return err
			}
		}
	}
}

func (f *Floor) answer(body []byte) []*extprocv3.ProcessingResponse {
	set := func(k, v string) *corev3.HeaderValueOption {
		return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}
	}
	out := []*extprocv3.ProcessingResponse{{
		Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
			Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{
				SetHeaders: []*corev3.HeaderValueOption{
					set(director.HeaderDestination, f.dest),
					set("content-length", strconv.Itoa(len(body))),
				}}},
		}},
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{
			director.MetadataDestination: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
				director.HeaderDestination: structpb.NewStringValue(f.dest),
			}}),
		}},
	}}
	for first := true; first || len(body) > 0; first = false {
		n := min(len(body), 64<<10)
		out = append(out, extproc.StreamedBody(false, body[:n], n == len(body)))
		body = body[n:]
	}
	return out
}

// spin runs n rounds of a xorshift generator, each depending on the one
// before, and returns the state: CPU work that touches no memory. Not
// inlined, so that no call of it is optimised away, its result used or not.
//
//go:noinline
func spin(n int) uint64 {
	x := uint64(n) | 1
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

var (
	calibrateOnce sync.Once
	spinRate      float64
)

// spinsPerMicrosecond is how many rounds of spin this machine runs in a
// microsecond: the fastest of seven timed runs of a million rounds, the
// fastest being the one the fewest interruptions fell on.
func spinsPerMicrosecond() float64 {
	calibrateOnce.Do(func() {
		const n = 1 << 20
		best := time.Duration(1<<63 - 1)
		for range 7 {
			t0 := time.Now()
			spin(n)
			best = min(best, time.Since(t0))
		}
		spinRate = float64(n) / (float64(best.Nanoseconds()) / 1e3)
	})
	return spinRate
}
