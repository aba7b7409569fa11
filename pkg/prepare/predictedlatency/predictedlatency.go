// Package predictedlatency is the PrepareData producer that predicts, for every
// candidate of a request, its time to first token and time per output
// token (upstream's predicted-latency-producer): it reads the candidate's
// PrefixCacheInfo (tokens cached per tier, exactly), its scraped load and
// the EPP's own in-flight accounting, asks a latency backend (kvroute's
// in-process predictor, or upstream's predictor sidecar), and publishes a
// *LatencyPredictionInfo with the headroom against the request's SLOs. It
// also observes every response, so that the backend learns from what each
// endpoint then took.
package predictedlatency

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/request"
)

// Type is the producer's registered plugin type, upstream's name.
const Type = "predicted-latency-producer"

// InputKey is where the producer publishes, per candidate, the
// predict.Input it predicted from (a *predict.Input), so that the response
// of the picked one can be learned with what was known at pick time.
const InputKey = "LatencyPredictionInputKey"

// Backend predicts and learns latency.
type Backend interface {
	// PredictAll predicts ins[i] on the endpoint at addrs[i] into out[i];
	// an error means no prediction is valid.
	PredictAll(ctx context.Context, addrs []string, ins []predict.Input, out []predict.Prediction) error
	// Observe learns from one response; it must not block.
	Observe(s predict.Sample)
	// Quantile is the quantile the backend predicts besides the mean.
	Quantile() float64
}

// InProcess is kvroute's own predictor as a Backend.
type InProcess struct{ P *predict.Predictor }

// PredictAll implements Backend; it cannot fail.
func (b InProcess) PredictAll(_ context.Context, addrs []string, ins []predict.Input, out []predict.Prediction) error {
	for i := range ins {
		out[i] = b.P.Predict(addrs[i], &ins[i])
	}
	return nil
}

// Observe implements Backend.
func (b InProcess) Observe(s predict.Sample) { b.P.Observe(s) }

// Quantile implements Backend.
func (b InProcess) Quantile() float64 { return b.P.Quantile() }

// charsPerToken estimates a prompt's tokens from its text when neither its
// token ids nor its block count are known.
const charsPerToken = 4

// Producer is the predicted-latency-producer.
type Producer struct {
	name      string
	backend   Backend
	staleness time.Duration
	m         *metrics
}

var (
	_ prepare.DataProducer    = (*Producer)(nil)
	_ plugin.ResponseObserver = (*Producer)(nil)
)

