// Command epp is kvroute's Endpoint Picker. It consumes a pool's KV events
// from NATS (an embedded server when --nats-url is empty), keeps the exact
// prefix index, and serves metrics, health and /debug/prefix. With --demo it
// also runs a simulated vLLM fleet against itself.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/demo"
	"github.com/kvroute/kvroute/pkg/epp"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	var (
		o            epp.Options
		demoOn       bool
		demoEngines  int
		demoDuration time.Duration
		scrapeEvery  time.Duration
		logLevel     string
	)
	fs.StringVar(&o.NATSURL, "nats-url", os.Getenv("NATS_URL"), "NATS server to consume KV events from; empty starts an embedded server")
	fs.StringVar(&o.EmbeddedNATSAddr, "embedded-nats-addr", "127.0.0.1:4222", "client address of the embedded NATS server")
	fs.StringVar(&o.Pool, "pool-name", "demo", "the InferencePool whose events are consumed")
	fs.StringVar(&o.Namespace, "pool-namespace", envOr("NAMESPACE", "default"), "the pool's namespace")
	fs.BoolVar(&o.JetStream, "jetstream", false, "consume through a JetStream ordered consumer instead of core NATS")
	fs.StringVar(&o.EndpointsFile, "endpoints-file", "", "static endpoints YAML, reloaded when it changes")
	fs.BoolVar(&o.Scrape, "scrape-metrics", true, "scrape each endpoint's /metrics")
	fs.DurationVar(&scrapeEvery, "refresh-metrics-interval", 50*time.Millisecond, "interval between scrapes of an endpoint's metrics")
	fs.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:9090", "address of /metrics, /healthz, /readyz and /debug/prefix")
	fs.IntVar(&o.Index.MaxHoldings, "index-max-holdings", 50_000_000, "bound on (block, endpoint, tier) holdings in the prefix index")
	fs.DurationVar(&o.Index.TierMaxAge[1], "index-cpu-max-age", 0, "evict CPU-tier holdings this long after their last store (for publishers that never remove them, such as LMCache); 0 keeps them")
	fs.BoolVar(&demoOn, "demo", false, "run a simulated vLLM fleet and a shared-prefix workload against this EPP")
	fs.IntVar(&demoEngines, "demo-engines", 4, "engines in the demo fleet")
	fs.DurationVar(&demoDuration, "demo-duration", time.Minute, "how long the demo workload runs; 0 keeps serving until interrupted")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	o.ScrapeOptions = datalayer.ScrapeOptions{Interval: scrapeEvery}
	if demoOn {
		// The demo's engines are in-process: there is no /metrics to scrape.
		o.Scrape = false
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	e, err := epp.New(o)
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	go func() { errc <- e.Run(ctx) }()
	if !demoOn {
		return <-errc
	}
	derr := demo.Run(ctx, e, demo.Options{Engines: demoEngines, Duration: demoDuration, Out: os.Stdout})
	if demoDuration > 0 {
		stop()
	}
	if rerr := <-errc; rerr != nil {
		return rerr
	}
	return derr
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
