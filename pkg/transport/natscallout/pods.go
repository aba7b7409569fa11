package natscallout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// Errors of a pod check; each is the denial reason pod_not_in_pool.
var (
	// ErrPodGone: no pod of that name and UID exists.
	ErrPodGone = errors.New("pod not found")
	// ErrPodNotInPool: the pod exists but the pool's selector does not
	// pick it.
	ErrPodNotInPool = errors.New("pod outside the pool")
)

// Pods says whether a token's pod is alive, and whether it is one of the
// pool's.
type Pods interface {
	// Check returns nil when pod namespace/name exists with uid (any uid
	// when uid is empty) and, if inPool, the pool's selector picks it.
	Check(ctx context.Context, namespace, name, uid string, inPool bool) error
}

// PodLister answers from an informer's cache of the namespace's pods, so
// a check costs the API server nothing; a pod the cache has not seen yet
// (made a moment ago) is fetched, at most 5 times a second.
type PodLister struct {
	factory  informers.SharedInformerFactory
	lister   corelisters.PodLister
	synced   cache.InformerSynced
	client   kubernetes.Interface
	selector labels.Selector
	fetches  *rate.Limiter
}

var _ Pods = (*PodLister)(nil)

// NewPodLister watches the pods of namespace; selector picks the pool's.
func NewPodLister(cs kubernetes.Interface, namespace string, selector labels.Selector) *PodLister {
	f := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute, informers.WithNamespace(namespace))
	inf := f.Core().V1().Pods()
	return &PodLister{factory: f, lister: inf.Lister(), synced: inf.Informer().HasSynced, client: cs, selector: selector,
		fetches: rate.NewLimiter(5, 10)}
}

// Start runs the informer until ctx is done and waits for its first list.
func (l *PodLister) Start(ctx context.Context) error {
	l.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), l.synced) {
		return fmt.Errorf("pod informer: %w", ctx.Err())
	}
	return nil
}

// Shutdown waits for the informer's goroutines after Start's ctx is done.
func (l *PodLister) Shutdown() { l.factory.Shutdown() }

// Check implements Pods.
func (l *PodLister) Check(ctx context.Context, namespace, name, uid string, inPool bool) error {
	p, err := l.lister.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) && l.fetches.Allow() {
		// A pod just made may not have reached the cache yet.
		p, err = l.client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%w: %s/%s", ErrPodGone, namespace, name)
	case err != nil:
		return fmt.Errorf("pod %s/%s: %w", namespace, name, err)
	}
	return checkPod(p, uid, inPool, l.selector)
}

func checkPod(p *corev1.Pod, uid string, inPool bool, selector labels.Selector) error {
	switch {
	case uid != "" && string(p.UID) != uid:
		return fmt.Errorf("%w: %s/%s has UID %s, the token names %s", ErrPodGone, p.Namespace, p.Name, p.UID, uid)
	case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
		return fmt.Errorf("%w: %s/%s has ended (%s)", ErrPodGone, p.Namespace, p.Name, p.Status.Phase)
	case inPool && (selector == nil || selector.Empty() || !selector.Matches(labels.Set(p.Labels))):
		return fmt.Errorf("%w: %s/%s is not picked by %q", ErrPodNotInPool, p.Namespace, p.Name, selector)
	}
	return nil
}
