package flowcontrol_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// series returns name's samples by their fairness_id, priority (and
// outcome) labels.
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for _, l := range m.GetLabel() {
				key += l.GetName() + "=" + l.GetValue() + " "
			}
			switch {
			case m.GetGauge() != nil:
				out[key] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestMetricsCapTheFlowLabelAndEmptyWithTheQueue(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	c, err := flowcontrol.New(flowcontrol.Config{}, nil, flowcontrol.NewMetrics(reg, 2))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	open := make(chan struct{})
	hold := func(time.Duration) flowcontrol.Verdict {
		select {
		case <-open:
			return flowcontrol.Verdict{Release: true}
		default:
			return flowcontrol.Verdict{}
		}
	}
	errs := make(chan error, 4)
	for _, f := range []string{"a", "b", "c", "d"} {
		go func() {
			errs <- c.Wait(context.Background(), &flowcontrol.Request{FlowID: f, Priority: 3, Bytes: 10, Check: hold})
		}()
	}
	testkit.WaitFor(t, "four queued under three flow labels", func() error {
		got := series(t, reg, "inference_extension_flow_control_queue_size")
		// Which two flows came first is the scheduler's choice; the
		// shape is not.
		var counts []float64
		for k, v := range got {
			if k == "fairness_id=other priority=3 " && v != 2 {
				return fmt.Errorf("other: %v", v)
			}
			counts = append(counts, v)
		}
		sort.Float64s(counts)
		if fmt.Sprint(counts) != "[1 1 2]" {
			return fmt.Errorf("queue sizes %v", got)
		}
		if b := series(t, reg, "inference_extension_flow_control_queue_bytes"); len(b) != 3 {
			return fmt.Errorf("queue bytes %v", b)
		}
		return nil
	})
	close(open)
	c.Kick()
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	// A fairness id that is not UTF-8 (a header need not be) is "other":
	// as a label value it would be refused, with a panic.
	bad := &flowcontrol.Request{FlowID: "\xff\xfe", Check: func(time.Duration) flowcontrol.Verdict { return flowcontrol.Verdict{Release: true} }}
	if err := c.Wait(context.Background(), bad); err != nil {
		t.Fatal(err)
	}
	for k, v := range series(t, reg, "inference_extension_flow_control_queue_size") {
		if v != 0 {
			t.Errorf("%s: %v waiting after all went", k, v)
		}
	}
	var dispatched float64
	for k, v := range series(t, reg, "inference_extension_flow_control_request_queue_duration_seconds") {
		if strings.Contains(k, "outcome=Dispatched") {
			dispatched += v
		}
	}
	if dispatched != 5 {
		t.Errorf("%v dispatches observed, want 5", dispatched)
	}
}
