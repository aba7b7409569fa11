package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inferencev1alpha2 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// Discovery keeps a datastore in step with a pool's pods on Kubernetes.
type Discovery struct {
	opts    Options
	mgr     manager.Manager
	sync    *syncer
	m       *metrics
	cfg     *rest.Config
	synced  atomic.Bool
	leading atomic.Bool
}

// New prepares discovery against the API server at cfg, writing endpoints
// to ds. Nothing is watched until Run.
func New(cfg *rest.Config, ds *datalayer.Datastore, opts Options) (*Discovery, error) {
	if cfg == nil || ds == nil {
		return nil, fmt.Errorf("%w: a REST config and a datastore are required", ErrOptions)
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	if opts.ModelAnnotation == "" {
		opts.ModelAnnotation = DefaultModelAnnotation
	}
	if opts.LeaderElectionID == "" {
		opts.LeaderElectionID = opts.poolName() + "-epp-leader"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	opts.Logger = opts.Logger.With("component", "k8s-discovery")

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("k8s discovery: scheme: %w", err)
	}
	if err := inferencev1.Install(scheme); err != nil {
		return nil, fmt.Errorf("k8s discovery: scheme: %w", err)
	}
	if err := inferencev1alpha2.Install(scheme); err != nil {
		return nil, fmt.Errorf("k8s discovery: scheme: %w", err)
	}

	byObject := map[client.Object]cache.ByObject{}
	if !opts.standalone() {
		// Only the one pool is ever read, so only it is cached.
		byObject[&inferencev1.InferencePool{}] = cache.ByObject{
			Field: fields.OneTermEqualSelector("metadata.name", opts.PoolName),
		}
	}
	d := &Discovery{opts: opts, m: newMetrics(opts.Registerer), cfg: cfg}
	d.sync = newSyncer(ds, &d.opts, d.m)
	mgr, err := manager.New(cfg, manager.Options{
		Scheme: scheme,
		Logger: logr.FromSlogHandler(opts.Logger.Handler()),
		Cache: cache.Options{
			DefaultNamespaces: map[string]cache.Config{opts.Namespace: {}},
			ByObject:          byObject,
			DefaultTransform:  cache.TransformStripManagedFields(),
		},
		// The EPP serves its own metrics and health; the manager's servers
		// would only be two more ports.
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// Several discoveries may share a process (tests, a restart in
		// place); their controllers have the same names on purpose. The
		// manager's own leader election stays off: it would stop every
		// controller on the replicas that do not lead (see campaign).
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		return nil, fmt.Errorf("k8s discovery: manager: %w", err)
	}
	d.mgr = mgr
	if err := d.setup(); err != nil {
		return nil, err
	}
	return d, nil
}

func (d *Discovery) setup() error {
	c := d.mgr.GetClient()
	err := ctrl.NewControllerManagedBy(d.mgr).
		Named("kvroute-pods").
		For(&corev1.Pod{}).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			err := d.sync.syncPod(ctx, c, req.NamespacedName)
			d.m.reconciled("pod", err)
			return reconcile.Result{}, err
		}))
	if err != nil {
		return fmt.Errorf("k8s discovery: pod controller: %w", err)
	}
	if !d.opts.NoNodeTopology {
		// Nodes' metadata only, and only their label changes: a Node's
		// status changes every few seconds and says nothing of its place.
		err = ctrl.NewControllerManagedBy(d.mgr).
			Named("kvroute-nodes").
			For(&corev1.Node{}, builder.OnlyMetadata, builder.WithPredicates(predicate.LabelChangedPredicate{})).
			Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
				err := d.sync.syncNode(ctx, c, req.Name)
				d.m.reconciled("node", err)
				return reconcile.Result{}, err
			}))
		if err != nil {
			return fmt.Errorf("k8s discovery: node controller: %w", err)
		}
	}
	if d.opts.standalone() {
		return d.mgr.Add(manager.RunnableFunc(d.runStandalone))
	}
	err = ctrl.NewControllerManagedBy(d.mgr).
		Named("kvroute-inferencepool").
		For(&inferencev1.InferencePool{}).
		Complete(reconcile.Func(func(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
			if req.Name != d.opts.PoolName {
				return reconcile.Result{}, nil
			}
			err := d.reconcilePool(ctx, c, req.NamespacedName)
			d.m.reconciled("pool", err)
			return reconcile.Result{}, err
		}))
	if err != nil {
		return fmt.Errorf("k8s discovery: InferencePool controller: %w", err)
	}
	if d.opts.Objectives != nil {
		return d.setupObjectives()
	}
	return nil
}

