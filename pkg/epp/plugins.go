package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/predict/sidecar"
	"github.com/kvroute/kvroute/pkg/prepare/predictedlatency"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/prepare/routinghistory"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// newRegistry is the in-tree plugin registry plus the plugins that need
// this process's state: the precise prefix producer (the index), registered
// as the default producer of the keys it publishes, whose parameters start
// from defaults and are overridden by those its configuration gives; and
// the predicted-latency producer (a latency predictor of its own, which
// lat keeps so that the EPP runs it and tells it of endpoints).
func newRegistry(defaults prefixmatch.Params, index prefixmatch.Index, approx prefixmatch.Approx, lat *latencySetup) (*config.Registry, error) {
	r := config.NewInTreeRegistry()
	if err := r.Register(predictedlatency.Type, lat.factory); err != nil {
		return nil, err
	}
	for _, key := range []string{datalayer.LatencyPredictionInfoKey, predictedlatency.InputKey} {
		if err := r.RegisterDefaultProducer(key, predictedlatency.Type); err != nil {
			return nil, err
		}
	}
	err := r.Register(prefixmatch.Type, func(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		p := defaults
		if err := framework.DecodeParams(prefixmatch.Type, name, raw, &p); err != nil {
			return nil, err
		}
		return prefixmatch.New(name, p, index, approx), nil
	})
	if err != nil {
		return nil, err
	}
	for _, key := range []string{datalayer.PrefixCacheMatchInfoKey, prefixmatch.RequestBlockKeysKey} {
		if err := r.RegisterDefaultProducer(key, prefixmatch.Type); err != nil {
			return nil, err
		}
	}
	// The routing history is the approximate index: one record of where
	// prefixes were sent, whoever reads it.
	err = r.Register(routinghistory.Type, func(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
		var p struct{}
		if err := framework.DecodeParams(routinghistory.Type, name, raw, &p); err != nil {
			return nil, err
		}
		return routinghistory.New(name, approx), nil
	})
	if err != nil {
		return nil, err
	}
	if err := r.RegisterDefaultProducer(datalayer.RoutedPrefixKey, routinghistory.Type); err != nil {
		return nil, err
	}
	return r, nil
}

// prefixParams are the producer defaults o asks for, with its zero fields
// taken from prefixmatch.DefaultParams.
func prefixParams(o prefixmatch.Params) prefixmatch.Params {
	p := prefixmatch.DefaultParams()
	if o.DefaultBlockSizeTokens > 0 {
		p.DefaultBlockSizeTokens = o.DefaultBlockSizeTokens
	}
	if o.MaxPrefixBlocks > 0 {
		p.MaxPrefixBlocks = o.MaxPrefixBlocks
	}
	if o.ApproxBlockSizeTokens > 0 {
		p.ApproxBlockSizeTokens = o.ApproxBlockSizeTokens
	}
	if o.ApproxMaxBlocks > 0 {
		p.ApproxMaxBlocks = o.ApproxMaxBlocks
	}
	return p
}

// speculator records, after a pick, that the picked endpoint will soon hold
// the request's blocks: as a short-lived speculative holding in the exact
// index (until its events confirm it), and in the approximate index's
// routing history, which is all there is for endpoints without events;
// and it keeps that routing history for every endpoint on behalf of a
// plugin that places by it (RecordHistory).
type speculator struct {
	index     *index.Index
	approx    *approx.Index
	maxApprox int
}

func (s *speculator) Speculate(addr string, keys []uint64, held int) {
	s.index.Speculate(addr, keys[held:])
	// The routing history answers only for endpoints whose event stream is
	// missing or uncertain; teaching it the picks of an exact endpoint
	// would cost an LRU update per block on every request for nothing.
	if state, _ := s.index.State(addr); state != datalayer.StreamExact {
		s.approx.Record(addr, keys[:min(len(keys), s.maxApprox)])
	}
}

// RecordHistory remembers that a request's hashes (its block keys, or its
// text's hashes when the token ids were unknown) were sent to addr, up to
// the routing history's match cap: longer prefixes are never matched
// further.
func (s *speculator) RecordHistory(addr string, hashes []uint64) {
	if s.maxApprox > 0 {
		hashes = hashes[:min(len(hashes), s.maxApprox)]
	}
	s.approx.Record(addr, hashes)
}

