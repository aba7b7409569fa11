package extproc_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// panicky is a request path with a bug: it panics on the requests whose
// body names the model "boom".
type panicky struct{ director.Handler }

func (p panicky) HandleRequest(ctx context.Context, in *director.Input) (*director.Pick, error) {
	if string(in.Body) == boom {
		panic("a bug on the request path")
	}
	return p.Handler.HandleRequest(ctx, in)
}

const boom = `{"model":"boom","prompt":"x"}`

// A panic on one stream's request path ends that stream with Internal and
// gives back what it held; the process and every other stream go on.
func TestAPanicOnTheRequestPathEndsItsStreamNotTheProcess(t *testing.T) {
	_, c, reg := startServer(t, panicky{plainDirector(t, 2)}, extproc.Options{Plaintext: true, MaxBodyBytes: 64 << 10, MaxInFlightBytes: 1 << 20})
	for i := range 3 {
		if _, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: []byte(boom)}, nil); err == nil {
			t.Fatalf("panicking request %d: no error", i)
		}
		res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: completion(tokens(1, 16), false)}, nil)
		if err != nil || res.Immediate != nil || res.Destination == "" {
			t.Fatalf("a request after panic %d: %v %v", i, res, err)
		}
	}
	testkit.WaitFor(t, "the panicked streams' memory to come back", func() error {
		b := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight")
		open := testkit.Value(t, reg, "kvroute_extproc_active_streams")
		errs := testkit.Value(t, reg, "kvroute_extproc_streams_total", "result", "error")
		if b != 0 || open != 0 || errs != 3 {
			return fmt.Errorf("%v bytes in flight, %v streams open, %v ended in error; want 0, 0, 3", b, open, errs)
		}
		return nil
	})
}
