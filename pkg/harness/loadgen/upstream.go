package loadgen

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/sim"
)

// Policies whose engines are Pods of an InferencePool on envtest's API
// server, each on its own loopback address with the pool's one port, as
// the upstream EPP discovers them; like every EPP-routed policy, their
// requests pass the gateway, which asks the EPP over ext_proc.
const (
	// PolicyUpstreamEPP is the upstream EPP's own binary
	// (upstreamepp.Version) with its built-in configuration.
	PolicyUpstreamEPP = "upstream-epp"
	// PolicyUpstreamEPPApprox is the same binary with the configuration
	// its Helm chart deploys (upstreamepp.ConfigApprox).
	PolicyUpstreamEPPApprox = "upstream-epp-approx"
	// PolicyKvrouteUpstreamConfig is kvroute's EPP loaded with that same
	// file, on the same engines, hearing their KV events: the drop-in
	// case.
	PolicyKvrouteUpstreamConfig = "kvroute-upstream-config"
)

// UpstreamPolicies are the policies on pod addresses; the benchmark runs
// them when asked (--policies), since they need the upstream binary and
// envtest's.
var UpstreamPolicies = []string{PolicyUpstreamEPP, PolicyUpstreamEPPApprox, PolicyKvrouteUpstreamConfig, PolicyUpstreamFlowControl}

// onPods says whether a policy's engines sit on pod addresses listed by
// an API server.
func onPods(policy string) bool { return slices.Contains(UpstreamPolicies, policy) }

// upstreamBinary says whether a policy's EPP is the upstream binary.
func upstreamBinary(policy string) bool {
	return policy == PolicyUpstreamEPP || policy == PolicyUpstreamEPPApprox || policy == PolicyUpstreamFlowControl
}

// podsEnv is what a policy on pods starts besides the fleet.
type podsEnv struct {
	pods    *upstreamepp.PodListeners
	cluster *upstreamepp.Cluster
}

// placeOnPods binds the engines' pod addresses, before the fleet starts
// on them.
func (env *Env) placeOnPods(fc *sim.FleetConfig) error {
	p := &podsEnv{}
	env.onPods = p
	var err error
	if p.pods, err = upstreamepp.ListenPods(fc.Engines); err != nil {
		return err
	}
	fc.Listen = p.pods.Listen
	return nil
}

// startCluster lists the fleet's engines as ready Pods of an InferencePool
// on envtest's API server, for the replicas to discover.
func (env *Env) startCluster(ctx context.Context) error {
	var pods []upstreamepp.Pod
	for i, s := range env.Fleet.Servers {
		pods = append(pods, upstreamepp.Pod{Name: s.Core().Engine().Config().Pod, IP: upstreamepp.PodIP(i)})
	}
	var err error
	env.onPods.cluster, err = upstreamepp.StartCluster(ctx, upstreamepp.ClusterOptions{
		Namespace: envNamespace, Pool: envPool, Port: env.onPods.pods.Port, Pods: pods,
		Objectives: clusterObjectives(env.objectives),
	})
	return err
}

// close stops the cluster and frees the listeners the fleet did not take,
// after the replicas have stopped.
func (p *podsEnv) close() error {
	var errs []error
	if p.cluster != nil {
		errs = append(errs, p.cluster.Stop())
	}
	if p.pods != nil {
		errs = append(errs, p.pods.Close())
	}
	return errors.Join(errs...)
}

// upstreamReplica is the upstream EPP binary as one replica behind the
// gateway.
type upstreamReplica struct {
	name string
	e    *upstreamepp.EPP
}

