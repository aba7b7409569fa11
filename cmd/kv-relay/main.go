// Command kv-relay is the sidecar that carries one vLLM engine's KV-cache
// events from its ZeroMQ publisher onto NATS under kvroute's NATS contract,
// and answers snapshot requests for the engine's cache. Flags fall back to
// the environment a Kubernetes sidecar gets from the downward API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvroute/kvroute/pkg/ingest/relay"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "kv-relay:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("kv-relay", flag.ContinueOnError)
	var (
		cfg      relay.Config
		no       relay.NATSOptions
		mode     string
		httpAddr string
		logLevel string
	)
	fs.StringVar(&cfg.ZMQEndpoint, "zmq-endpoint", envOr("KV_ZMQ_ENDPOINT", relay.DefaultZMQEndpoint), "the engine's KV-event endpoint")
	fs.StringVar(&mode, "zmq-mode", envOr("KV_ZMQ_MODE", "bind"), "bind (the engine's endpoint is a plain host:port, so it dials the relay) or connect (the engine binds: its endpoint holds '*' or is ipc://)")
	fs.StringVar(&cfg.Topic, "zmq-topic", os.Getenv("KV_ZMQ_TOPIC"), "subscription topic prefix; empty takes all")
	fs.StringVar(&cfg.ReplayEndpoint, "replay-endpoint", os.Getenv("KV_REPLAY_ENDPOINT"), "the engine's replay socket (e.g. tcp://127.0.0.1:5558); empty leaves gaps unfilled")
	fs.DurationVar(&cfg.ReplayTimeout, "replay-timeout", relay.DefaultReplayTimeout, "bound on one replay")
	fs.StringVar(&cfg.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the pool's namespace (POD_NAMESPACE)")
	fs.StringVar(&cfg.Pool, "pool", os.Getenv("KV_POOL"), "the InferencePool (KV_POOL)")
	fs.StringVar(&cfg.Pod, "pod", os.Getenv("POD_NAME"), "this pod's name (POD_NAME)")
	fs.StringVar(&cfg.PodIP, "pod-ip", os.Getenv("POD_IP"), "this pod's IP, half of Kv-Endpoint (POD_IP)")
	fs.IntVar(&cfg.ServingPort, "serving-port", envInt("KV_SERVING_PORT", 8000), "the port the gateway routes to, the other half of Kv-Endpoint (KV_SERVING_PORT)")
	fs.StringVar(&cfg.Model, "model", os.Getenv("KV_MODEL"), "the served model, sent as Kv-Model (KV_MODEL)")
	fs.IntVar(&cfg.DPRank, "dp-rank", envInt("KV_DP_RANK", 0), "the engine's data-parallel rank, when its batches do not carry one")
	fs.IntVar(&cfg.BlockSize, "block-size", envInt("KV_BLOCK_SIZE", 0), "the engine's block size in tokens; 0 learns it from the first stored block")
	fs.IntVar(&cfg.BufferBatches, "buffer-batches", relay.DefaultBufferBatches, "batches held while NATS is away; past it the oldest are dropped")
	fs.IntVar(&cfg.BufferBytes, "buffer-bytes", relay.DefaultBufferBytes, "payload bytes held while NATS is away")
	fs.IntVar(&cfg.MirrorMaxBlocks, "mirror-max-blocks", relay.DefaultMirrorMaxBlocks, "bound on the cache mirror; set it to the pod's cache size in blocks, all tiers")
	fs.IntVar(&cfg.SnapshotChunkBytes, "snapshot-chunk-bytes", relay.DefaultSnapshotChunkBytes, "bound on each snapshot reply message")
	fs.StringVar(&cfg.StateDir, "state-dir", os.Getenv("KV_RELAY_STATE_DIR"), "directory that keeps the mirror across restarts of the relay (a volume the pod keeps, e.g. an emptyDir); empty keeps nothing, and a restarted relay looks like a restarted engine")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", relay.DefaultCheckpointInterval, "least time between two checkpoints of the mirror in --state-dir; between them each batch is journalled")
	fs.IntVar(&cfg.JournalMaxBytes, "journal-max-bytes", relay.DefaultJournalMaxBytes, "a checkpoint is taken before the journal in --state-dir grows past this")
	fs.DurationVar(&cfg.HeartbeatInterval, "heartbeat-interval", relay.DefaultHeartbeatInterval, "how often the relay publishes its last seq on the stream's subject, so that consumers find a lost tail; negative disables")
	fs.StringVar(&no.URL, "nats-url", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS server URL(s), comma-separated (NATS_URL)")
	no.Auth.RegisterFlags(fs)
	fs.DurationVar(&no.ReconnectWait, "nats-reconnect-wait", 250*time.Millisecond, "first NATS reconnect delay; it doubles up to --nats-reconnect-max")
	fs.DurationVar(&no.MaxReconnectWait, "nats-reconnect-max", 5*time.Second, "longest NATS reconnect delay")
	fs.StringVar(&httpAddr, "http-addr", envOr("KV_RELAY_HTTP_ADDR", ":9100"), "address of /healthz, /readyz and /metrics")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	switch mode {
	case "bind":
	case "connect":
		cfg.Connect = true
	default:
		return fmt.Errorf("--zmq-mode %q: want bind or connect", mode)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	cfg.Logger, no.Logger = log, log
	if no.Name == "" {
		no.Name = "kv-relay/" + cfg.Pod
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Registerer = reg

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	nc, err := relay.DialNATS(no)
	if err != nil {
		return err
	}
	defer nc.Close()
	r, err := relay.New(cfg, nc)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", httpAddr)
	if err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	srv := &http.Server{Handler: r.Handler(reg), ReadHeaderTimeout: 5 * time.Second}
	httpErr := make(chan error, 1)
	go func() { httpErr <- srv.Serve(ln) }()

	runErr := r.Run(ctx)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	if err := <-httpErr; err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Warn("http server", "err", err)
	}
	return runErr
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envInt(key string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(key)); err == nil {
		return v
	}
	return def
}
