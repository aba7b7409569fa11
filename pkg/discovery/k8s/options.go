package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// DefaultRackLabel is the node label read as each pod's rack unless
// Options.RackLabel names another.
const DefaultRackLabel = datalayer.DefaultRackLabel

// ErrOptions marks discovery options that cannot work together.
var ErrOptions = errors.New("invalid kubernetes discovery options")

// DefaultPoolGroup is the API group of the InferencePool the EPP follows.
const DefaultPoolGroup = "inference.networking.k8s.io"

// DefaultModelAnnotation is the pod annotation that names the base model
// a pod serves. An annotation rather than a label because model names
// ("meta-llama/Llama-3.1-8B-Instruct") are not valid label values.
const DefaultModelAnnotation = "kvroute.io/model"

// Options configure discovery. Exactly one of PoolName or Selector is set.
type Options struct {
	// Namespace is where the pool and its pods live; every watch is
	// limited to it.
	Namespace string

	// PoolName is the InferencePool to follow (InferencePool mode).
	PoolName string
	// PoolGroup is the pool's API group (default DefaultPoolGroup); only
	// the v1 API of that group is served.
	PoolGroup string

	// Selector and TargetPorts define the pool without the CRD
	// (standalone mode).
	Selector    labels.Selector
	TargetPorts []int32

	// ModelAnnotation names the pod annotation that carries the served
	// model (default DefaultModelAnnotation); Model is used for pods without
	// it.
	ModelAnnotation string
	Model           string

	// LeaderElection elects one replica to run OnLeader, through a Lease
	// named LeaderElectionID (default "<pool>-epp-leader") in Namespace.
	LeaderElection   bool
	LeaderElectionID string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election; zero
	// values take controller-runtime's defaults (15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnLeader runs on the elected replica until ctx is done.
	OnLeader func(ctx context.Context) error

	// RackLabel is the node label read as each pod's rack (default
	// datalayer.DefaultRackLabel); Kubernetes has no standard one.
	RackLabel string
	// NoNodeTopology reads no Node objects: endpoints carry no topology.
	// By default each pod's place is its node's labels
	// (kubernetes.io/hostname, RackLabel, topology.kubernetes.io/zone and
	// region), which needs get, list and watch on nodes (cluster-scoped).
	NoNodeTopology bool

	// Objectives, when set in InferencePool mode, receives the pool's
	// InferenceObjectives (priority, and SLO defaults from the
	// kvroute.io/slo-ttft-ms and kvroute.io/slo-tpot-ms annotations).
	Objectives *datalayer.Objectives

	// Registerer receives discovery's metrics; nil registers none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

func (o *Options) standalone() bool { return o.Selector != nil }

// poolName is how metrics, logs and the lease name the pool.
func (o *Options) poolName() string {
	if o.PoolName != "" {
		return o.PoolName
	}
	return "standalone"
}

func (o *Options) validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: %s", ErrOptions, fmt.Sprintf(format, args...)))
	}
	if o.Namespace == "" {
		bad("a namespace is required")
	}
	switch {
	case o.PoolName != "" && o.Selector != nil:
		bad("a pool name and an endpoint selector are mutually exclusive")
	case o.PoolName == "" && o.Selector == nil:
		bad("either a pool name or an endpoint selector is required")
	case o.Selector != nil:
		if o.Selector.Empty() {
			bad("the endpoint selector must not select every pod")
		}
		if len(o.TargetPorts) == 0 {
			bad("an endpoint selector needs at least one target port")
		}
		if err := checkPorts(o.TargetPorts); err != nil {
			bad("%v", err)
		}
	case len(o.TargetPorts) > 0:
		bad("target ports come from the InferencePool; give them only with an endpoint selector")
	}
	if o.PoolGroup != "" && o.PoolGroup != DefaultPoolGroup {
		bad("pool group %q is not served; only %s/v1 is", o.PoolGroup, DefaultPoolGroup)
	}
	return errors.Join(errs...)
}

func checkPorts(ports []int32) error {
	seen := make(map[int32]bool, len(ports))
	for _, p := range ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("target port %d: must be 1 to 65535", p)
		}
		if seen[p] {
			return fmt.Errorf("target port %d given twice", p)
		}
		seen[p] = true
	}
	return nil
}

// ParseSelector reads an --endpoint-selector value: Kubernetes label
// selector syntax ("app=vllm,tier in (a,b)").
func ParseSelector(s string) (labels.Selector, error) {
	sel, err := labels.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("%w: endpoint selector %q: %w", ErrOptions, s, err)
	}
	if sel.Empty() {
		return nil, fmt.Errorf("%w: endpoint selector %q selects every pod", ErrOptions, s)
	}
	return sel, nil
}

// ParsePorts reads an --endpoint-target-ports value: comma-separated port
// numbers ("8000,8001").
func ParsePorts(s string) ([]int32, error) {
	var out []int32
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := strconv.ParseInt(f, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: target port %q: not a number", ErrOptions, f)
		}
		out = append(out, int32(p))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no target ports in %q", ErrOptions, s)
	}
	if err := checkPorts(out); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrOptions, err)
	}
	return out, nil
}
