package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/datalayer/share"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/harness/upstreamepp"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
)

// Replica is one EPP behind the gateway: what the gateway dials, and its
// life. kvroute's EPP is one; another EPP (another binary) is another
// implementation started by its policy's ReplicaStarter.
type Replica interface {
	// Host is the ext_proc (and health) address the gateway dials.
	Host() gateway.Host
	// Ready says whether the replica can pick: its engines known and,
	// where it has them, their metrics scraped.
	Ready() bool
	// Stop stops it at once: its streams in flight are cut, its state is
	// lost, as a pod that goes away loses them.
	Stop() error
}

// ReplicaSpec is what a replica starts from: the fleet it routes over and
// the NATS server the fleet publishes its KV events on.
type ReplicaSpec struct {
	// Name is the replica's host name in the gateway (epp-0, epp-1, …; a
	// restarted replica's name has a suffix).
	Name   string
	Policy string
	// NATSURL carries the engines' KV events on Namespace and Pool's
	// subjects (kv.events.<namespace>.<pool>.<pod>).
	NATSURL, Namespace, Pool string
	Model                    string
	BlockSize                int
	Engines                  []Engine
	Limits                   enginesched.Limits
	// Cluster lists the engines as an InferencePool's Pods, for a policy
	// on pods (nil otherwise); OutDir receives what an EPP process writes.
	Cluster *upstreamepp.Cluster
	OutDir  string
}

// Engine is one simulated engine as the EPP discovers it: its pod, the
// address the pool routes to, and its pod labels (llm-d.ai/role).
type Engine struct {
	Pod, Address string
	Labels       map[string]string
	// Topology is where the engine runs (zero: unknown).
	Topology datalayer.Topology
}

// ReplicaStarter starts one replica of a policy's EPP.
type ReplicaStarter func(ctx context.Context, s ReplicaSpec) (Replica, error)

// starterFor is the ReplicaStarter of a policy whose requests an EPP
// routes behind the gateway (and of the pass-through EPP of a
// client-routed one).
func starterFor(policy string) ReplicaStarter {
	if upstreamBinary(policy) {
		return startUpstream
	}
	return startKVRoute
}

// kvroute is kvroute's EPP in this process.
type kvroute struct {
	name   string
	e      *epp.EPP
	cancel context.CancelFunc
	done   chan error
}

// startKVRoute starts kvroute's EPP as a policy configures it, serving
// ext_proc in plaintext (and its standalone proxy) on loopback.
func startKVRoute(ctx context.Context, s ReplicaSpec) (Replica, error) {
	endpointsFile, cleanup, err := endpointsFileOf(s)
	if err != nil {
		return nil, fmt.Errorf("loadgen: EPP %s: %w", s.Name, err)
	}
	e, err := epp.New(epp.Options{
		NATSURL: s.NATSURL, Namespace: s.Namespace, Pool: s.Pool, HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0",
		EndpointsFile: endpointsFile,
		ConfigText:    eppConfig(s.Policy), Scrape: true, Engine: s.Limits,
		ScrapeOptions: scrape.Options{Interval: 50 * time.Millisecond},
		Prefix:        prefixmatch.Params{DefaultBlockSizeTokens: s.BlockSize},
		RequestPath: epp.RequestPathOptions{
			ExtProcAddr: "127.0.0.1:0", Plaintext: true, ProxyAddr: "127.0.0.1:0",
			Tokenize: true, TokenizeTimeout: 5 * time.Second, Tokenizer: simkit.Tokenizer{Model: s.Model},
			// A replica that stops takes its streams with it.
			ExtProc:                   extprocOptions(),
			NoRankPick:                s.Policy == PolicyDPVLLMBalance,
			FlowControlWhenObjectives: flowControlled(s.Policy),
		},
		Share:  share.Options{Disabled: shareDisabled(s.Policy)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		cleanup()
		return nil, fmt.Errorf("loadgen: EPP %s: %w", s.Name, err)
	}
	if endpointsFile == "" {
		for _, en := range s.Engines {
			e.Datastore().Upsert(&datalayer.Endpoint{Name: en.Pod, Address: en.Address, Pod: en.Pod, Namespace: s.Namespace, Model: s.Model, Labels: en.Labels})
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &kvroute{name: s.Name, e: e, cancel: cancel, done: make(chan error, 1)}
	go func() { defer cleanup(); r.done <- e.Run(ctx) }()
	return r, nil
}

// endpointsFileOf writes the engines of a fleet placed on hosts and racks
// as a standalone endpoints file, which is how the EPP learns where each
// runs outside Kubernetes; "" (and nothing to clean up) for a fleet
// without places, whose engines go into the datastore directly.
func endpointsFileOf(s ReplicaSpec) (string, func(), error) {
	placed := false
	for _, en := range s.Engines {
		placed = placed || !en.Topology.IsZero()
	}
	if !placed {
		return "", func() {}, nil
	}
	type entry struct {
		Name      string             `json:"name"`
		Address   string             `json:"address"`
		Model     string             `json:"model"`
		Namespace string             `json:"namespace,omitempty"`
		Labels    map[string]string  `json:"labels,omitempty"`
		Topology  datalayer.Topology `json:"topology"`
	}
	var f struct {
		Endpoints []entry `json:"endpoints"`
	}
	for _, en := range s.Engines {
		f.Endpoints = append(f.Endpoints, entry{Name: en.Pod, Address: en.Address, Model: s.Model, Namespace: s.Namespace, Labels: en.Labels, Topology: en.Topology})
	}
	// JSON is YAML; the file's parser reads either.
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "kvroute-endpoints-")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	path := filepath.Join(dir, "endpoints.yaml")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		cleanup()
		return "", nil, err
	}
	return path, cleanup, nil
}

func (r *kvroute) Host() gateway.Host {
	return gateway.Host{Name: r.name, ExtProcAddr: r.e.ExtProcAddr()}
}

// Ready: the EPP is ready and has scraped every engine.
func (r *kvroute) Ready() bool {
	if !r.e.Ready() {
		return false
	}
	for _, ep := range r.e.Datastore().List() {
		if _, ok := r.e.Datastore().Metrics(ep.Name); !ok {
			return false
		}
	}
	return true
}

func (r *kvroute) Stop() error {
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("loadgen: EPP %s: %w", r.name, err)
	}
	return nil
}

// extprocOptions are a replica's ext_proc bounds: the defaults, but a stop
// cuts the streams in flight at once rather than letting them finish.
func extprocOptions() extproc.Options { return extproc.Options{ShutdownGrace: time.Millisecond} }

// setObjectives gives the EPP the InferenceObjectives of w's classes.
func (r *kvroute) setObjectives(w Workload) { setObjectives(r.e, w) }

// objectiveSetter is a replica that takes a workload's objectives from
// the load generator (one that discovers them elsewhere is not one).
type objectiveSetter interface{ setObjectives(Workload) }