// New returns a producer predicting with backend. Scraped metrics older
// than staleness count as unknown. Its metrics are registered with reg
// unless reg is nil; a producer made again with the same reg (a reload)
// shares them.
func New(name string, backend Backend, staleness time.Duration, reg prometheus.Registerer) (*Producer, error) {
	if name == "" {
		name = Type
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &Producer{name: name, backend: backend, staleness: staleness, m: m}, nil
}

// TypedName implements plugin.Plugin.
func (p *Producer) TypedName() plugin.TypedName { return plugin.TypedName{Type: Type, Name: p.name} }

// Produces implements plugin.Producer.
func (p *Producer) Produces() map[string]any {
	return map[string]any{
		datalayer.LatencyPredictionInfoKey: (*datalayer.LatencyPredictionInfo)(nil),
		InputKey:                           (*predict.Input)(nil),
	}
}

// ProducesInline implements prepare.InlineProducer: kvroute's own
// predictor predicts from memory, so the request's goroutine runs it; a
// sidecar is asked over the network, on a goroutine of its own.
func (p *Producer) ProducesInline() bool {
	switch p.backend.(type) {
	case InProcess, *InProcess:
		return true
	}
	return false
}

// Consumes implements plugin.Consumer: the prefix match per tier is the
// prediction's main input.
func (p *Producer) Consumes() map[string]any {
	return map[string]any{datalayer.PrefixCacheMatchInfoKey: datalayer.PrefixCacheInfo{}}
}

// scratch is one Produce call's working memory for the backend besides
// the inputs: the addresses and predictions as the Backend takes them.
// Nothing keeps it past the call, so it is pooled.
type scratch struct {
	addrs []string
	out   []predict.Prediction
}

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Produce implements prepare.DataProducer. What it publishes on each
// candidate, the prediction and the input it was made from, sits behind
// pointers into memory that lives as long as the request's candidates
// (datalayer.RequestMemory), so that publishing boxes nothing and, when
// the candidates' memory is reused, allocates nothing either.
func (p *Producer) Produce(ctx context.Context, req *request.Request, cands []*datalayer.Candidate) error {
	n := len(cands)
	sc := scratchPool.Get().(*scratch)
	defer func() {
		clear(sc.addrs) // drop the strings, so the pool keeps no endpoint alive
		scratchPool.Put(sc)
	}()
	sc.addrs = slices.Grow(sc.addrs[:0], n)[:n]
	sc.out = slices.Grow(sc.out[:0], n)[:n]
	// Each input and info is written whole below (inputOf assigns the
	// input; the info is assigned before its fields are set).
	ins := datalayer.RequestMemoryOverwritten[predict.Input](cands, p, n)
	infos := datalayer.RequestMemoryOverwritten[datalayer.LatencyPredictionInfo](cands, p, n)
	now := time.Now()
	for i, c := range cands {
		sc.addrs[i] = c.Address
		inputOf(&ins[i], req, c, now, p.staleness)
	}
	start := time.Now()
	err := p.backend.PredictAll(ctx, sc.addrs, ins, sc.out)
	took := time.Since(start).Seconds()
	p.m.ttftDuration.Observe(took)
	p.m.tpotDuration.Observe(took)
	if err != nil {
		p.m.failures.Inc()
	}
	q := p.backend.Quantile()
	for i, c := range cands {
		info := &infos[i]
		*info = datalayer.LatencyPredictionInfo{Quantile: q, DispatchedRequestCount: c.InFlight.Requests()}
		if err == nil {
			pr := &sc.out[i]
			info.TTFTValid, info.TPOTValid = true, true
			info.TTFT, info.TTFTMean, info.TPOT, info.TPOTMean = pr.TTFTQuantile, pr.TTFT, pr.TPOTQuantile, pr.TPOT
			info.TTFTAlone = pr.TTFTAlone
			if slo := req.SLO.TTFT; slo > 0 {
				info.HasTTFTSLO, info.TTFTHeadroom = true, ms(slo)-info.TTFT
			}
			if slo := req.SLO.TPOT; slo > 0 {
				info.HasTPOTSLO, info.TPOTHeadroom = true, ms(slo)-info.TPOT
			}
		}
		c.Put(datalayer.LatencyPredictionInfoKey, info)
		c.Put(InputKey, &ins[i])
	}
	return err
}

// matchCredit is the share of a prefix match counted as cached, by how far
// the index's answer can be trusted (docs/reliability.md): exact and
// partial matches are held (partial is a lower bound), so they count in
// full; a recovering stream's answer is likely right but may be stale, an
// uncertain one's and the routing history's (none) are guesses, so part
// of what they claim is predicted as tokens to compute. The rest of the
// prediction is then on the cautious side where the cache is in doubt.
var matchCredit = [datalayer.NumStreamStates]float64{
	datalayer.StreamExact:      1,
	datalayer.StreamPartial:    1,
	datalayer.StreamRecovering: 0.75,
	datalayer.StreamUncertain:  0.5,
	datalayer.StreamNone:       0.5,
}

// inputOf is what is known of req on c when it is picked.
// It fills in, which may hold an earlier request's input, whole.
func inputOf(in *predict.Input, req *request.Request, c *datalayer.Candidate, now time.Time, staleness time.Duration) {
	info, _ := datalayer.PrefixCacheInfoOf(c)
	bs := info.BlockSizeTokens
	credit := func(blocks int) int { return int(float64(blocks*bs) * matchCredit[info.State]) }
	*in = predict.Input{
		InputTokens:       len(req.TokenIDs),
		GPUTokens:         credit(info.BlocksByTier[events.TierGPU]),
		CPUTokens:         credit(info.BlocksByTier[events.TierCPU]),
		StorageTokens:     credit(info.BlocksByTier[events.TierStorage]),
		SpeculativeTokens: info.SpeculativeBlocks * bs,
		Prefilling:        c.InFlight.Prefilling,
		PrefillTokens:     c.InFlight.PrefillTokens,
		Decoding:          c.InFlight.Decoding,
		DecodeTokens:      c.InFlight.DecodeTokens,
		MaxTokens:         req.MaxTokens,
	}
	// The in-flight times are Unix nanoseconds: read against the
	// arrival's, without a time.Time for each of them.
	arrival := int64(0)
	if !req.Arrival.IsZero() {
		arrival = req.Arrival.UnixNano()
	}
	for _, end := range c.InFlight.DecodeEnds[:min(len(c.InFlight.DecodeEnds), len(in.DecodeEndsMs))] {
		if end == 0 {
			break
		}
		in.DecodeEndsMs[in.DecodeEnds] = nsToMs(arrival, end)
		in.DecodeEnds++
	}
	in.OldestPrefillMs = nsToMs(c.InFlight.OldestPrefill, arrival)
	in.PrefillAheadMs = nsToMs(arrival, c.InFlight.PrefillDoneBy)
	in.Ahead = c.InFlight.Ahead
	drainAhead(&in.Ahead, &c.InFlight, arrival)
	in.RecentPrefillRate = c.InFlight.RecentPrefillRate(arrival)
	in.RecentEnds = c.InFlight.RecentEndsNow(arrival)
	for _, end := range c.InFlight.Ended[:min(len(c.InFlight.Ended), len(in.EndedAgoMs))] {
		if end == 0 {
			break
		}
		in.EndedAgoMs[in.EndedN] = nsToMs(end, arrival)
		in.EndedN++
	}
	in.StepRestMs = nsToMs(arrival, c.InFlight.StepEnd)
	in.StepElapsedMs = nsToMs(c.InFlight.StepStart, arrival)
	if in.InputTokens == 0 {
		in.InputTokens = info.TotalBlocks * bs
	}
	if in.InputTokens == 0 {
		in.InputTokens = len(req.Prompt) / charsPerToken
	}
	if c.Metrics.Fresh(now, staleness) {
		in.Waiting, in.Running, in.KVUsage = c.Metrics.WaitingQueueSize, c.Metrics.RunningRequests, c.Metrics.KVCacheUsage
	} else {
		in.MetricsStale = true
	}
	if rank, ok := datalayer.PickRank(&info, c.RankLoads, in.InputTokens, c.Metrics.DataParallelRanks); ok {
		rankInput(in, &info, c, rank)
	}
}

// rankInput makes in the input of the data-parallel rank a rank pick
// names (datalayer.PickRank, as the director will): a pod of ranks serves
// a request on one of them, an engine with its own cache and scheduler.
// The rank's trusted match is its cached prefix (all of it as GPU: the
// index keeps a rank's keys, not their tiers), its in-flight work the
// rank's share of the pod's, and the pod's scraped queues are shared out
// over its ranks. The replay of the pod's requests (Ahead, the decode
// ends and the prefill queue's end) runs them as one scheduler's, which
// they are not: it is left out, as for an endpoint with nothing replayed.
func rankInput(in *predict.Input, info *datalayer.PrefixCacheInfo, c *datalayer.Candidate, rank int) {
	bs := info.BlockSizeTokens
	matched := 0
	ranks := info.RankList()
	for _, r := range ranks {
		if r.Rank == rank {
			matched = r.Trusted()
		}
	}
	in.GPUTokens, in.CPUTokens, in.StorageTokens, in.SpeculativeTokens = matched*bs, 0, 0, 0
	var l datalayer.RankLoad
	if rank < len(c.RankLoads) {
		l = c.RankLoads[rank]
	}
	if c.InFlight.Decoding > 0 {
		in.DecodeTokens = c.InFlight.DecodeTokens * min(l.Decoding, c.InFlight.Decoding) / c.InFlight.Decoding
	} else {
		in.DecodeTokens = 0
	}
	in.Prefilling, in.PrefillTokens, in.Decoding = l.Prefilling, l.PrefillTokens, l.Decoding
	n := max(c.Metrics.DataParallelRanks, len(c.RankLoads), 1)
	if len(ranks) > 0 {
		n = max(n, ranks[len(ranks)-1].Rank+1)
	}
	in.Waiting, in.Running = in.Waiting/n, in.Running/n
	in.Ahead, in.DecodeEnds, in.PrefillAheadMs = enginesched.Ahead{}, 0, 0
}

// drainAhead takes off the replay's prefills ahead the share that has
// run since it was replayed: the replay runs at each change to the
// requests in flight, and a long prefill changes nothing until its first
// token, so by a request's arrival part of what the replay counts ahead
// is done. The share is time's, from the prefill queue's expected end.
// Times are Unix nanoseconds, arrival's as the in-flight state's.
func drainAhead(a *enginesched.Ahead, f *datalayer.InFlight, arrival int64) {
	if a.PrefillTokens == 0 || f.PrefillDoneBy == 0 || f.ReplayedAt == 0 || arrival <= f.ReplayedAt {
		return
	}
	left := f.PrefillDoneBy - arrival
	whole := f.PrefillDoneBy - f.ReplayedAt
	if whole <= 0 {
		return
	}
	share := min(max(float64(left)/float64(whole), 0), 1)
	a.PrefillTokens = int(float64(a.PrefillTokens) * share)
	a.PrefillContext = int64(float64(a.PrefillContext) * share)
}

// ObserveResponse implements plugin.ResponseObserver: the picked
// endpoint's prediction is compared with what it took, counted against
// the SLOs, and learned from.
func (p *Producer) ObserveResponse(_ context.Context, req *request.Request, resp *request.Response) {
	if resp.Picked == nil || resp.Status >= 400 || resp.Status == 0 {
		return
	}
	v, ok := resp.Picked.Get(InputKey)
	in, _ := v.(*predict.Input)
	if !ok || in == nil {
		return
	}
	info, _ := datalayer.LatencyPredictionOf(resp.Picked)
	model := []string{resp.RequestedModel, req.Model}
	s := predict.Sample{Endpoint: resp.Endpoint, Input: *in, OutputTokens: resp.CompletionTokens, Start: resp.Start, End: resp.End}
	if ttft, ok := resp.TTFT(); ok {
		s.TTFTMs, s.HasTTFT = ms(ttft), true
		if info.TTFTValid {
			p.m.predictedTTFT.WithLabelValues(model...).Observe(info.TTFT / 1e3)
			p.m.accuracy(resp.Endpoint, "ttft", info.TTFTMean, info.TTFT, s.TTFTMs)
		}
		if slo := req.SLO.TTFT; slo > 0 && ttft > slo {
			p.m.violations.WithLabelValues(append(model, "ttft")...).Inc()
		}
	}
	if tpot, ok := resp.TPOT(); ok {
		s.TPOTMs, s.HasTPOT = ms(tpot), true
		if info.TPOTValid {
			p.m.predictedTPOT.WithLabelValues(model...).Observe(info.TPOT / 1e3)
			p.m.accuracy(resp.Endpoint, "tpot", info.TPOTMean, info.TPOT, s.TPOTMs)
		}
		if slo := req.SLO.TPOT; slo > 0 && tpot > slo {
			p.m.violations.WithLabelValues(append(model, "tpot")...).Inc()
		}
	}
	if s.HasTTFT || s.HasTPOT {
		p.backend.Observe(s)
	}
}

// ForgetEndpoint drops the per-endpoint series of an endpoint that left.
func (p *Producer) ForgetEndpoint(addr string) {
	for _, target := range []string{"ttft", "tpot"} {
		p.m.ape.DeleteLabelValues(addr, target)
		for _, within := range []string{"true", "false"} {
			p.m.coverage.DeleteLabelValues(addr, target, within)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// nsToMs is the milliseconds from from to to, times in Unix nanoseconds:
// 0 when either is unknown (zero) or to is not after from.
func nsToMs(from, to int64) float64 {
	if from == 0 || to == 0 || to <= from {
		return 0
	}
	return float64(to-from) / float64(time.Millisecond)
}

type metrics struct {
	predictedTTFT, predictedTPOT *prometheus.HistogramVec
	ttftDuration, tpotDuration   prometheus.Histogram
	violations                   *prometheus.CounterVec
	failures                     prometheus.Counter
	ape                          *prometheus.HistogramVec
	coverage                     *prometheus.CounterVec
}

func (m *metrics) accuracy(addr, target string, mean, quant, actual float64) {
	if actual > 0 {
		m.ape.WithLabelValues(addr, target).Observe(math.Abs(mean-actual) / actual)
	}
	within := "false"
	if actual <= quant {
		within = "true"
	}
	m.coverage.WithLabelValues(addr, target, within).Inc()
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	model := []string{"model_name", "target_model_name"}
	lat := prometheus.ExponentialBuckets(0.001, 2, 16)
	m := &metrics{
		predictedTTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_request_predicted_ttft_seconds", Buckets: lat,
			Help: "Predicted time to first token (the configured quantile) of the endpoint each request was sent to.",
		}, model),
		predictedTPOT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "inference_objective_request_predicted_tpot_seconds", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
			Help: "Predicted time per output token (the configured quantile) of the endpoint each request was sent to.",
		}, model),
		ttftDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "inference_objective_request_ttft_prediction_duration_seconds", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
			Help: "Time to predict every candidate's latency for one request (TTFT and TPOT are predicted together).",
		}),
		tpotDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "inference_objective_request_tpot_prediction_duration_seconds", Buckets: prometheus.ExponentialBuckets(1e-6, 4, 12),
			Help: "Time to predict every candidate's latency for one request (TTFT and TPOT are predicted together).",
		}),
		violations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inference_objective_request_slo_violation_total",
			Help: "Requests whose TTFT or TPOT exceeded their SLO, by type.",
		}, append(model, "type")),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvroute_latency_prediction_failures_total",
			Help: "Requests whose latency backend failed to predict (a sidecar that did not answer).",
		}),
		ape: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kvroute_latency_prediction_abs_percentage_error",
			Help:    "|predicted mean - actual| / actual of the picked endpoint, per endpoint and target (ttft, tpot).",
			Buckets: []float64{0.05, 0.1, 0.15, 0.25, 0.5, 1, 2},
		}, []string{"endpoint", "target"}),
		coverage: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_latency_prediction_quantile_observations_total",
			Help: "Responses by whether the actual latency was within the predicted quantile; within/all is the quantile's coverage.",
		}, []string{"endpoint", "target", "within_quantile"}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	if m.predictedTTFT, err = prepare.RegisterOrReuse(reg, m.predictedTTFT); err != nil {
		return nil, err
	}
	if m.predictedTPOT, err = prepare.RegisterOrReuse(reg, m.predictedTPOT); err != nil {
		return nil, err
	}
	if m.ttftDuration, err = prepare.RegisterOrReuse(reg, m.ttftDuration); err != nil {
		return nil, err
	}
	if m.tpotDuration, err = prepare.RegisterOrReuse(reg, m.tpotDuration); err != nil {
		return nil, err
	}
	if m.violations, err = prepare.RegisterOrReuse(reg, m.violations); err != nil {
		return nil, err
	}
	if m.failures, err = prepare.RegisterOrReuse(reg, m.failures); err != nil {
		return nil, err
	}
	if m.ape, err = prepare.RegisterOrReuse(reg, m.ape); err != nil {
		return nil, err
	}
	if m.coverage, err = prepare.RegisterOrReuse(reg, m.coverage); err != nil {
		return nil, err
	}
	return m, nil
}

