package loadgen

import (
	"fmt"
	"io"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The predicted-latency producer's own accuracy metrics: it compares the
// picked endpoint's prediction with each response as the response ends.
const (
	metricPredictionAPE      = "kvroute_latency_prediction_abs_percentage_error"
	metricPredictionQuantile = "kvroute_latency_prediction_quantile_observations_total"
)

// PredictorAccuracy is how well an EPP's latency predictor foretold the
// TTFT of the requests it picked for, by the EPP's own reckoning (from the
// request's arrival at the EPP to its first byte back).
type PredictorAccuracy struct {
	// N is the responses compared.
	N int `json:",omitempty"`
	// MAPE is the mean of |predicted mean - actual| / actual.
	MAPE float64 `json:",omitempty"`
	// Coverage is the share that came in at or under the predicted
	// quantile (p90), and Quantiles the responses it was counted over.
	Coverage  float64 `json:",omitempty"`
	Quantiles int     `json:",omitempty"`
}

// predictorAccuracy reads the TTFT accuracy that an EPP's predictor
// recorded in reg, summed over endpoints; ok is false when no response was
// compared (a policy without the predictor).
func predictorAccuracy(reg prometheus.Gatherer) (a PredictorAccuracy, ok bool) {
	fams, err := reg.Gather()
	if err != nil {
		return a, false
	}
	var apeSum float64
	var within int
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			if label(m, "target") != "ttft" {
				continue
			}
			switch f.GetName() {
			case metricPredictionAPE:
				apeSum += m.GetHistogram().GetSampleSum()
				a.N += int(m.GetHistogram().GetSampleCount())
			case metricPredictionQuantile:
				n := int(m.GetCounter().GetValue())
				a.Quantiles += n
				if label(m, "within_quantile") == "true" {
					within += n
				}
			}
		}
	}
	if a.N > 0 {
		a.MAPE = apeSum / float64(a.N)
	}
	if a.Quantiles > 0 {
		a.Coverage = float64(within) / float64(a.Quantiles)
	}
	return a, a.N > 0 || a.Quantiles > 0
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// WritePredictorTable writes, per workload and rate, the TTFT accuracy of
// the latency predictor of each policy that ran one; nothing when none did.
func WritePredictorTable(w io.Writer, pts []Point) {
	some := false
	for _, p := range pts {
		some = some || p.Predictor != nil
	}
	if !some {
		return
	}
	fmt.Fprintln(w, "## Latency predictor accuracy")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "For each policy whose EPP runs the latency predictor, from the predictor's own metrics (`%s` and `%s`, target `ttft`, summed over endpoints and read from the EPP's registry when the run ends): for every response served by the endpoint picked first, the predicted mean TTFT against the TTFT the EPP saw (from the request's arrival at the EPP to the response's first byte), and whether that TTFT came in at or under the predicted p90. MAPE is the mean of |predicted − actual| / actual; p90 coverage is the share at or under the predicted p90 (90%% is calibrated).\n\n",
		metricPredictionAPE, metricPredictionQuantile)
	fmt.Fprintln(w, "| workload | req/s | policy | responses | TTFT MAPE | p90 coverage |")
	fmt.Fprintln(w, "|---|---:|---|---:|---:|---:|")
	for _, wl := range workloads(pts) {
		for _, rate := range rates(pts, wl) {
			for _, pol := range policies(pts, wl) {
				p, ok := find(pts, wl, pol, rate)
				if !ok || p.Predictor == nil {
					continue
				}
				a := p.Predictor
				fmt.Fprintf(w, "| %s | %.1f | %s | %d | %.1f%% | %.1f%% |\n", wl, rate, pol, a.N, 100*a.MAPE, 100*a.Coverage)
			}
		}
	}
	fmt.Fprintln(w)
}