func (d *Discovery) reconcilePool(ctx context.Context, c client.Reader, key types.NamespacedName) error {
	var pool inferencev1.InferencePool
	if err := c.Get(ctx, key, &pool); err != nil {
		if apierrors.IsNotFound(err) {
			d.opts.Logger.Warn("InferencePool not found, removing its endpoints", "pool", key)
			d.sync.clearPool()
			return nil
		}
		return fmt.Errorf("get InferencePool %s: %w", key, err)
	}
	if pool.DeletionTimestamp != nil {
		d.sync.clearPool()
		return nil
	}
	info, err := poolInfoFrom(&pool)
	if err != nil {
		// A pool the EPP cannot read is logged and kept as it was: the API
		// server's validation makes this unreachable, so retrying would
		// only repeat it.
		d.opts.Logger.Error("InferencePool rejected", "error", err)
		return nil
	}
	if err := d.sync.setPool(ctx, c, info); err != nil {
		return err
	}
	d.markSynced()
	return nil
}

// runStandalone adopts the pool the options define once the pod cache is
// filled, which is the standalone mode's first sync.
func (d *Discovery) runStandalone(ctx context.Context) error {
	info := &PoolInfo{
		Namespace:   d.opts.Namespace,
		Name:        d.opts.poolName(),
		Selector:    d.opts.Selector,
		TargetPorts: d.opts.TargetPorts,
		AppProtocol: string(inferencev1.AppProtocolHTTP),
	}
	if !d.mgr.GetCache().WaitForCacheSync(ctx) {
		return nil
	}
	if err := d.sync.setPool(ctx, d.mgr.GetClient(), info); err != nil {
		return fmt.Errorf("k8s discovery: %w", err)
	}
	d.markSynced()
	<-ctx.Done()
	return nil
}

// markSynced records the first sync.
func (d *Discovery) markSynced() {
	if !d.synced.Swap(true) {
		d.m.synced.Set(1)
		d.opts.Logger.Info("pool synchronised", "endpoints", d.sync.ds.Len())
	}
}

// Run watches until ctx is done. It returns an error when the API server
// cannot be watched or leader election cannot run.
func (d *Discovery) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	elected := make(chan error, 1)
	if d.opts.LeaderElection {
		go func() { elected <- d.campaign(ctx) }()
	} else {
		close(elected)
	}
	err := d.mgr.Start(ctx)
	cancel()
	if lerr := <-elected; err == nil {
		err = lerr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("k8s discovery: %w", err)
	}
	return nil
}

// Synced reports whether discovery has read the pool and its pods: until
// then the datastore may be missing endpoints, and the EPP is not ready.
func (d *Discovery) Synced() bool { return d.synced.Load() }

// Leader reports whether this replica holds the leader lease.
func (d *Discovery) Leader() bool { return d.leading.Load() }

// Pool returns the pool as discovery currently reads it; false until the
// first sync and while the InferencePool is missing.
func (d *Discovery) Pool() (PoolInfo, bool) { return d.sync.currentPool() }

// campaign runs for the lease until ctx is done, running OnLeader while it
// holds it. Losing the lease is not fatal, unlike in most controllers:
// discovery and picking never depended on it, so the replica keeps serving
// and campaigns again.
func (d *Discovery) campaign(ctx context.Context) error {
	coord, err := coordinationv1.NewForConfig(d.cfg)
	if err != nil {
		return fmt.Errorf("leader election client: %w", err)
	}
	host, _ := os.Hostname()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: d.opts.Namespace, Name: d.opts.LeaderElectionID},
		Client:     coord,
		LockConfig: resourcelock.ResourceLockConfig{Identity: host + "_" + uuid.NewString()},
	}
	lease, renew, retry := orDefault(d.opts.LeaseDuration, 15*time.Second),
		orDefault(d.opts.RenewDeadline, 10*time.Second), orDefault(d.opts.RetryPeriod, 2*time.Second)
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            lock,
			LeaseDuration:   lease,
			RenewDeadline:   renew,
			RetryPeriod:     retry,
			ReleaseOnCancel: true,
			Name:            d.opts.LeaderElectionID,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: d.lead,
				OnStoppedLeading: func() {
					if d.leading.Swap(false) {
						d.m.leader.Set(0)
						d.opts.Logger.Info("leader lease lost", "lease", d.opts.LeaderElectionID)
					}
				},
			},
		})
		if err != nil {
			return fmt.Errorf("leader election: %w", err)
		}
		le.Run(ctx)
		select {
		case <-ctx.Done():
		case <-time.After(retry):
		}
	}
	return nil
}

func (d *Discovery) lead(ctx context.Context) {
	d.leading.Store(true)
	d.m.leader.Set(1)
	d.opts.Logger.Info("leader lease acquired", "lease", d.opts.LeaderElectionID)
	if d.opts.OnLeader == nil {
		return
	}
	if err := d.opts.OnLeader(ctx); err != nil && ctx.Err() == nil {
		d.opts.Logger.Error("leader work failed", "error", err)
	}
}

func orDefault(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}
