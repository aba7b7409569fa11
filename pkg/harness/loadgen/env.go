package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/harness/pdsidecar"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// Scheduler configurations of the EPP-routed policies: the named ones of
// scheduling/config, and upstream's approximate profile.
const (
	// PreciseConfig scores by the exact index only.
	PreciseConfig = config.PrecisePrefixConfigText
	// PrefillCostConfig scores by the prefill work a pick adds and finds
	// queued.
	PrefillCostConfig = config.PrefillCostConfigText
	// PredictedConfig is the predicted-latency profile, the EPP's default.
	PredictedConfig = config.DefaultConfigText
	// PreciseLoadConfig is upstream's weights on the precise scorer.
	PreciseLoadConfig = config.UpstreamWeightsConfigText

	// ApproxConfig is upstream's default profile (prefix 3, queue 2, KV
	// usage 2) on its approximate prefix scorer; the EPP receives no KV
	// events, so prefix answers come from its routing history alone.
	ApproxConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: speculative-prefix-recorder
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
    weight: 3
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: speculative-prefix-recorder
`
)

// traceConfig routes as kvroute-prefill-cost does and runs the latency
// producer beside it, unused by the picks, so that every response is
// recorded with what was known at its pick: traces for evaluating the
// predictor's learning methods, made by a policy none of them steers.
const traceConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-cost-scorer
- type: speculative-prefix-recorder
- name: recorder
  type: predicted-latency-producer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefill-cost-scorer
    weight: 1
  - pluginRef: speculative-prefix-recorder
`

// policyTrace is the policy that records traces (see traceConfig).
const policyTrace = "trace-recorder"

// FleetOptions shape the simulated fleet of a benchmark environment.
type FleetOptions struct {
	Engines int
	Model   string
	Pool    blockpool.Config
	Timing  sim.Timing
	// Speeds makes the fleet heterogeneous (sim.FleetConfig.Speeds).
	Speeds []float64
	// Encoding of the engines' events; Mixed alternates array and map.
	Encoding events.Encoding
	Mixed    bool
	// OutDir receives what an EPP process writes (the upstream EPP's
	// output, its metrics at stop, the report of what ran); empty, a
	// temporary folder removed with the run.
	OutDir string
	// Family is the engines' family (zero: vLLM's).
	Family sim.Family
	// Roles, when set, gives the engines llm-d's roles in turn
	// (sim.FleetConfig.Roles); each decode engine then serves behind a P/D
	// sidecar (pkg/harness/pdsidecar), as llm-d deploys it, and Transfer
	// is the KV transfer between prefill and decode engines.
	Roles    []string
	Transfer sim.Transfer
	// DataParallel, when above 1, makes each engine a data-parallel one of
	// that many ranks behind its one API server (sim.FleetConfig.DataParallel).
	DataParallel int
	// Places puts the engines on hosts and racks (sim.FleetConfig.Places).
	Places []sim.Place
	// Objectives are the pool's InferenceObjectives, for an EPP that
	// discovers them from the API server (the policies on pods); kvroute's
	// in-process EPP is given them at each run.
	Objectives []Class
}

// Front is how an environment's requests reach the EPP.
type Front int

const (
	// FrontGateway: through the gateway (pkg/harness/gateway), which asks
	// the EPP replicas behind it over ext_proc, as Envoy does in
	// production. The default.
	FrontGateway Front = iota
	// FrontProxy: through the first EPP replica's standalone proxy (one
	// replica, no gateway).
	FrontProxy
)

// Shape is how traffic reaches the engines in an environment: the front,
// how many EPP replicas, and what share passes no EPP at all.
type Shape struct {
	Front Front
	// Replicas is how many EPPs stand behind the gateway, each its own,
	// all fed the KV events over NATS (1 when zero).
	Replicas int
	// Bypass is the share of requests (0 to 1) sent instead to another
	// gateway, which routes round-robin over the engines and passes no
	// EPP: traffic the EPP under test never sees.
	Bypass float64
	// RestartAt, when set, stops the first replica that long into each
	// run and starts a fresh one on the same configuration.
	RestartAt time.Duration
}

// RealTimeOnly says whether the shape needs real time: virtual time has no
// ext_proc, one EPP and no second path.
func (s Shape) RealTimeOnly() bool {
	return s.Front != FrontGateway || s.Replicas > 1 || s.Bypass > 0 || s.RestartAt > 0
}

func (s Shape) replicas() int { return max(s.Replicas, 1) }

// String names the shape in reports ("" for the default one).
func (s Shape) String() string {
	var parts []string
	if s.Front == FrontProxy {
		parts = append(parts, "via the EPP's proxy")
	}
	if s.Replicas > 1 {
		parts = append(parts, fmt.Sprintf("%d EPP replicas", s.Replicas))
	}
	if s.Bypass > 0 {
		parts = append(parts, fmt.Sprintf("%.0f%% bypassing the EPP", 100*s.Bypass))
	}
	if s.RestartAt > 0 {
		parts = append(parts, fmt.Sprintf("an EPP restart at %s", s.RestartAt))
	}
	return strings.Join(parts, ", ")
}

// Env is one policy's world: a fresh fleet with cold caches, an embedded
// NATS server carrying its KV events, the policy's EPP replicas, and the
// gateway every request goes through (Shape.Front). For the policies
// routed by an EPP, the engines publish their KV events and the replicas
// pick; a policy that picks in the client names its choice in the subset
// hint, which the gateway passes to the EPP as Envoy's route metadata
// would, and the EPP (on upstream's profile, hearing no events) routes it
// there, so that every policy's numbers include the same hops and differ by
// the picks alone.
type Env struct {
	Policy string
	Shape  Shape
	Fleet  *sim.Fleet
	// EPP is the first replica's EPP when it is kvroute's (nil otherwise),
	// the one a restart replaces.
	EPP *epp.EPP
	// Gateway is the front every request passes (nil with FrontProxy);
	// Bypass the second gateway, when Shape.Bypass is set.
	Gateway, Bypass *gateway.Gateway
	router          router
	nats            *natsembed.Server
	nc              *nats.Conn
	ctx             context.Context
	cancel          context.CancelFunc
	spec            ReplicaSpec
	start           ReplicaStarter
	mu              sync.Mutex
	replicas        []Replica
	restarts        int
	// onPods is what a policy on pods starts besides (onPods).
	onPods *podsEnv
	// sidecars are the P/D sidecars in front of the decode engines.
	sidecars []*pdsidecar.Sidecar
	// objectives are the pool's InferenceObjectives (FleetOptions.Objectives).
	objectives []Class
}

// Namespace and pool of every environment's EPPs and events.
const (
	envNamespace = "default"
	envPool      = "kvsim"
)

// StartEnv starts the environment for policy in the default shape (one
// EPP behind the gateway); Close stops it.
func StartEnv(ctx context.Context, policy string, fo FleetOptions, seed uint64) (*Env, error) {
	return StartEnvShaped(ctx, policy, fo, seed, Shape{})
}

// StartEnvShaped starts the environment for policy in shape s.
func StartEnvShaped(ctx context.Context, policy string, fo FleetOptions, seed uint64, s Shape) (*Env, error) {
	if s.Front == FrontProxy && (s.Replicas > 1 || s.RestartAt > 0) {
		return nil, errors.New("loadgen: the EPP's proxy fronts one replica, which no restart replaces")
	}
	if s.Bypass < 0 || s.Bypass > 1 {
		return nil, fmt.Errorf("loadgen: bypass share %v is not within 0 and 1", s.Bypass)
	}
	env := &Env{Policy: policy, Shape: s, start: starterFor(policy), objectives: fo.Objectives}
	env.ctx, env.cancel = context.WithCancel(ctx)
	fail := func(err error) (*Env, error) {
		_ = env.Close()
		return nil, err
	}
	var err error
	if env.nats, err = natsembed.Start(natsembed.Options{}); err != nil {
		env.cancel()
		return nil, fmt.Errorf("loadgen: NATS: %w", err)
	}
	fc := fo.fleetConfig(seed)
	if len(fo.Roles) > 0 {
		fc.Front = env.pdFront
	}
	if hearsEvents(policy) {
		env.nc, err = nats.Connect(env.nats.ClientURL(), nats.Name("kvsim-fleet"))
		if err != nil {
			return fail(fmt.Errorf("loadgen: connect fleet to NATS: %w", err))
		}
		fc.Publisher = events.NewPublisher(env.nc, envNamespace, envPool)
		fc.Sidecar = simkit.Relays(fc.Publisher, 0)
	}
	if onPods(policy) {
		if err := env.placeOnPods(&fc); err != nil {
			return fail(err)
		}
	}
	if env.Fleet, err = sim.StartFleet(env.ctx, fc); err != nil {
		return fail(err)
	}
	env.spec = ReplicaSpec{Policy: policy, NATSURL: env.nats.ClientURL(), Namespace: envNamespace, Pool: envPool,
		Model: fo.Model, BlockSize: fo.Pool.BlockSize, Limits: fo.engineLimits(), OutDir: fo.OutDir}
	if env.onPods != nil {
		if err := env.startCluster(env.ctx); err != nil {
			return fail(err)
		}
		env.spec.Cluster = env.onPods.cluster
	}
	var engines []string
	for _, srv := range env.Fleet.Servers {
		cfg := srv.Core().Engine().Config()
		env.spec.Engines = append(env.spec.Engines, Engine{Pod: cfg.Pod, Address: cfg.Address, Labels: cfg.Labels(), Topology: topologyOf(cfg.Place)})
		engines = append(engines, cfg.Address)
	}
	var hosts []gateway.Host
	for i := range s.replicas() {
		r, err := env.startReplica(fmt.Sprintf("epp-%d", i))
		if err != nil {
			return fail(err)
		}
		hosts = append(hosts, r.Host())
	}
	if err := env.waitReady(env.ctx, env.replicas...); err != nil {
		return fail(err)
	}
	var base string
	switch s.Front {
	case FrontProxy:
		if env.EPP == nil {
			return fail(errors.New("loadgen: the proxy front needs kvroute's EPP"))
		}
		base = "http://" + env.EPP.ProxyAddr()
	default:
		if env.Gateway, err = gateway.Start(gatewayOptions(hosts, nil)); err != nil {
			return fail(fmt.Errorf("loadgen: gateway: %w", err))
		}
		if err := env.waitHealthy(env.ctx, len(hosts)); err != nil {
			return fail(err)
		}
		base = env.Gateway.URL()
	}
	if viaEPP(policy) {
		env.router = viaGateway{url: base}
	} else if env.router, err = newDirect(policy, env.Fleet.Cores(), base, fo.Model, seed, time.Now); err != nil {
		return fail(err)
	}
	if s.Bypass > 0 {
		if env.Bypass, err = gateway.Start(gatewayOptions(nil, engines)); err != nil {
			return fail(fmt.Errorf("loadgen: bypass gateway: %w", err))
		}
		env.router = newBypass(env.router, env.Bypass.URL(), s.Bypass, seed)
	}
	return env, nil
}

// gatewayOptions are an environment's gateway's: its EPP replicas' health
// checked every 100ms (each check given a second, so that a loaded machine
// does not take a replica out), and a stream a stopped replica refuses retried on
// another (the ext_proc grpc_service's retry policy), so that a replica
// that goes away loses only the requests in flight on it.
func gatewayOptions(hosts []gateway.Host, endpoints []string) gateway.Options {
	return gateway.Options{
		Hosts: hosts, Endpoints: endpoints,
		Health:      gateway.HealthCheck{Interval: 100 * time.Millisecond, Timeout: time.Second, Unhealthy: 2, Healthy: 1},
		OpenRetries: 2,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// startReplica starts a replica named name on the environment's spec.
func (env *Env) startReplica(name string) (Replica, error) {
	spec := env.spec
	spec.Name = name
	r, err := env.start(env.ctx, spec)
	if err != nil {
		return nil, err
	}
	env.mu.Lock()
	env.replicas = append(env.replicas, r)
	if k, ok := r.(*kvroute); ok && env.EPP == nil {
		env.EPP = k.e
	}
	env.mu.Unlock()
	return r, nil
}

// hearsEvents says whether a policy's EPP is fed the engines' KV events:
// kvroute's are; the approximate one's is not (that is the point), nor is
// the pass-through EPP of a client-routed policy.
func hearsEvents(policy string) bool {
	return viaEPP(policy) && policy != PolicyApproxEPP && policy != PolicyPDUpstream && !upstreamBinary(policy)
}

// waitReady waits for the replicas to be ready.
func (env *Env) waitReady(ctx context.Context, rs ...Replica) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready := true
		for _, r := range rs {
			ready = ready && r.Ready()
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("loadgen: the EPP did not become ready in 10s")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitHealthy waits for the gateway to see n healthy ext_proc hosts.
func (env *Env) waitHealthy(ctx context.Context, n int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		healthy := 0
		for _, h := range env.Gateway.Hosts() {
			if h.Healthy {
				healthy++
			}
		}
		if healthy >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("loadgen: %d of %d EPP replicas passed the gateway's health checks in 10s", healthy, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Replicas are the environment's EPP replicas now, stopped ones included.
func (env *Env) Replicas() []Replica {
	env.mu.Lock()
	defer env.mu.Unlock()
	return slices.Clone(env.replicas)
}

// Close stops the gateways, the fleet, the EPPs and NATS, and returns the
// first error any ended with. The fleet and its NATS connection go before
// the server, so that a fleet still publishing does not see it gone.
func (env *Env) Close() error {
	var errs []error
	for _, g := range []*gateway.Gateway{env.Gateway, env.Bypass} {
		if g != nil {
			_ = g.Close()
		}
	}
	if env.Fleet != nil {
		errs = append(errs, env.Fleet.Close())
	}
	if env.nc != nil {
		env.nc.Close()
	}
	for _, r := range env.Replicas() {
		errs = append(errs, r.Stop())
	}
	env.cancel()
	if env.nats != nil {
		env.nats.Shutdown()
	}
	if env.onPods != nil {
		errs = append(errs, env.onPods.close())
	}
	return errors.Join(errs...)
}

// Run drives the environment with one open-loop run.
func (env *Env) Run(ctx context.Context, w Workload, o RunOptions) Result {
	for _, r := range env.Replicas() {
		if os, ok := r.(objectiveSetter); ok {
			os.setObjectives(w)
		}
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	}
	var res Result
	if env.Shape.RestartAt <= 0 {
		res = run(ctx, w, env.router, o)
	} else {
		rs := &restartRun{at: env.Shape.RestartAt, done: make(chan struct{})}
		o.during = func(start time.Time) { env.restartDuring(ctx, w, start, rs) }
		res = run(ctx, w, env.router, o)
		<-rs.done
		res.Restart = rs.measure(res.Samples)
	}
	res.PD = env.pdResult(res.Samples, res.Makespan)
	if len(w.Tenants) > 0 {
		res.Flow = env.flowCounts(ctx)
	}
	// The first replica's predictor speaks for the run (after a restart,
	// the replica that replaced it).
	if env.EPP != nil {
		if a, ok := predictorAccuracy(env.EPP.Registry()); ok {
			res.Predictor = &a
		}
	}
	return res
}

// SamplePrompts returns the token ids of the first n completion prompts a
// run of w with this seed sends (a workload with chats gives none).
func SamplePrompts(w Workload, seed uint64, n int) [][]uint32 {
	if w.Kind == KindMultiTurn || w.Kind == KindPD {
		return nil
	}
	g := newGenerator(w, seed)
	out := make([][]uint32, 0, n)
	for range n {
		out = append(out, sim.Tokenize(g.next().Users[0]))
	}
	return out
}

// IndexCheck is the comparison of the EPP's prefix answers with the
// engines' true caches.
type IndexCheck struct {
	Agree, Total int
	// FirstMiss describes the first disagreement, if any.
	FirstMiss string
}

// CheckIndex asks the EPP's index who holds each prompt and compares every
// (prompt, endpoint) answer with that engine's ground truth. Call it when
// the fleet is idle, so that no events are in flight.
func (env *Env) CheckIndex(ctx context.Context, prompts [][]uint32) (IndexCheck, error) {
	var c IndexCheck
	if !hearsEvents(env.Policy) {
		return c, fmt.Errorf("loadgen: the EPP of policy %s hears no KV events", env.Policy)
	}
	byAddr := map[string]*sim.Engine{}
	for _, s := range env.Fleet.Servers {
		byAddr[s.Addr()] = s.Core().Engine()
	}
	for _, p := range prompts {
		ans, err := env.EPP.Lookup(ctx, prefixquery.Query{Model: env.Fleet.Servers[0].Core().Engine().Config().Model, TokenIDs: p})
		if err != nil {
			return c, fmt.Errorf("loadgen: index lookup: %w", err)
		}
		for _, a := range ans.Endpoints {
			eng := byAddr[a.Address]
			if eng == nil {
				continue
			}
			truth := eng.Held(blockpool.Request{Tokens: p})
			c.Total++
			if truth.Blocks == a.Prefix.MatchBlocks && truth.ByTier == a.Prefix.BlocksByTier {
				c.Agree++
			} else if c.FirstMiss == "" {
				c.FirstMiss = fmt.Sprintf("%s holds %d blocks %v, the index says %d %v",
					a.Address, truth.Blocks, truth.ByTier, a.Prefix.MatchBlocks, a.Prefix.BlocksByTier)
			}
		}
	}
	return c, nil
}

// setObjectives gives the EPP the InferenceObjectives of w's classes.
func setObjectives(e *epp.EPP, w Workload) {
	for _, cl := range w.Classes {
		e.Objectives().Set(datalayer.Objective{Name: cl.Objective, Priority: cl.Priority})
	}
}

// eppConfig is the scheduling configuration of an EPP-routed policy.
func eppConfig(policy string) string {
	if isPD(policy) {
		return pdConfig(policy)
	}
	switch policy {
	case PolicyKvrouteUpstreamConfig:
		return upstreamepp.ConfigApprox
	case PolicyPredicted, PolicyPredictedUnshared, PolicyDPVLLMBalance, PolicyDPRankPick, PolicyDPRankPerPod, PolicyFlowControl:
		return PredictedConfig
	case PolicyFlowControlFair:
		return withFairFlowControl(PredictedConfig)
	case policyTrace:
		return traceConfig
	case PolicyPrecise:
		return PreciseConfig
	case PolicyApproxEPP:
		return ApproxConfig
	case PolicyPrefillCost:
		return PrefillCostConfig
	case PolicyPreciseLoad:
		return PreciseLoadConfig
	}
	// A client-routed policy's pass-through EPP: a subset of one endpoint
	// leaves the profile no choice, and upstream's costs the request path
	// what it costs upstream.
	return ApproxConfig
}

// engineLimits are the fleet's scheduler limits, as a user of vLLM gives
// the EPP the --max-num-seqs and --max-num-batched-tokens the engines run.
func (fo FleetOptions) engineLimits() enginesched.Limits {
	t := fo.Family.Timing(fo.Timing, 0, 0)
	return enginesched.Limits{MaxNumSeqs: t.MaxSeqs, MaxBatchedTokens: t.MaxBatchedTokens}
}

// fleetConfig is the simulated fleet the options describe, its pools
// seeded from seed.
func (fo FleetOptions) fleetConfig(seed uint64) sim.FleetConfig {
	fc := sim.FleetConfig{
		Engines: fo.Engines, Model: fo.Model, Pool: fo.Pool, Timing: fo.Timing, Speeds: fo.Speeds,
		Encoding: fo.Encoding, MixedEncodings: fo.Mixed, Family: fo.Family,
		Roles: fo.Roles, Transfer: fo.Transfer, DataParallel: fo.DataParallel, Places: fo.Places,
	}
	fc.Pool.Seed = seed
	return fc
}

// engineTokens is what the engines prefill for req: its token ids, or its
// prompt as their tokenizer renders and encodes it.
func engineTokens(ctx context.Context, req *request.Request) ([]uint32, error) {
	if req.TokenIDs != nil {
		return req.TokenIDs, nil
	}
	return simkit.Tokenizer{Model: req.Model}.Tokenize(ctx, req)
}
