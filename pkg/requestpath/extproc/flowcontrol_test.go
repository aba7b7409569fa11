package extproc_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// queueingDirector is a director whose flow controller holds every
// request: its endpoints have no metrics, so the saturation test never
// clears.
func queueingDirector(t *testing.T, cfg flowcontrol.Config) (*director.Director, *flowcontrol.Controller) {
	t.Helper()
	ds := datalayer.NewDatastore(nil)
	ds.Upsert(&datalayer.Endpoint{Name: "pod-a", Address: "10.0.0.1:8000", Model: "m"})
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
	fc, err := flowcontrol.New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fc.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	det := saturationdetector.NewDetector("d", saturationdetector.DefaultThresholds(), time.Second)
	d, err := director.New(director.Options{Datastore: ds, Scheduler: sched, InFlight: ds,
		FlowControl: fc, FlowGate: flowcontrol.Gate{Saturation: det, ByPrediction: true}})
	if err != nil {
		t.Fatal(err)
	}
	return d, fc
}

// A request waiting in flow control holds its body in ext_proc's byte
// budget; its stream cancelled, it leaves its queue and the budget at
// once. A request past the queue's limit is refused with 429 and why.
func TestAQueuedRequestThroughExtProcHoldsItsBodyAndLeavesWithItsStream(t *testing.T) {
	t.Parallel()
	d, fc := queueingDirector(t, flowcontrol.Config{MaxRequests: 1})
	_, c, reg := startServer(t, d, extproc.Options{Plaintext: true})
	body := []byte(`{"model":"m","prompt":[1,2,3]}`)

	ps, cancel := openStream(t, c, "")
	defer cancel()
	if err := ps.Send(bodyChunk(body, true)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the request queued with its body charged", func() error {
		if n := fc.Len(); n != 1 {
			return fmt.Errorf("%d queued", n)
		}
		if b := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight"); b < float64(len(body)) {
			return fmt.Errorf("%v bytes in flight", b)
		}
		return nil
	})

	full, cancelFull := openStream(t, c, "")
	defer cancelFull()
	if err := full.Send(bodyChunk(body, true)); err != nil {
		t.Fatal(err)
	}
	m, err := full.Recv()
	if err != nil {
		t.Fatal(err)
	}
	checkRefusal(t, m, 429, "queue at capacity")

	cancel()
	testkit.WaitFor(t, "the cancelled request out of its queue and the budget", func() error {
		if n := fc.Len(); n != 0 {
			return fmt.Errorf("%d queued", n)
		}
		if b := testkit.Value(t, reg, "kvroute_extproc_request_bytes_in_flight"); b != 0 {
			return fmt.Errorf("%v bytes in flight", b)
		}
		return nil
	})
}
