package relay

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /healthz (the process is alive), /readyz (NATS connected
// and the ZeroMQ socket up; 503 otherwise) and, when g is not nil,
// /metrics from g.
func (r *Relay) Handler(g prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case !r.nc.IsConnected():
			http.Error(w, "NATS not connected", http.StatusServiceUnavailable)
		case !r.in.up.Load():
			http.Error(w, "ZeroMQ socket not up", http.StatusServiceUnavailable)
		default:
			_, _ = w.Write([]byte("ok\n"))
		}
	})
	if g != nil {
		mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	return mux
}