// startUpstream starts the upstream binary on the environment's cluster
// and returns once it is ready. Its output,
// its metrics at stop and a report of what ran go to the spec's OutDir.
func startUpstream(ctx context.Context, s ReplicaSpec) (Replica, error) {
	if s.Cluster == nil {
		return nil, fmt.Errorf("loadgen: %s needs its engines listed by an API server", s.Policy)
	}
	o := upstreamepp.EPPOptions{Name: s.Policy + "-" + s.Name, OutDir: s.OutDir}
	switch s.Policy {
	case PolicyUpstreamEPPApprox:
		o.Config, o.ConfigName = upstreamepp.ConfigApprox, upstreamepp.ConfigApproxName
	case PolicyUpstreamFlowControl:
		o.Config, o.ConfigName = withFairFlowControl(upstreamepp.ConfigApprox), upstreamepp.ConfigApproxName+" with the flowControl feature gate and round-robin fairness"
	}
	// Ready as its readiness probe says (health serving, every pod
	// discovered), as a pod joins the gateway's cluster; it scrapes every
	// 50ms from then. WaitScraped would add up to the 5s its gauge takes
	// to refresh, which a restart's measure must not count.
	e, err := s.Cluster.StartEPP(ctx, o)
	if err != nil {
		return nil, err
	}
	if s.OutDir != "" {
		if err := os.WriteFile(filepath.Join(s.OutDir, o.Name+".report.txt"), []byte(e.Report()), 0o644); err != nil {
			return nil, errors.Join(fmt.Errorf("loadgen: %w", err), e.Close())
		}
	}
	return &upstreamReplica{name: s.Name, e: e}, nil
}

func (r *upstreamReplica) Host() gateway.Host {
	return gateway.Host{Name: r.name, ExtProcAddr: r.e.Addr(), HealthAddr: r.e.HealthAddr()}
}

// Ready: startUpstream returns only a ready replica.
func (r *upstreamReplica) Ready() bool { return true }

// Stop stops the process as the kubelet stops a pod (SIGTERM).
func (r *upstreamReplica) Stop() error { return r.e.Close() }

// Report says what the environment's first upstream replica runs (the
// binary's version, flags and configuration); empty for other policies.
func (env *Env) Report() string {
	for _, r := range env.Replicas() {
		if u, ok := r.(*upstreamReplica); ok {
			return u.e.Report()
		}
	}
	return ""
}

// gatewayPoliciesNote is the report's description of the policies on
// pods that ran, if any.
func gatewayPoliciesNote(o BenchOptions) string {
	if !slices.ContainsFunc(o.Policies, onPods) || o.Virtual {
		return ""
	}
	var b strings.Builder
	b.WriteString("Policies on pods: the engines are the ready Pods of an InferencePool on envtest's API server, each on its own loopback address (127.0.0.2, 127.0.0.3, …) with the pool's one port, and the EPP discovers them there; requests pass the gateway as for every EPP-routed policy.\n\n| policy | how it routes |\n|---|---|\n")
	flags := strings.Join(upstreamepp.FixedFlags(), " ")
	fmt.Fprintf(&b, "| %s | the upstream EPP's own binary, `%s/cmd/epp@%s` (`scripts/upstream-epp.sh`), as a child process with its built-in configuration (no `--config-file`: queue-scorer 2, kv-cache-utilization-scorer 2, prefix-cache-scorer 3 on its approximate prefix index); flags `%s` besides pool, ports and configuration |\n",
		PolicyUpstreamEPP, upstreamepp.Module, upstreamepp.Version, flags)
	fmt.Fprintf(&b, "| %s | the same binary with the configuration its Helm chart deploys at %s (`%s`: the same three scorers and weights, metrics scraped over HTTP, written out) |\n",
		PolicyUpstreamEPPApprox, upstreamepp.Version, upstreamepp.ConfigApproxName)
	fmt.Fprintf(&b, "| %s | kvroute's EPP loaded with that same file, on the same engines, hearing their KV events over NATS: the drop-in case |\n",
		PolicyKvrouteUpstreamConfig)
	fmt.Fprintf(&b, "| %s | the same binary and file with its `flowControl` feature gate on and `loadgen.FairFlowControl`'s section (round-robin fairness across flows in every band) |\n\n",
		PolicyUpstreamFlowControl)
	return b.String()
}
