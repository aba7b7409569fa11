package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// syncer owns the endpoints discovery put in the datastore. Both
// reconcilers go through it under one lock, and each decision reads the
// pod and the pool as they are now in the cache, never as an event said
// they were: a reconcile that runs late then repeats the latest truth, so
// a deleted pod cannot be brought back by a stale one.
type syncer struct {
	mu   sync.Mutex
	ds   *datalayer.Datastore
	pool *PoolInfo
	// owned maps each pod to the endpoint names it has in the datastore,
	// so that a pod that leaves, or a pool that loses ports, removes
	// exactly what it added and nothing another source added.
	owned map[string][]string

	namespace                     string
	modelAnnotation, defaultModel string
	// rackLabel is the node label read as the rack; nodes false reads no
	// Node, leaving topology empty.
	rackLabel string
	nodes     bool
	m         *metrics
	logger    *slog.Logger
}

func newSyncer(ds *datalayer.Datastore, o *Options, m *metrics) *syncer {
	return &syncer{
		ds:              ds,
		owned:           map[string][]string{},
		namespace:       o.Namespace,
		modelAnnotation: o.ModelAnnotation,
		defaultModel:    o.Model,
		rackLabel:       o.RackLabel,
		nodes:           !o.NoNodeTopology,
		m:               m,
		logger:          o.Logger,
	}
}

// currentPool returns a copy of the pool as last set.
func (s *syncer) currentPool() (PoolInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool == nil {
		return PoolInfo{}, false
	}
	p := *s.pool
	p.TargetPorts = slices.Clone(p.TargetPorts)
	return p, true
}

// setPool adopts a new view of the pool and, when it changes which pods or
// ports count, re-derives every pod's endpoints from the cache.
func (s *syncer) setPool(ctx context.Context, c client.Reader, p *PoolInfo) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	resync := !s.pool.same(p)
	s.pool = p
	s.m.setPoolInfo(p)
	if !resync {
		return nil
	}
	s.logger.Info("pool changed, resynchronising its endpoints", "namespace", p.Namespace, "pool", p.Name,
		"selector", p.Selector.String(), "targetPorts", p.TargetPorts, "appProtocol", p.AppProtocol)
	return s.resyncLocked(ctx, c)
}

// clearPool forgets the pool and removes every endpoint discovery added:
// with no pool there is nothing to route to.
func (s *syncer) clearPool() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pool = nil
	s.m.setPoolInfo(nil)
	for pod := range s.owned {
		s.applyLocked(pod, nil)
	}
}

// syncPod brings one pod's endpoints in line with the pod as the cache has
// it now.
func (s *syncer) syncPod(ctx context.Context, c client.Reader, key types.NamespacedName) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool == nil {
		// The pool's arrival resynchronises every pod.
		return nil
	}
	var pod corev1.Pod
	if err := c.Get(ctx, key, &pod); err != nil {
		if apierrors.IsNotFound(err) {
			s.applyLocked(key.Name, nil)
			return nil
		}
		return fmt.Errorf("get pod %s: %w", key, err)
	}
	topo, err := s.topologyOf(ctx, c, &pod)
	if err != nil {
		return err
	}
	eps, err := s.pool.endpointsFor(&pod, s.modelAnnotation, s.defaultModel, topo)
	if err != nil {
		s.applyLocked(key.Name, nil)
		return err
	}
	s.applyLocked(key.Name, eps)
	return nil
}

// nodeMeta is how a Node is read: its metadata alone (the cache keeps
// no node status, which is most of a Node's size).
func nodeMeta() *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(corev1.SchemeGroupVersion.WithKind("Node"))
	return m
}

// topologyOf is where pod runs: its node's labels. A pod not yet
// scheduled has no place; one whose Node is not (yet) in the cache is
// known by its node's name alone, which is the node's hostname label on
// every common distribution, until the Node's arrival syncs it again.
func (s *syncer) topologyOf(ctx context.Context, c client.Reader, pod *corev1.Pod) (datalayer.Topology, error) {
	if !s.nodes || pod.Spec.NodeName == "" {
		return datalayer.Topology{}, nil
	}
	node := nodeMeta()
	if err := c.Get(ctx, types.NamespacedName{Name: pod.Spec.NodeName}, node); err != nil {
		if apierrors.IsNotFound(err) {
			return datalayer.Topology{Host: pod.Spec.NodeName}, nil
		}
		return datalayer.Topology{}, fmt.Errorf("get node %s of pod %s/%s: %w", pod.Spec.NodeName, pod.Namespace, pod.Name, err)
	}
	t := datalayer.TopologyFromLabels(node.Labels, s.rackLabel)
	if t.Host == "" {
		t.Host = node.Name
	}
	return t, nil
}

// syncNode re-derives the endpoints of the pool's pods on node, whose
// labels changed (or which arrived after its pods).
func (s *syncer) syncNode(ctx context.Context, c client.Reader, node string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pool == nil {
		return nil
	}
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(s.namespace)); err != nil {
		return fmt.Errorf("list pods in %s: %w", s.namespace, err)
	}
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		if pod.Spec.NodeName != node {
			continue
		}
		if err := s.derivePodLocked(ctx, c, pod); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// derivePodLocked applies pod's endpoints as the cache has it; s.mu is
// held.
func (s *syncer) derivePodLocked(ctx context.Context, c client.Reader, pod *corev1.Pod) error {
	topo, err := s.topologyOf(ctx, c, pod)
	if err != nil {
		return err
	}
	eps, err := s.pool.endpointsFor(pod, s.modelAnnotation, s.defaultModel, topo)
	s.applyLocked(pod.Name, eps)
	return err
}

// resyncLocked re-derives every pod's endpoints from the cache; s.mu is held.
func (s *syncer) resyncLocked(ctx context.Context, c client.Reader) error {
	var pods corev1.PodList
	if err := c.List(ctx, &pods, client.InNamespace(s.namespace)); err != nil {
		return fmt.Errorf("list pods in %s: %w", s.namespace, err)
	}
	seen := make(map[string]bool, len(pods.Items))
	var errs []error
	for i := range pods.Items {
		pod := &pods.Items[i]
		seen[pod.Name] = true
		if err := s.derivePodLocked(ctx, c, pod); err != nil {
			errs = append(errs, err)
		}
	}
	for pod := range s.owned {
		if !seen[pod] {
			s.applyLocked(pod, nil)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("resynchronise pool: %w", errs[0])
	}
	return nil
}

// applyLocked makes pod's endpoints in the datastore exactly eps; s.mu is
// held.
func (s *syncer) applyLocked(pod string, eps []*datalayer.Endpoint) {
	prev := s.owned[pod]
	keep := make(map[string]bool, len(eps))
	for _, ep := range eps {
		keep[ep.Name] = true
	}
	for _, name := range prev {
		if !keep[name] {
			s.ds.Remove(name)
			s.m.changes.WithLabelValues("removed").Inc()
		}
	}
	names := make([]string, 0, len(eps))
	for _, ep := range eps {
		if cur, ok := s.ds.Get(ep.Name); !ok || !cur.Equal(ep) {
			s.ds.Upsert(ep)
			s.m.changes.WithLabelValues("upserted").Inc()
		}
		names = append(names, ep.Name)
	}
	if len(names) == 0 {
		delete(s.owned, pod)
	} else {
		s.owned[pod] = names
	}
}
