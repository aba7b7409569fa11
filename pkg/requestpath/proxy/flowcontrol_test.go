package proxy_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/saturationdetector"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// A request waiting in flow control holds its body in the proxy's byte
// budget; when its client goes away it leaves its queue and the budget
// at once. A request past the queue's limit is refused with 429 and why.
func TestAQueuedRequestThroughTheProxyLeavesWhenItsClientDoes(t *testing.T) {
	t.Parallel()
	ds := datalayer.NewDatastore(nil)
	// No metrics: the saturation test never clears, so requests wait.
	ds.Upsert(&datalayer.Endpoint{Name: "pod-a", Address: "127.0.0.1:1", Model: "m"})
	l, err := config.NewInTreeRegistry().Load([]byte("plugins:\n- type: queue-scorer\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	so := l.SchedulerOptions()
	so.Rand = rand.New(rand.NewPCG(1, 2))
	sched, err := scheduling.New(so)
	if err != nil {
		t.Fatal(err)
	}
	fc, err := flowcontrol.New(flowcontrol.Config{MaxRequests: 1}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { fc.Run(ctx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	det := saturationdetector.NewDetector("d", saturationdetector.DefaultThresholds(), time.Second)
	d, err := director.New(director.Options{Datastore: ds, Scheduler: sched, InFlight: ds,
		FlowControl: fc, FlowGate: flowcontrol.Gate{Saturation: det, ByPrediction: true}})
	if err != nil {
		t.Fatal(err)
	}
	base, reg := startProxy(t, d, proxy.Options{})
	body := `{"model":"m","prompt":[1,2,3]}`

	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(cctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		req.Header.Set(flowcontrol.HeaderFairnessID, "tenant-a")
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("answered %d while queued", resp.StatusCode)
		}
		errc <- err
	}()
	testkit.WaitFor(t, "the request queued with its body charged", func() error {
		if n := fc.Len(); n != 1 {
			return fmt.Errorf("%d queued", n)
		}
		if b := testkit.Value(t, reg, "kvroute_proxy_request_bytes_in_flight"); b < float64(len(body)) {
			return fmt.Errorf("%v bytes in flight", b)
		}
		return nil
	})

	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checkError(t, resp, http.StatusTooManyRequests, "queue at capacity")

	cancel()
	if err := <-errc; !strings.Contains(fmt.Sprint(err), "context canceled") {
		t.Fatalf("client: %v", err)
	}
	testkit.WaitFor(t, "the request out of its queue and the budget", func() error {
		if n := fc.Len(); n != 0 {
			return fmt.Errorf("%d queued", n)
		}
		if b := testkit.Value(t, reg, "kvroute_proxy_request_bytes_in_flight"); b != 0 {
			return fmt.Errorf("%v bytes in flight", b)
		}
		return nil
	})
}
