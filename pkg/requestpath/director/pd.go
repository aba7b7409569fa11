package director

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
)

// A split pick (Pick.Prefill set) runs in two legs, each accounted on its
// own endpoint: the prefill leg on the prefill pod (its uncached prompt to
// compute, one output token), the decode leg on the decode pod (only the
// prompt's tail past its last full block to compute, since the rest
// arrives by transfer, then the whole output). Each leg teaches the
// latency predictor what its endpoint did: the prefill pod its TTFT, the
// decode pod its pace per token; the decode leg's first token, which
// waits on the transfer rather than on the decode pod's own prefill, is
// measured as the transfer's time and not learned as the decode pod's TTFT.

// PrefillHandler is the request path of a front end that runs a split
// pick's prefill leg itself (the standalone proxy); *Director is one. A
// front end that leaves the legs to a sidecar on the decode pod (ext_proc)
// never calls it: the prefill pod's accounting then ends when the decode
// pod's first token comes.
type PrefillHandler interface {
	// HandlePrefill accounts for the prefill leg's end: s is the prefill
	// pod's answer (Endpoint the prefill pod), its usage and timing.
	HandlePrefill(p *Pick, s Served)
}

var _ PrefillHandler = (*Director)(nil)

// pdLegs is a split pick's prefill leg state.
type pdLegs struct {
	cand     *datalayer.Candidate
	disp     datalayer.Dispatch
	dispatch *datalayer.Dispatch
	// decodeStart is when the decode leg was sent: the prefill leg's end,
	// or the pick when a sidecar runs both legs.
	decodeStart time.Time
	ended       bool
	resp        request.Response
	// distance is how far apart the two pods run, the transfer
	// metric's label.
	distance datalayer.Distance
}

// dispatchSplit enters a split pick's legs in the in-flight accounting.
func (d *Director) dispatchSplit(p *Pick, req *request.Request, decode, prefill *datalayer.Candidate) {
	p.pd = &pdLegs{cand: prefill, decodeStart: req.Arrival, distance: prefill.Topology.DistanceTo(decode.Topology)}
	prompt := len(req.TokenIDs)
	pinfo, _ := datalayer.PrefixCacheInfoOf(prefill)
	dinfo, _ := datalayer.PrefixCacheInfoOf(decode)
	if prompt == 0 {
		prompt = pinfo.TotalBlocks * pinfo.BlockSizeTokens
	}
	if d.o.InFlight.DispatchInto(&p.pd.disp, prefill.Name, req.Arrival, prompt-pinfo.MatchTokens, prompt, 1) {
		p.pd.dispatch = &p.pd.disp
		if lat, ok := datalayer.LatencyPredictionOf(prefill); ok && lat.TTFTValid {
			p.pd.dispatch.ExpectPrefill(time.Duration(lat.TTFTAlone * float64(time.Millisecond)))
		}
		p.pd.dispatch.Announce()
	}
	// What the decode pod computes itself: the tail after the last full
	// block, which no transfer carries.
	tail := 0
	if bs := dinfo.BlockSizeTokens; bs > 0 {
		tail = prompt % bs
	}
	if d.o.InFlight.DispatchInto(&p.disp, decode.Name, req.Arrival, tail, prompt, req.MaxTokens) {
		p.dispatch = &p.disp
		if lat, ok := datalayer.LatencyPredictionOf(decode); ok && lat.TPOTValid {
			p.dispatch.ExpectDecode(time.Duration(min(lat.TPOTMean, 6e4) * float64(time.Millisecond)))
		}
		p.dispatch.Announce()
	}
}

// HandlePrefill accounts for a split pick's prefill leg: its endpoint's
// in-flight entry ends, outlier detection hears its outcome, and the
// latency predictor learns its TTFT (a prefill-only answer's end is its
// one token). A failed leg teaches nothing.
func (d *Director) HandlePrefill(p *Pick, s Served) {
	if p.pd == nil || p.pd.ended {
		return
	}
	p.pd.ended = true
	if s.End.IsZero() {
		s.End = d.o.Now()
	}
	p.pd.decodeStart = s.End
	outcome := d.Outcome(p, s)
	if outcome.Failure() {
		p.pd.dispatch.Fail()
	} else {
		p.pd.dispatch.FirstToken(s.End)
		p.pd.dispatch.DoneAt(s.End)
		d.o.Metrics.pd.prefill.Observe(s.End.Sub(p.dispatchStart()).Seconds())
	}
	if outcome != datalayer.OutcomeNone && d.o.Outliers != nil {
		d.o.Outliers.ReportOutcome(s.Endpoint, outcome)
	}
	if outcome.Failure() || len(d.o.PluginObservers) == 0 {
		return
	}
	resp := &p.pd.resp
	*resp = request.Response{
		Endpoint: s.Endpoint, Status: s.Status, Streamed: true,
		Start: p.dispatchStart(), FirstByte: s.End, End: s.End,
		PromptTokens: s.Usage.PromptTokens, CompletionTokens: s.Usage.CompletionTokens, CachedTokens: s.Usage.CachedTokens,
		RequestedModel: p.RequestedModel,
	}
	if p.pd.cand != nil && p.pd.cand.Address == s.Endpoint {
		resp.Picked = p.pd.cand
	}
	for _, o := range d.o.PluginObservers {
		o.ObserveResponse(context.Background(), p.Request, resp)
	}
}

// endSplit ends a split pick's prefill accounting when its decode leg
// ends, if no front end ended it before (a sidecar ran the prefill leg:
// it was over by the decode pod's first token), and measures the
// transfer.
func (d *Director) endSplit(p *Pick, s Served) {
	if p.pd == nil {
		return
	}
	if !p.pd.ended {
		p.pd.ended = true
		if s.FirstByte.IsZero() || s.Status >= 400 {
			p.pd.dispatch.Fail()
		} else {
			p.pd.dispatch.FirstToken(s.FirstByte)
			p.pd.dispatch.DoneAt(s.FirstByte)
		}
		return
	}
	if s.Streamed && !s.FirstByte.IsZero() && s.Status < 400 && s.FirstByte.After(p.pd.decodeStart) {
		d.o.Metrics.pd.transfer[p.pd.distance].Observe(s.FirstByte.Sub(p.pd.decodeStart).Seconds())
	}
}

// pdMetrics measure split picks' legs.
type pdMetrics struct {
	prefill prometheus.Histogram
	// transfer has a series per distance between the pods, made up front
	// so that the decode leg's end looks one up by index.
	transfer [datalayer.NumDistances]prometheus.Observer
}

func newPDMetrics(reg prometheus.Registerer) pdMetrics {
	m := pdMetrics{
		prefill: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_pd_prefill_duration_seconds",
			Help:    "Split requests' prefill legs, from the request's arrival to the prefill pod's answer.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}),
	}
	transfer := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "kvroute_pd_transfer_duration_seconds",
		Help: "Split requests' decode legs, from their sending to their first token: the KV transfer and the decode pod's wait for it; " +
			"by the distance between the prefill and decode pods (host, rack, zone, region, apart, unknown).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
	}, []string{"distance"})
	for d := range m.transfer {
		m.transfer[d] = transfer.WithLabelValues(datalayer.Distance(d).String())
	}
	if reg != nil {
		reg.MustRegister(m.prefill, transfer)
	}
	return m
}