// PredictOptions adjust every in-process latency predictor a scheduling
// configuration makes.
type PredictOptions struct {
	// Synchronous learns each response as it is observed rather than on
	// the predictor's goroutine: for runs in virtual time, which must
	// repeat exactly.
	Synchronous bool
	// Record, when set, is given every observation learned (traces for
	// offline evaluation).
	Record func(predict.Sample)
}

// latencySetup makes the predicted-latency producers of a configuration
// and keeps what the EPP must run and keep informed of endpoints.
type latencySetup struct {
	opts   PredictOptions
	reg    prometheus.Registerer
	logger *slog.Logger
	made   []*latencyInstance
}

type latencyInstance struct {
	producer   *predictedlatency.Producer
	predictor  *predict.Predictor // nil with a sidecar
	sidecar    *sidecar.Client
	classLabel string
}

func (l *latencySetup) factory(name string, raw json.RawMessage, h framework.Handle) (plugin.Plugin, error) {
	var p predictedlatency.Params
	if err := framework.DecodeParams(predictedlatency.Type, name, raw, &p); err != nil {
		return nil, err
	}
	// Each instance's metrics carry its name, so that two can coexist.
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"predictor": name}, l.reg)
	inst := &latencyInstance{classLabel: p.ClassLabel}
	var backend predictedlatency.Backend
	if sc := p.Sidecar; sc != nil {
		o := sidecar.Options{PredictionURL: sc.PredictionURL, TrainingURL: sc.TrainingURL, Quantile: p.Quantile, Registerer: reg, Logger: l.logger}
		if o.PredictionURL == "" {
			o.PredictionURL = "http://localhost:8001"
		}
		if o.TrainingURL == "" {
			o.TrainingURL = "http://localhost:8000"
		}
		if sc.Timeout != "" {
			d, err := time.ParseDuration(sc.Timeout)
			if err != nil || d <= 0 {
				return nil, framework.ParamError(predictedlatency.Type, name, "sidecar.timeout %q is not a positive duration", sc.Timeout)
			}
			o.Timeout = d
		}
		if p.Method != "" || p.Prior != nil || p.Memory != 0 {
			return nil, framework.ParamError(predictedlatency.Type, name, "method, prior and memory tune the in-process predictor, not a sidecar")
		}
		c, err := sidecar.New(o)
		if err != nil {
			return nil, framework.ParamError(predictedlatency.Type, name, "%v", err)
		}
		inst.sidecar, backend = c, c
	} else {
		pr, err := predict.New(predict.Options{
			Quantile: p.Quantile, Method: p.Method, Prior: p.Prior, Memory: p.Memory,
			Synchronous: l.opts.Synchronous, Record: l.opts.Record, Registerer: reg,
		})
		if err != nil {
			return nil, framework.ParamError(predictedlatency.Type, name, "%v", err)
		}
		inst.predictor, backend = pr, predictedlatency.InProcess{P: pr}
	}
	prod, err := predictedlatency.New(name, backend, framework.StalenessOf(h), l.reg)
	if err != nil {
		return nil, fmt.Errorf("plugin %q: %w", name, err)
	}
	inst.producer = prod
	l.made = append(l.made, inst)
	return prod, nil
}

// follow keeps every predictor's endpoints those of ds.
func (l *latencySetup) follow(ds *datalayer.Datastore) {
	for _, inst := range l.made {
		ds.OnChange(func(added, removed []*datalayer.Endpoint) {
			for _, ep := range removed {
				if inst.predictor != nil {
					inst.predictor.RemoveEndpoint(ep.Address)
				}
				inst.producer.ForgetEndpoint(ep.Address)
			}
			for _, ep := range added {
				if inst.predictor != nil {
					inst.predictor.AddEndpoint(ep.Address, predictedlatency.Class(ep, inst.classLabel))
				}
			}
		})
	}
}

// run runs every predictor's learning (or sidecar's flushing) with goRun.
func (l *latencySetup) run(ctx context.Context, goRun func(func() error)) {
	for _, inst := range l.made {
		switch {
		case inst.predictor != nil && !l.opts.Synchronous:
			goRun(func() error { return inst.predictor.Run(ctx) })
		case inst.sidecar != nil:
			goRun(func() error { return inst.sidecar.Run(ctx) })
		}
	}
}
