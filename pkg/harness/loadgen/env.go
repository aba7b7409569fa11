package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
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
	// OutDir receives what a gateway policy's EPP process writes (the
	// upstream EPP's output, its metrics at stop, the report of what ran);
	// empty, a temporary folder removed with the run.
	OutDir string
}

// Env is one policy's world: a fresh fleet with cold caches behind an EPP
// on an embedded NATS server, whose proxy every request goes through. For
// the policies routed by kvroute the engines publish their KV events to it
// and it picks; a policy that picks in the client names its choice in the
// subset hint, and the EPP (on upstream's profile, hearing no events)
// forwards it there, so that every policy's numbers include the same hop
// and differ by the picks alone.
type Env struct {
	Policy string
	Fleet  *sim.Fleet
	EPP    *epp.EPP
	router router
	nc     *nats.Conn
	cancel context.CancelFunc
	eppErr chan error
	// ring is what a gateway policy starts besides (viaGateway).
	ring *gatewayEnv
}

// StartEnv starts the environment for policy; Close stops it.
func StartEnv(ctx context.Context, policy string, fo FleetOptions, seed uint64) (*Env, error) {
	env := &Env{Policy: policy}
	ctx, env.cancel = context.WithCancel(ctx)
	if viaGateway(policy) {
		if err := startGatewayEnv(ctx, env, fo, seed); err != nil {
			return nil, errors.Join(err, env.Close())
		}
		return env, nil
	}
	fc := fo.fleetConfig(seed)
	e, err := epp.New(epp.Options{
		Pool: "kvsim", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0",
		ConfigText: eppConfig(policy), Scrape: true, Engine: fo.engineLimits(),
		ScrapeOptions: scrape.Options{Interval: 50 * time.Millisecond},
		Prefix:        prefixmatch.Params{DefaultBlockSizeTokens: fo.Pool.BlockSize},
		RequestPath: epp.RequestPathOptions{
			ProxyAddr: "127.0.0.1:0", Tokenize: true, TokenizeTimeout: 5 * time.Second,
			Tokenizer: simkit.Tokenizer{Model: fo.Model},
		},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		env.cancel()
		return nil, fmt.Errorf("loadgen: EPP: %w", err)
	}
	env.EPP = e
	env.eppErr = make(chan error, 1)
	go func() { env.eppErr <- e.Run(ctx) }()
	if hearsEvents(policy) {
		env.nc, err = nats.Connect(e.NATSURL(), nats.Name("kvsim-fleet"))
		if err != nil {
			env.Close()
			return nil, fmt.Errorf("loadgen: connect fleet to NATS: %w", err)
		}
		fc.Publisher = events.NewPublisher(env.nc, e.Namespace(), e.Pool())
		fc.Sidecar = simkit.Relays(fc.Publisher, 0)
	}
	env.Fleet, err = sim.StartFleet(ctx, fc)
	if err != nil {
		env.Close()
		return nil, err
	}
	for _, s := range env.Fleet.Servers {
		cfg := s.Core().Engine().Config()
		e.Datastore().Upsert(&datalayer.Endpoint{
			Name: cfg.Pod, Address: cfg.Address, Pod: cfg.Pod, Namespace: e.Namespace(), Model: cfg.Model,
		})
	}
	proxy := "http://" + e.ProxyAddr()
	if viaEPP(policy) {
		env.router = viaProxy{url: proxy}
	} else if env.router, err = newDirect(policy, env.Fleet.Cores(), proxy, fo.Model, seed, time.Now); err != nil {
		env.Close()
		return nil, err
	}
	if err := env.waitReady(ctx); err != nil {
		env.Close()
		return nil, err
	}
	return env, nil
}

// hearsEvents says whether a policy's EPP is fed the engines' KV events:
// kvroute's are; the approximate one's is not (that is the point), nor is
// the pass-through EPP of a client-routed policy.
func hearsEvents(policy string) bool { return viaEPP(policy) && policy != PolicyApproxEPP }

// waitReady waits for the EPP to be ready and to have scraped every engine.
func (env *Env) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		ready := env.EPP.Ready()
		for _, ep := range env.EPP.Datastore().List() {
			if _, ok := env.EPP.Datastore().Metrics(ep.Name); !ok {
				ready = false
			}
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

// Close stops the fleet and the EPP and returns the first error either
// ended with. The fleet and its NATS connection go first: the EPP's
// embedded server stops with the EPP, and a fleet still publishing then
// has its writes fail.
func (env *Env) Close() error {
	var err error
	if env.ring != nil {
		err = env.ring.closeFront()
	}
	if env.Fleet != nil {
		if e := env.Fleet.Close(); e != nil && err == nil {
			err = e
		}
	}
	if env.nc != nil {
		env.nc.Close()
	}
	env.cancel()
	if env.eppErr != nil {
		if e := <-env.eppErr; e != nil && err == nil {
			err = fmt.Errorf("loadgen: EPP: %w", e)
		}
	}
	if env.ring != nil {
		if e := env.ring.closeBack(); e != nil && err == nil {
			err = e
		}
	}
	return err
}

// Run drives the environment with one open-loop run.
func (env *Env) Run(ctx context.Context, w Workload, o RunOptions) Result {
	if env.EPP != nil {
		setObjectives(env.EPP, w)
	}
	if o.Client == nil {
		o.Client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	}
	return run(ctx, w, env.router, o)
}

// SamplePrompts returns the token ids of the first n completion prompts a
// run of w with this seed sends (a multi-turn workload gives none).
func SamplePrompts(w Workload, seed uint64, n int) [][]uint32 {
	if w.Kind == KindMultiTurn {
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
	switch policy {
	case PolicyPredicted:
		return PredictedConfig
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
	return enginesched.Limits{MaxNumSeqs: fo.Timing.MaxSeqs, MaxBatchedTokens: fo.Timing.MaxBatchedTokens}
}

// fleetConfig is the simulated fleet the options describe, its pools
// seeded from seed.
func (fo FleetOptions) fleetConfig(seed uint64) sim.FleetConfig {
	fc := sim.FleetConfig{
		Engines: fo.Engines, Model: fo.Model, Pool: fo.Pool, Timing: fo.Timing, Speeds: fo.Speeds,
		Encoding: fo.Encoding, MixedEncodings: fo.Mixed,
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
