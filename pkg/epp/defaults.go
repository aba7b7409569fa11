package epp

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/requestpath/selfcheck"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/localtokenizer"
)

// DefaultOptions are the options of a deployed EPP, which cmd/epp's flags
// start from: ext_proc on :9002 over TLS, gRPC health on :9003, metrics and
// health on :9090, an embedded NATS server on 127.0.0.1:4222 unless
// NATSURL is set, the pool "demo" in the namespace "default", metrics
// scraped every 50ms, text prompts tokenized by the engines' /tokenize,
// recovery, the self-check and outlier detection on. Where the zero Options differ (no
// scraping, no ext_proc, no tokenization, loopback HTTP), it is because a
// test or an embedding program asks for what it runs.
func DefaultOptions() Options {
	return Options{
		EmbeddedNATSAddr: "127.0.0.1:4222",
		Namespace:        "default",
		Pool:             "demo",
		StreamReplicas:   1,
		ReadyTimeout:     30 * time.Second,
		Consumer:         consumer.Options{MaxRanksPerEndpoint: consumer.DefaultMaxRanksPerEndpoint},
		Recovery: recovery.Options{
			Timeout:        10 * time.Second,
			MaxHeldBatches: 4096,
			MaxHeldBytes:   recovery.DefaultMaxHeldBytes,
			Concurrency:    4,
			MaxBackoff:     30 * time.Second,
		},
		SelfCheck:        selfcheck.Options{Window: 32, ToleranceShare: 0.25},
		OutlierDetection: datalayer.DefaultOutlierDetection,
		Scrape:           true,
		ScrapeOptions:    scrape.Options{Interval: 50 * time.Millisecond},
		MetricsStaleness: 2 * time.Second,
		HTTPAddr:         ":9090",
		RequestPath: RequestPathOptions{
			ExtProcAddr:  ":9002",
			HealthAddr:   ":9003",
			MaxBodyBytes: extproc.DefaultMaxBodyBytes,
			Proxy: proxy.Options{
				ReadTimeout:   proxy.DefaultReadTimeout,
				WriteTimeout:  proxy.DefaultWriteTimeout,
				IdleTimeout:   proxy.DefaultIdleTimeout,
				MaxConcurrent: proxy.DefaultMaxConcurrent,
				// Zero: a share of GOMEMLIMIT or the container's limit.
				MaxInFlightBytes: 0,
			},
			ExtProc: extproc.Options{
				MaxStreamsPerConn: extproc.DefaultMaxStreamsPerConn,
				BodyTimeout:       extproc.DefaultBodyTimeout,
				WindowBytes:       extproc.DefaultWindowBytes,
				IdleTimeout:       extproc.DefaultIdleTimeout,
				// Zero: MaxConns a share of GOMEMLIMIT or the container's
				// limit, MaxMessageBytes from the body limit.
				MaxConns:        0,
				MaxMessageBytes: 0,
			},
			Tokenize:            true,
			TokenizeTimeout:     200 * time.Millisecond,
			TokenizerDriftEvery: localtokenizer.DefaultDriftEvery,
		},
	}
}

// The cache tiers Options.Index.TierMaxAge is indexed by, so that a caller
// sets a tier's bound without the event model.
const (
	TierGPU     = events.TierGPU
	TierCPU     = events.TierCPU
	TierStorage = events.TierStorage
)

// DiscoveryFrom makes an Options.Discovery from a discovery source's
// options and constructor (k8s.SourceOptions and k8s.NewSource): the
// source is made with the EPP's datastore, objectives, registry and logger
// when the EPP is built.
func DiscoveryFrom[O any, D Discovery](opts O, newSource func(O, *datalayer.Datastore, *datalayer.Objectives, prometheus.Registerer, *slog.Logger) (D, error)) func(*datalayer.Datastore, *datalayer.Objectives, prometheus.Registerer, *slog.Logger) (Discovery, error) {
	return func(ds *datalayer.Datastore, objectives *datalayer.Objectives, reg prometheus.Registerer, logger *slog.Logger) (Discovery, error) {
		d, err := newSource(opts, ds, objectives, reg, logger)
		if err != nil {
			// Not d: a nil source in a non-nil interface.
			return nil, err
		}
		return d, nil
	}
}

// UseExtProcBufferPool makes the ext_proc server's buffer pool gRPC's
// process-wide default. gRPC marshals every outgoing message into a buffer
// from that pool, whose own clears each buffer it hands out and jumps from
// 32 KiB to 1 MiB: each 64 KiB body chunk sent back to Envoy cost a 1 MiB
// clear. gRPC allows the swap only at initialisation: call it from an
// init function.
func UseExtProcBufferPool() { experimental.SetDefaultBufferPool(extproc.BufferPool()) }