// Params are the producer's configuration parameters: which backend it
// predicts with and how that learns.
type Params struct {
	// Quantile is the quantile predicted besides the mean (default 0.9).
	Quantile float64 `json:"quantile,omitempty"`
	// Method is the in-process predictor's learning method (ewls, the
	// default, or quantile-sgd).
	Method string `json:"method,omitempty"`
	// Prior is the cold start, in milliseconds per unit (predict.Prior).
	Prior *predict.Prior `json:"prior,omitempty"`
	// Memory is how many recent observations per endpoint weigh most.
	Memory int `json:"memory,omitempty"`
	// ClassLabel is the endpoint label that names its hardware: a new
	// endpoint starts from what was learned of endpoints with the same
	// model and label value (default DefaultClassLabel).
	ClassLabel string `json:"classLabel,omitempty"`
	// Sidecar, when set, predicts with upstream's latency predictor
	// sidecar instead of in process.
	Sidecar *SidecarParams `json:"sidecar,omitempty"`
}

// SidecarParams locate upstream's predictor sidecar.
type SidecarParams struct {
	// PredictionURL serves /predict/bulk/strict (upstream's default
	// http://localhost:8001); TrainingURL serves /add_training_data_bulk
	// (http://localhost:8000).
	PredictionURL string `json:"predictionURL,omitempty"`
	TrainingURL   string `json:"trainingURL,omitempty"`
	// Timeout bounds one prediction call, a Go duration (default 50ms,
	// within the PrepareData deadline).
	Timeout string `json:"timeout,omitempty"`
}

// DefaultClassLabel is the endpoint label naming an endpoint's hardware.
const DefaultClassLabel = "kvroute.io/accelerator"

// Class is the endpoint's class for the predictor: its model and its
// hardware, as label names it.
func Class(ep *datalayer.Endpoint, label string) string {
	if label == "" {
		label = DefaultClassLabel
	}
	return ep.Model + "/" + ep.Labels[label]
}
