// Command epp is kvroute's Endpoint Picker. It consumes a pool's KV events
// from NATS (an embedded server when --nats-url is empty), keeps the exact
// prefix index, and serves metrics and health (and, on a listener of its own
// when asked, /debug/prefix and pprof). The simulated
// fleet it can run against lives in cmd/kvsim, which this binary does not link.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/kvroute/kvroute/pkg/discovery/k8s"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/transport/natsauth"
)

func init() { epp.UseExtProcBufferPool() }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "epp:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	e, err := epp.New(o)
	if err != nil {
		return err
	}
	return e.Run(ctx)
}

// parse reads the flags into Options; each flag's default is
// epp.DefaultOptions' field, or the environment variable it names.
func parse(args []string) (epp.Options, error) {
	fs := flag.NewFlagSet("epp", flag.ContinueOnError)
	o := epp.DefaultOptions()
	var (
		kubeOn      bool
		kso         = k8s.SourceOptions{PoolGroup: k8s.DefaultPoolGroup}
		logLevel    string
		auth        natsauth.Config
		recoveryOn  bool
		shareOn     bool
		selfCheckOn bool
		outlierOn   bool
	)
	fs.StringVar(&o.NATSURL, "nats-url", envOr("NATS_URL", o.NATSURL), "NATS server to consume KV events from, or a cluster's members separated by commas (the client learns the others from any one); empty starts an embedded server")
	fs.StringVar(&o.EmbeddedNATSAddr, "embedded-nats-addr", o.EmbeddedNATSAddr, "client address of the embedded NATS server")
	fs.StringVar(&o.Pool, "pool-name", o.Pool, "the InferencePool whose events are consumed")
	fs.StringVar(&o.Namespace, "pool-namespace", envOr("NAMESPACE", o.Namespace), "the pool's namespace")
	fs.BoolVar(&o.JetStream, "jetstream", o.JetStream, "consume through a JetStream ordered consumer on a bounded stream (created if missing), so that a restarted EPP replays what it retains")
	fs.IntVar(&o.StreamReplicas, "jetstream-replicas", o.StreamReplicas, "replicas of the JetStream stream the EPP creates (3 on a 3-node NATS cluster)")
	fs.DurationVar(&o.ReadyGrace, "ready-grace", o.ReadyGrace, "how long readiness waits to hear every endpoint (a batch or a heartbeat) once connected; a heartbeat interval or two")
	fs.DurationVar(&o.ReadyTimeout, "ready-timeout", o.ReadyTimeout, "bound on the wait for the first catch-up (every endpoint heard, none being resynchronised) before readiness")
	fs.BoolVar(&shareOn, "share-dispatches", !o.Share.Disabled, "share what this replica dispatches with the pool's other EPP replicas over NATS (kv.dispatch.<namespace>.<pool>), so that every replica's in-flight accounting counts every replica's dispatches; off, each sees its own")
	auth.RegisterFlags(fs)
	fs.BoolVar(&recoveryOn, "recovery", !o.NoRecovery, "resynchronise uncertain streams from their relays' snapshots")
	fs.DurationVar(&o.Recovery.Timeout, "recovery-timeout", o.Recovery.Timeout, "bound on one snapshot, request to last chunk")
	fs.IntVar(&o.Recovery.MaxHeldBatches, "recovery-max-held-batches", o.Recovery.MaxHeldBatches, "live batches held back per stream while its snapshot is awaited")
	fs.IntVar(&o.Recovery.MaxHeldBytes, "recovery-max-held-bytes", o.Recovery.MaxHeldBytes, "memory the batches held back for one stream may take")
	fs.IntVar(&o.Consumer.MaxRanksPerEndpoint, "max-ranks-per-endpoint", o.Consumer.MaxRanksPerEndpoint, "data-parallel event streams one endpoint may have; batches naming further ranks are rejected")
	fs.IntVar(&o.Recovery.Concurrency, "recovery-concurrency", o.Recovery.Concurrency, "snapshots in flight at once")
	fs.DurationVar(&o.Recovery.MaxBackoff, "recovery-max-backoff", o.Recovery.MaxBackoff, "longest wait before a failed resync is tried again")
	fs.BoolVar(&selfCheckOn, "self-check", !o.NoSelfCheck, "compare every response's cached-token count with the index's prediction: per-endpoint agreement metrics, resync of endpoints that disagree, a fleet-wide alarm (docs/reliability.md)")
	fs.IntVar(&o.SelfCheck.Window, "self-check-window", o.SelfCheck.Window, "an endpoint's last checked responses judged together; more than half disagreeing resyncs it")
	fs.Float64Var(&o.SelfCheck.ToleranceShare, "self-check-tolerance", o.SelfCheck.ToleranceShare, "share of a prediction (at least one block) by which the engine's cached tokens may differ and still agree")
	od := &o.OutlierDetection
	fs.BoolVar(&outlierOn, "outlier-detection", !od.Disabled, "eject from picking the endpoints whose responses keep failing or cannot be, as Envoy's outlier detection does (docs/reliability.md)")
	fs.IntVar(&od.Consecutive5xx, "outlier-consecutive-5xx", od.Consecutive5xx, "failures in a row (5xx, refused or reset connections, answers too fast for their prompt) that eject an endpoint from picking")
	fs.DurationVar(&od.BaseEjectionTime, "outlier-base-ejection-time", od.BaseEjectionTime, "an ejection's length, times the endpoint's ejection count")
	fs.DurationVar(&od.MaxEjectionTime, "outlier-max-ejection-time", od.MaxEjectionTime, "longest ejection")
	fs.IntVar(&od.MaxEjectionPercent, "outlier-max-ejection-percent", od.MaxEjectionPercent, "most of the pool, in percent, ejected at once (a pool of two or more may always lose one)")
	fs.DurationVar(&od.Interval, "outlier-interval", od.Interval, "time healthy that forgives one past ejection")
	fs.Float64Var(&od.ProbationShare, "outlier-probation-share", od.ProbationShare, "share of requests an endpoint back from ejection is a candidate for, until its probation ends")
	fs.IntVar(&od.ProbationSuccesses, "outlier-probation-successes", od.ProbationSuccesses, "successes in a row that end probation")
	fs.Float64Var(&od.PeakPrefillRate, "outlier-peak-prefill-rate", od.PeakPrefillRate, "uncached prompt tokens a second no engine of the pool reaches: a first token sooner than the prompt takes at this rate is implausible")
	fs.StringVar(&o.EndpointsFile, "endpoints-file", o.EndpointsFile, "static endpoints YAML, reloaded when it changes")
	fs.StringVar(&o.ObjectivesFile, "objectives-file", o.ObjectivesFile, "static InferenceObjectives YAML (priority, default SLOs), reloaded when it changes; with --kubernetes the pool's InferenceObjective objects are read instead")
	fs.BoolVar(&kubeOn, "kubernetes", false, "discover endpoints from the Kubernetes API: the InferencePool --pool-name, or the pods --endpoint-selector picks")
	fs.StringVar(&kso.PoolGroup, "pool-group", kso.PoolGroup, "the InferencePool's API group")
	fs.StringVar(&kso.Selector, "endpoint-selector", kso.Selector, "standalone mode, without the InferencePool CRD: label selector of the model-server pods (implies --kubernetes)")
	fs.StringVar(&kso.TargetPorts, "endpoint-target-ports", kso.TargetPorts, "standalone mode: comma-separated serving ports of each selected pod")
	fs.StringVar(&kso.DefaultModel, "default-model", kso.DefaultModel, "model served by pods without the kvroute.io/model annotation")
	fs.BoolVar(&kso.LeaderElection, "ha-enable-leader-election", kso.LeaderElection, "elect one replica through a Lease in the pool's namespace; every replica still serves picks")
	nodeTopology := fs.Bool("node-topology", true, "read each pod's place (host, rack, zone, region) from its Node's labels; needs get/list/watch on nodes (false: endpoints carry no topology)")
	fs.StringVar(&kso.RackLabel, "topology-rack-label", k8s.DefaultRackLabel, "the Node label read as each pod's rack")
	fs.BoolVar(&o.Scrape, "scrape-metrics", o.Scrape, "scrape each endpoint's /metrics")
	fs.DurationVar(&o.ScrapeOptions.Interval, "refresh-metrics-interval", o.ScrapeOptions.Interval, "interval between scrapes of an endpoint's metrics")
	fs.StringVar(&o.HTTPAddr, "http-addr", o.HTTPAddr, "address of /metrics, /healthz and /readyz (upstream's --metrics-port)")
	fs.StringVar(&o.DebugAddr, "debug-addr", o.DebugAddr, "address of /debug/prefix (and /debug/pprof with --enable-pprof); empty serves neither. It tells whoever reaches it which prompts the engines hold: bind it to loopback (127.0.0.1:9091) and port-forward")
	fs.StringVar(&o.RequestPath.ExtProcAddr, "grpc-addr", o.RequestPath.ExtProcAddr, "address of Envoy's ext_proc gRPC service; empty disables it")
	fs.StringVar(&o.RequestPath.HealthAddr, "grpc-health-addr", o.RequestPath.HealthAddr, "address of the plaintext gRPC health service")
	secure := fs.Bool("secure-serving", !o.RequestPath.Plaintext, "serve ext_proc over TLS (a self-signed certificate unless --cert-path is given)")
	certPath := fs.String("cert-path", "", "directory holding tls.crt and tls.key for ext_proc (read again when they change)")
	fs.StringVar(&o.RequestPath.ClientCAFile, "client-ca-file", o.RequestPath.ClientCAFile, "PEM CA bundle: ext_proc then requires client certificates it signed (mutual TLS), so only the gateway can ask for picks; read again when it changes")
	fs.StringVar(&o.RequestPath.ProxyAddr, "proxy-addr", o.RequestPath.ProxyAddr, "address of the OpenAI-compatible standalone proxy; empty disables it")
	fs.IntVar(&o.RequestPath.MaxBodyBytes, "max-body-bytes", o.RequestPath.MaxBodyBytes, "largest request body accepted")
	fs.BoolVar(&o.RequestPath.NoRankPick, "no-rank-pick", o.RequestPath.NoRankPick, "leave the data-parallel rank of a pod with several behind one port to vLLM's own balancing instead of naming it in x-data-parallel-rank")
	fs.BoolVar(&o.RequestPath.PassUnknownModels, "pass-unknown-models", o.RequestPath.PassUnknownModels, "route requests for models no endpoint serves or reports as a loaded LoRA adapter, instead of refusing them with 404")
	fs.BoolVar(&o.RequestPath.FlowControl, "flow-control", o.RequestPath.FlowControl, "hold requests in the EPP by priority band and flow (x-gateway-inference-fairness-id) until an endpoint is predicted to serve them in time; a configuration with the flowControl feature gate on turns it on with its flowControl section")
	fs.BoolVar(&o.RequestPath.FlowControlWhenObjectives, "flow-control-when-objectives", o.RequestPath.FlowControlWhenObjectives, "flow control as --flow-control, for a pool with InferenceObjectives: while it defines none, requests go straight to scheduling")
	fs.BoolVar(&o.RequestPath.FlowControlBySaturation, "flow-control-by-saturation", o.RequestPath.FlowControlBySaturation, "release waiting requests on the saturation detector alone, as upstream does, instead of by predicted TTFT")
	fs.DurationVar(&o.RequestPath.Proxy.ReadTimeout, "proxy-read-timeout", o.RequestPath.Proxy.ReadTimeout, "proxy: bound on reading a request, body included")
	fs.DurationVar(&o.RequestPath.Proxy.WriteTimeout, "proxy-write-timeout", o.RequestPath.Proxy.WriteTimeout, "proxy: bound on a non-streamed response, generation included")
	fs.DurationVar(&o.RequestPath.Proxy.IdleTimeout, "proxy-idle-timeout", o.RequestPath.Proxy.IdleTimeout, "proxy: how long a kept-alive connection may sit idle")
	fs.Var(&o.RequestPath.Proxy.PrefillFailure, "proxy-prefill-failure", "proxy: what a split request gets when its prefill leg fails: refuse (502, the decode leg not sent) or decode-only (the decode pod prefills it); either is counted in kvroute_proxy_pd_prefill_failures_total")
	fs.DurationVar(&o.RequestPath.Proxy.PrefillTimeout, "proxy-prefill-timeout", o.RequestPath.Proxy.PrefillTimeout, "proxy: bound on a split request's prefill leg; 0 means 2m")
	fs.IntVar(&o.RequestPath.Proxy.MaxConcurrent, "proxy-max-concurrent", o.RequestPath.Proxy.MaxConcurrent, "proxy: requests in flight at once; more are refused with 429")
	fs.Int64Var(&o.RequestPath.Proxy.MaxInFlightBytes, "proxy-max-inflight-bytes", o.RequestPath.Proxy.MaxInFlightBytes, "proxy: request bodies held in memory at once, at ten times their size while routed; a request past it is refused with 503; 0 means an eighth of GOMEMLIMIT or the container's memory limit")
	fs.Int64Var(&o.RequestPath.ExtProc.MaxInFlightBytes, "extproc-max-inflight-bytes", o.RequestPath.ExtProc.MaxInFlightBytes, "ext_proc: request bodies held in memory at once, at ten times their size while routed (half of it for bodies still arriving); a request past it is refused with 503; 0 means an eighth of GOMEMLIMIT or the container's memory limit")
	fs.IntVar(&o.RequestPath.ExtProc.MaxStreams, "extproc-max-streams", o.RequestPath.ExtProc.MaxStreams, "ext_proc: streams open at once over all connections; one more ends with RESOURCE_EXHAUSTED; 0 means a sixteenth of GOMEMLIMIT or the container's memory limit at 32 KiB a stream")
	fs.IntVar(&o.RequestPath.ExtProc.MaxStreamsPerConn, "extproc-max-streams-per-conn", o.RequestPath.ExtProc.MaxStreamsPerConn, "ext_proc: streams one connection may have open (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS: Envoy opens another connection past it)")
	fs.IntVar(&o.RequestPath.ExtProc.MaxConns, "extproc-max-conns", o.RequestPath.ExtProc.MaxConns, "ext_proc: connections open at once; one more is closed as soon as it is accepted; 0 means a sixty-fourth of GOMEMLIMIT or the container's memory limit at 128 KiB a connection, at least 64")
	fs.IntVar(&o.RequestPath.ExtProc.WindowBytes, "extproc-window-bytes", o.RequestPath.ExtProc.WindowBytes, "ext_proc: each stream's HTTP/2 receive window, fixed (at least 64 KiB): what a client may send on a stream before the server reads it")
	fs.IntVar(&o.RequestPath.ExtProc.MaxMessageBytes, "extproc-max-message-bytes", o.RequestPath.ExtProc.MaxMessageBytes, "ext_proc: largest gRPC message from the gateway, which gRPC gathers whole before the server sees it; 0 means a body chunk of at most 1 MiB (Envoy's default buffer limit) or --max-body-bytes if less, plus 64 KiB; raise it to --max-body-bytes plus 64 KiB for a gateway that sends BUFFERED bodies over 1 MiB")
	fs.DurationVar(&o.RequestPath.ExtProc.IdleTimeout, "extproc-idle-timeout", o.RequestPath.ExtProc.IdleTimeout, "ext_proc: a connection with no stream open for this long is closed (GOAWAY)")
	fs.BoolVar(&o.RequestPath.ExtProc.EmitEndpointScores, "emit-endpoint-scores", o.RequestPath.ExtProc.EmitEndpointScores, "ext_proc: add every scored endpoint's weighted score to the envoy.lb dynamic metadata under x-gateway-destination-endpoint-scores (address to score), as upstream's flag of this name does, so that an operator can see why a pod won")
	fs.DurationVar(&o.RequestPath.ExtProc.BodyTimeout, "extproc-body-timeout", o.RequestPath.ExtProc.BodyTimeout, "ext_proc: bound from a stream's start to its request body's end; past it the request is answered 408 and the stream ended")
	fs.BoolVar(&o.RequestPath.Tokenize, "tokenize", o.RequestPath.Tokenize, "ask a model server's /tokenize for the token ids of text prompts, so their prefix answers are exact")
	fs.Var((*modelPaths)(&o.RequestPath.TokenizerFiles), "tokenizer", "MODEL=PATH: tokenize MODEL's requests in process with the tokenizer.json (or directory) at PATH; repeatable; /tokenize stays the fallback")
	fs.IntVar(&o.RequestPath.TokenizerDriftEvery, "tokenizer-drift-every", o.RequestPath.TokenizerDriftEvery, "compare one in this many local tokenizations with the model server's /tokenize; negative disables")
	fs.BoolVar(&o.RequestPath.KeepBillingHeader, "keep-billing-header", o.RequestPath.KeepBillingHeader, "render a Messages request's x-anthropic-billing-header system block, for model servers that keep it (vLLM before its Messages endpoint dropped it); by default it is dropped, as vLLM drops it")
	fs.DurationVar(&o.RequestPath.TokenizeTimeout, "tokenize-timeout", o.RequestPath.TokenizeTimeout, "bound on one /tokenize round trip; past it the request is routed approximately")
	fs.StringVar(&o.ConfigFile, "config-file", o.ConfigFile, "EndpointPickerConfig YAML file")
	fs.StringVar(&o.ConfigText, "config-text", o.ConfigText, "EndpointPickerConfig YAML text")
	fs.StringVar(&o.ConfigName, "config-name", o.ConfigName, "a named scheduling configuration instead of a file or text: predicted-latency (the default), upstream-weights, prefill-cost or precise-prefix (docs/plugins.md)")
	fs.IntVar(&o.Engine.MaxNumSeqs, "engine-max-num-seqs", o.Engine.MaxNumSeqs, "the engines' --max-num-seqs, with which the latency predictor replays each endpoint's scheduler; 0 takes the most requests an endpoint has been seen running")
	fs.IntVar(&o.Engine.MaxBatchedTokens, "engine-max-num-batched-tokens", o.Engine.MaxBatchedTokens, "the engines' --max-num-batched-tokens (a step's token budget), for the same replay; 0 means 8192, vLLM's default on H100-class GPUs (2048 on others: give the engines' value)")
	fs.DurationVar(&o.MetricsStaleness, "metrics-staleness-threshold", o.MetricsStaleness, "age after which an endpoint's scraped metrics count as unknown load")
	fs.BoolVar(&o.EnablePprof, "enable-pprof", o.EnablePprof, "serve /debug/pprof on --debug-addr")
	fs.IntVar(&o.Index.MaxHoldings, "index-max-holdings", o.Index.MaxHoldings, "bound on (block, endpoint, tier) holdings in the prefix index; 0 sizes it from GOMEMLIMIT or the container's memory limit (half of it, at 96 bytes a holding)")
	fs.IntVar(&o.Index.MaxHoldingsPerEndpoint, "index-max-holdings-per-endpoint", o.Index.MaxHoldingsPerEndpoint, "bound on one endpoint's holdings; 0 means an eighth of --index-max-holdings")
	fs.DurationVar(&o.Index.TierMaxAge[epp.TierCPU], "index-cpu-max-age", o.Index.TierMaxAge[epp.TierCPU], "evict CPU-tier holdings this long after their last store (for publishers that never remove them, such as LMCache); 0 keeps them")
	fs.DurationVar(&o.Index.TierMaxAge[epp.TierStorage], "index-storage-max-age", o.Index.TierMaxAge[epp.TierStorage], "evict storage-tier holdings this long after their last store (for publishers that never remove them); 0 keeps them")
	fs.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(logLevel)); err != nil {
		return o, fmt.Errorf("--log-level: %w", err)
	}
	o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if o.ConfigName != "" && (o.ConfigFile != "" || o.ConfigText != "") {
		return o, errors.New("--config-name excludes --config-file and --config-text")
	}
	o.NoRecovery = !recoveryOn
	o.Share.Disabled = !shareOn
	o.NoSelfCheck = !selfCheckOn
	o.OutlierDetection.Disabled = !outlierOn
	natsOpts, err := auth.Options()
	if err != nil {
		return o, err
	}
	o.NATSOptions = natsOpts
	if kubeOn || kso.Selector != "" {
		kso.Namespace, kso.Pool = o.Namespace, o.Pool
		kso.NoNodeTopology = !*nodeTopology
		o.Discovery = epp.DiscoveryFrom(kso, k8s.NewSource)
	}
	o.RequestPath.Plaintext = !*secure
	if *certPath != "" {
		o.RequestPath.CertFile = filepath.Join(*certPath, "tls.crt")
		o.RequestPath.KeyFile = filepath.Join(*certPath, "tls.key")
	}
	return o, nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// modelPaths collects repeated --tokenizer MODEL=PATH flags.
type modelPaths []string

func (m *modelPaths) String() string { return strings.Join(*m, ",") }

func (m *modelPaths) Set(v string) error {
	*m = append(*m, v)
	return nil
}
