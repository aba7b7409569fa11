package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/discovery/k8s"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/sim"
)

// Policies that run the production path: the engines are Pods of an
// InferencePool on envtest's API server, each on its own loopback address
// with the pool's one port, and every request goes through the Envoy-like
// gateway (pkg/harness/gateway), which asks the EPP over ext_proc and
// forwards to the endpoint it names.
const (
	// PolicyUpstreamEPP is the upstream EPP's own binary
	// (upstreamepp.Version) with its built-in configuration.
	PolicyUpstreamEPP = "upstream-epp"
	// PolicyUpstreamEPPApprox is the same binary with the configuration
	// its Helm chart deploys (upstreamepp.ConfigApprox).
	PolicyUpstreamEPPApprox = "upstream-epp-approx"
	// PolicyKvrouteUpstreamConfig is kvroute's EPP loaded with that same
	// file, discovering the same pool, hearing the engines' KV events: the
	// drop-in case.
	PolicyKvrouteUpstreamConfig = "kvroute-upstream-config"
)

// GatewayPolicies are the policies routed through the gateway.
var GatewayPolicies = []string{PolicyUpstreamEPP, PolicyUpstreamEPPApprox, PolicyKvrouteUpstreamConfig}

// viaGateway says whether a policy runs through the gateway on pod
// addresses (StartEnv then starts a cluster, not the proxy).
func viaGateway(policy string) bool {
	switch policy {
	case PolicyUpstreamEPP, PolicyUpstreamEPPApprox, PolicyKvrouteUpstreamConfig:
		return true
	}
	return false
}

// gatewayEnv is what a gateway policy starts beside the fleet.
type gatewayEnv struct {
	pods     *upstreamepp.PodListeners
	cluster  *upstreamepp.Cluster
	upstream *upstreamepp.EPP
	gw       *gateway.Gateway
	report   string
}

// startGatewayEnv starts env for a gateway policy: pod listeners, the
// cluster that lists them, the EPP (the upstream binary as a child, or
// kvroute's in process), the fleet on the pods' addresses and the gateway
// in front of the EPP.
func startGatewayEnv(ctx context.Context, env *Env, fo FleetOptions, seed uint64) error {
	g := &gatewayEnv{}
	env.ring = g
	var err error
	if g.pods, err = upstreamepp.ListenPods(fo.Engines); err != nil {
		return err
	}
	fc := fo.fleetConfig(seed)
	fc.Listen = g.pods.Listen
	pods := make([]upstreamepp.Pod, fo.Engines)
	for i := range pods {
		// The fleet names engine i's pod so (sim.FleetConfig.EngineConfig).
		pods[i] = upstreamepp.Pod{Name: fc.EngineConfig(i, "").Pod, IP: upstreamepp.PodIP(i)}
	}
	if g.cluster, err = upstreamepp.StartCluster(ctx, upstreamepp.ClusterOptions{Port: g.pods.Port, Pods: pods}); err != nil {
		return err
	}
	host := gateway.Host{Name: env.Policy}
	switch env.Policy {
	case PolicyUpstreamEPP, PolicyUpstreamEPPApprox:
		o := upstreamepp.EPPOptions{Name: env.Policy, OutDir: fo.OutDir}
		if env.Policy == PolicyUpstreamEPPApprox {
			o.Config, o.ConfigName = upstreamepp.ConfigApprox, upstreamepp.ConfigApproxName
		}
		// The engines come first: the EPP is ready once it has scraped
		// them.
		if env.Fleet, err = sim.StartFleet(ctx, fc); err != nil {
			return err
		}
		if g.upstream, err = g.cluster.StartEPP(ctx, o); err != nil {
			return err
		}
		if err := g.upstream.WaitScraped(ctx); err != nil {
			return err
		}
		host.ExtProcAddr, host.HealthAddr = g.upstream.Addr(), g.upstream.HealthAddr()
		g.report = g.upstream.Report()
	case PolicyKvrouteUpstreamConfig:
		if err := startDropIn(ctx, env, g, fo, fc); err != nil {
			return err
		}
		host.ExtProcAddr = env.EPP.ExtProcAddr()
		g.report = fmt.Sprintf("kvroute's EPP with the upstream configuration file %s:\n%s", upstreamepp.ConfigApproxName, upstreamepp.ConfigApprox)
	default:
		return fmt.Errorf("loadgen: %q is no gateway policy", env.Policy)
	}
	if fo.OutDir != "" {
		if err := os.MkdirAll(fo.OutDir, 0o755); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		if err := os.WriteFile(filepath.Join(fo.OutDir, env.Policy+".report.txt"), []byte(g.report), 0o644); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
	}
	if g.gw, err = gateway.Start(gateway.Options{
		Hosts:  []gateway.Host{host},
		Health: gateway.HealthCheck{Interval: 200 * time.Millisecond},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}); err != nil {
		return err
	}
	env.router = viaProxy{url: g.gw.URL()}
	return g.waitHealthy(ctx)
}

