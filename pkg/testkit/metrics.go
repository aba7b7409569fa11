package testkit

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Family is the metric family called name in g, nil when g has none.
func Family(t testing.TB, g prometheus.Gatherer, name string) *dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

// Value sums the series of the counter, gauge or untyped metric name whose
// labels include every pair of labels ("name", "value", ...); 0 when none.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	for _, m := range series(t, g, name, labels) {
		v += m.GetCounter().GetValue() + m.GetGauge().GetValue() + m.GetUntyped().GetValue()
	}
	return v
}

// HistCount sums the sample counts of histogram name's matching series.
func HistCount(t testing.TB, g prometheus.Gatherer, name string, labels ...string) int {
	t.Helper()
	var n uint64
	for _, m := range series(t, g, name, labels) {
		n += m.GetHistogram().GetSampleCount()
	}
	return int(n)
}

// HistSum sums the sample sums of histogram name's matching series.
func HistSum(t testing.TB, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	var s float64
	for _, m := range series(t, g, name, labels) {
		s += m.GetHistogram().GetSampleSum()
	}
	return s
}

func series(t testing.TB, g prometheus.Gatherer, name string, labels []string) []*dto.Metric {
	t.Helper()
	if len(labels)%2 != 0 {
		t.Fatalf("metric %s: labels come in name, value pairs: %q", name, labels)
	}
	mf := Family(t, g, name)
	if mf == nil {
		return nil
	}
	var out []*dto.Metric
next:
	for _, m := range mf.GetMetric() {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
					break
				}
			}
			if !found {
				continue next
			}
		}
		out = append(out, m)
	}
	return out
}
