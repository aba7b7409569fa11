package k8s

import (
	"fmt"
	"log/slog"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// SourceOptions are what the EPP's flags say about Kubernetes discovery:
// the InferencePool named Pool in Namespace, or, with Selector set, the pods
// it selects (standalone mode, no CRD).
type SourceOptions struct {
	Namespace, Pool string
	// Config reaches the API server; nil uses the in-cluster config or
	// $KUBECONFIG.
	Config *rest.Config
	// PoolGroup is the InferencePool's API group (default
	// inference.networking.k8s.io).
	PoolGroup string
	// Selector and TargetPorts are upstream's --endpoint-selector and
	// --endpoint-target-ports.
	Selector    string
	TargetPorts string
	// DefaultModel is the model of pods without the kvroute.io/model
	// annotation.
	DefaultModel string
	// LeaderElection elects one replica; every replica still serves.
	LeaderElection bool
	// RackLabel and NoNodeTopology are Options'.
	RackLabel      string
	NoNodeTopology bool
}

var setCtrlLogger sync.Once

// NewSource makes Kubernetes discovery writing to ds, as the EPP runs it.
// objectives, when not nil, receives the pool's InferenceObjectives.
func NewSource(so SourceOptions, ds *datalayer.Datastore, objectives *datalayer.Objectives, reg prometheus.Registerer, logger *slog.Logger) (*Discovery, error) {
	// controller-runtime's packages log through a global logger and
	// complain, with a stack trace, until one is set.
	setCtrlLogger.Do(func() {
		ctrl.SetLogger(logr.FromSlogHandler(logger.Handler()))
		// client-go (leader election, informers) logs through klog.
		klog.SetLogger(logr.FromSlogHandler(logger.Handler()))
	})
	cfg := so.Config
	if cfg == nil {
		var err error
		if cfg, err = ctrl.GetConfig(); err != nil {
			return nil, fmt.Errorf("kubernetes config: %w", err)
		}
	}
	o := Options{
		Namespace:      so.Namespace,
		PoolGroup:      so.PoolGroup,
		Model:          so.DefaultModel,
		LeaderElection: so.LeaderElection,
		RackLabel:      so.RackLabel,
		NoNodeTopology: so.NoNodeTopology,
		Registerer:     reg,
		Logger:         logger,
	}
	if so.Selector != "" || so.TargetPorts != "" {
		sel, err := ParseSelector(so.Selector)
		if err != nil {
			return nil, err
		}
		ports, err := ParsePorts(so.TargetPorts)
		if err != nil {
			return nil, err
		}
		o.Selector, o.TargetPorts = sel, ports
		// The lease is per pool even without the CRD.
		o.LeaderElectionID = so.Pool + "-epp-leader"
	} else {
		o.PoolName, o.Objectives = so.Pool, objectives
	}
	return New(cfg, ds, o)
}