// startDropIn starts kvroute's EPP on the upstream configuration file,
// discovering the pool from the cluster, and the fleet publishing its KV
// events to the EPP's NATS.
func startDropIn(ctx context.Context, env *Env, g *gatewayEnv, fo FleetOptions, fc sim.FleetConfig) error {
	e, err := epp.New(epp.Options{
		Namespace: g.cluster.Namespace(), Pool: g.cluster.Pool(),
		EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0",
		ConfigText: upstreamepp.ConfigApprox, Scrape: true, Engine: fo.engineLimits(),
		ScrapeOptions: scrape.Options{Interval: 50 * time.Millisecond},
		Prefix:        prefixmatch.Params{DefaultBlockSizeTokens: fo.Pool.BlockSize},
		RequestPath: epp.RequestPathOptions{
			ExtProcAddr: "127.0.0.1:0", Plaintext: true,
			Tokenize: true, TokenizeTimeout: 5 * time.Second, Tokenizer: simkit.Tokenizer{Model: fo.Model},
		},
		Discovery: epp.DiscoveryFrom(k8s.SourceOptions{
			Namespace: g.cluster.Namespace(), Pool: g.cluster.Pool(), Config: g.cluster.Config(), DefaultModel: fo.Model,
		}, k8s.NewSource),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return fmt.Errorf("loadgen: EPP: %w", err)
	}
	env.EPP = e
	env.eppErr = make(chan error, 1)
	go func() { env.eppErr <- e.Run(ctx) }()
	if env.nc, err = nats.Connect(e.NATSURL(), nats.Name("kvsim-fleet")); err != nil {
		return fmt.Errorf("loadgen: connect fleet to NATS: %w", err)
	}
	fc.Publisher = events.NewPublisher(env.nc, e.Namespace(), e.Pool())
	fc.Sidecar = simkit.Relays(fc.Publisher, 0)
	if env.Fleet, err = sim.StartFleet(ctx, fc); err != nil {
		return err
	}
	return env.waitReady(ctx)
}

// waitHealthy waits for the gateway's first health check of the EPP to
// pass: until then it routes nothing.
func (g *gatewayEnv) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, h := range g.gw.Hosts() {
			if h.Healthy {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errors.New("loadgen: the gateway found no healthy EPP in 30s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// RestartEPP restarts a gateway policy's upstream EPP process on the same
// ports, as its pod's container restarts: it comes back with an empty
// routing history, and the gateway's health check takes it out and puts it
// back. It returns once the EPP is ready again.
func (env *Env) RestartEPP(ctx context.Context) error {
	if env.ring == nil || env.ring.upstream == nil {
		return fmt.Errorf("loadgen: policy %s runs no EPP process to restart", env.Policy)
	}
	return env.ring.upstream.Restart(ctx)
}

// Report says what a gateway policy runs (the upstream binary's version,
// flags and configuration); empty for other policies.
func (env *Env) Report() string {
	if env.ring == nil {
		return ""
	}
	return env.ring.report
}

// closeFront stops the gateway and the upstream EPP, before the fleet.
func (g *gatewayEnv) closeFront() error {
	var errs []error
	if g.gw != nil {
		errs = append(errs, g.gw.Close())
	}
	if g.upstream != nil {
		errs = append(errs, g.upstream.Close())
	}
	return errors.Join(errs...)
}

// closeBack stops the cluster and frees the pods' listeners, after the
// fleet and the EPP.
func (g *gatewayEnv) closeBack() error {
	var errs []error
	if g.cluster != nil {
		errs = append(errs, g.cluster.Stop())
	}
	if g.pods != nil {
		errs = append(errs, g.pods.Close())
	}
	return errors.Join(errs...)
}

// gatewayPoliciesNote is the report's description of the gateway
// policies that ran, if any.
func gatewayPoliciesNote(o BenchOptions) string {
	ran := slices.ContainsFunc(o.Policies, viaGateway)
	if !ran || o.Virtual {
		return ""
	}
	var b strings.Builder
	b.WriteString("Policies through the gateway (`pkg/harness/gateway`, Envoy's ext_proc exchange in FULL_DUPLEX_STREAMED mode, then forwarding to the endpoint the EPP names in `x-gateway-destination-endpoint`): the engines are the ready Pods of an InferencePool on envtest's API server, each on its own loopback address (127.0.0.2, 127.0.0.3, …) with the pool's one port, and the EPP discovers them there.\n\n| policy | how it routes |\n|---|---|\n")
	flags := strings.Join(upstreamepp.FixedFlags(), " ")
	fmt.Fprintf(&b, "| %s | the upstream EPP's own binary, `%s/cmd/epp@%s` (`scripts/upstream-epp.sh`), as a child process with its built-in configuration (no `--config-file`: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3 on its approximate prefix index); flags `%s` besides pool, ports and configuration |\n",
		PolicyUpstreamEPP, upstreamepp.Module, upstreamepp.Version, flags)
	fmt.Fprintf(&b, "| %s | the same binary with the configuration its Helm chart deploys at %s (`%s`: the same three scorers and weights, metrics scraped over HTTP, written out) |\n",
		PolicyUpstreamEPPApprox, upstreamepp.Version, upstreamepp.ConfigApproxName)
	fmt.Fprintf(&b, "| %s | kvroute's EPP loaded with that same file, discovering the same pool from the API server and hearing the engines' KV events over NATS: the drop-in case |\n\n",
		PolicyKvrouteUpstreamConfig)
	return b.String()
}
