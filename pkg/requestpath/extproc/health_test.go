package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// plainDirector is a director over a datastore of n endpoints with no
// event stream, enough for tests of the protocol rather than the routing.
func plainDirector(t testing.TB, n int) *director.Director {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	for i := range n {
		ds.Upsert(&datalayer.Endpoint{Name: "pod-" + string(rune('a'+i)), Address: "10.0.0." + string(rune('1'+i)) + ":8000", Model: "m"})
	}
	// A load scorer alone: the protocol, not the routing, is under test.
	l, err := config.NewInTreeRegistry().Load([]byte("plugins:\n- type: queue-scorer\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	o := l.SchedulerOptions()
	o.Rand = rand.New(rand.NewPCG(1, 2))
	sched, err := scheduling.New(o)
	if err != nil {
		t.Fatal(err)
	}
	d, err := director.New(director.Options{Datastore: ds, Scheduler: sched, InFlight: ds})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestHealthFollowsReadiness(t *testing.T) {
	t.Parallel()
	var ready atomic.Bool
	s, c, _ := startServer(t, plainDirector(t, 2), extproc.Options{
		HealthAddr: "127.0.0.1:0", Ready: ready.Load, ReadyPoll: 5 * time.Millisecond,
	})
	hconn, err := grpc.NewClient(s.HealthAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer hconn.Close()
	ctx := context.Background()
	check := func(conn *grpc.ClientConn, service string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("check %q: %v", service, err)
		}
		return r.GetStatus()
	}
	for _, conn := range []*grpc.ClientConn{hconn, c.Conn()} {
		if got := check(conn, extproc.HealthLiveness); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("liveness = %v, want SERVING at once", got)
		}
		for _, svc := range []string{extproc.HealthReadiness, extproc.HealthExtProc} {
			if got := check(conn, svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("%s = %v before ready, want NOT_SERVING", svc, got)
			}
		}
	}
	ready.Store(true)
	testkit.WaitFor(t, "readiness to be noticed", func() error {
		if seen := check(hconn, extproc.HealthReadiness); seen != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("check(hconn, extproc.HealthReadiness) is %v, want %v", seen, healthpb.HealthCheckResponse_SERVING)
		}
		if seen := check(c.Conn(), extproc.HealthExtProc); seen != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("check(c.Conn(), extproc.HealthExtProc) is %v, want %v", seen, healthpb.HealthCheckResponse_SERVING)
		}
		return nil
	})
	ready.Store(false)
	testkit.WaitFor(t, "unreadiness to be noticed", func() error {
		if seen := check(hconn, extproc.HealthExtProc); seen != healthpb.HealthCheckResponse_NOT_SERVING {
			return fmt.Errorf("check(hconn, extproc.HealthExtProc) is %v, want %v", seen, healthpb.HealthCheckResponse_NOT_SERVING)
		}
		return nil
	})
}

func TestRunStopsWithAStreamOpen(t *testing.T) {
	t.Parallel()
	s, err := extproc.New(plainDirector(t, 1), extproc.Options{Addr: "127.0.0.1:0", ShutdownGrace: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	c, err := envoy.Dial(s.Addr(), false)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ps, err := c.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Half a request: the stream stays open, waiting for the body.
	if err := ps.Send(headersOnly("/v1/completions")); err != nil {
		t.Fatal(err)
	}
	if err := ps.Send(bodyChunk([]byte(`{"model":`), false)); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel with a stream open")
	}
	if _, err := ps.Recv(); err == nil {
		t.Error("the open stream survived shutdown")
	}
	if err := s.Run(context.Background()); err == nil {
		t.Error("a second Run was accepted")
	}
}

func TestAServerRoutesWithoutAnEventStream(t *testing.T) {
	t.Parallel()
	_, c, _ := startServer(t, plainDirector(t, 3), extproc.Options{})
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/chat/completions", Body: body, Chunks: 4}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate != nil || res.Destination == "" || res.Destination != res.MetadataDestination || string(res.Body) != string(body) {
		t.Fatalf("result %+v", res)
	}
}
