package upstreamepp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"
	inferencev1alpha2 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"
)

// Pod is one simulated engine as the cluster shows it.
type Pod struct {
	Name string
	// IP is the pod's status IP: the engine's own loopback address.
	IP string
}

// Objective is an InferenceObjective of the pool: requests naming it in
// x-gateway-inference-objective get its priority (below zero: sheddable).
type Objective struct {
	Name     string
	Priority int
}

// ClusterOptions shape the cluster the upstream EPP discovers its pool in.
type ClusterOptions struct {
	// Assets is envtest's binaries' folder (default: Assets()).
	Assets string
	// Namespace and Pool name the InferencePool (default "kvsim", "kvsim").
	Namespace, Pool string
	// Port is the pool's one target port: every engine's port.
	Port int
	// Pods are the pool's pods, each created ready with its IP.
	Pods []Pod
	// Objectives are the pool's InferenceObjectives, created before any
	// EPP starts, so that it knows each request's priority from its first.
	Objectives []Objective
	// Dir receives the kubeconfig (default: a temporary folder, removed
	// at Stop).
	Dir string
}

// Cluster is envtest's API server holding one InferencePool and its pods.
type Cluster struct {
	opts       ClusterOptions
	env        *envtest.Environment
	cfg        *rest.Config
	c          client.Client
	kubeconfig string
	tmp        string
}

var setLoggers sync.Once

// StartCluster starts the API server with the module's CRDs, creates the
// namespace, the InferencePool (selecting the pods by label, targeting
// opts.Port) and every pod, ready, with its IP, and writes a kubeconfig
// of a cluster administrator. Stop stops it.
func StartCluster(ctx context.Context, opts ClusterOptions) (*Cluster, error) {
	if opts.Port <= 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("upstreamepp: target port %d", opts.Port)
	}
	if len(opts.Pods) == 0 {
		return nil, errors.New("upstreamepp: a pool needs at least one pod")
	}
	if opts.Namespace == "" {
		opts.Namespace = "kvsim"
	}
	if opts.Pool == "" {
		opts.Pool = "kvsim"
	}
	if opts.Assets == "" {
		a, err := Assets()
		if err != nil {
			return nil, err
		}
		opts.Assets = a
	}
	crds, err := CRDDir()
	if err != nil {
		return nil, err
	}
	// controller-runtime and client-go log through globals and complain,
	// with a stack trace, until one is set; envtest's own lines are noise.
	setLoggers.Do(func() {
		ctrllog.SetLogger(logr.Discard())
		klog.SetLogger(logr.Discard())
	})
	cl := &Cluster{opts: opts, env: &envtest.Environment{
		BinaryAssetsDirectory: opts.Assets,
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
	}}
	if cl.cfg, err = cl.env.Start(); err != nil {
		return nil, fmt.Errorf("upstreamepp: envtest API server (assets %s): %w", opts.Assets, err)
	}
	if err := cl.setUp(ctx); err != nil {
		return nil, errors.Join(err, cl.Stop())
	}
	return cl, nil
}

func (cl *Cluster) setUp(ctx context.Context) error {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return fmt.Errorf("upstreamepp: scheme: %w", err)
	}
	if err := inferencev1.Install(scheme); err != nil {
		return fmt.Errorf("upstreamepp: scheme: %w", err)
	}
	if err := inferencev1alpha2.Install(scheme); err != nil {
		return fmt.Errorf("upstreamepp: scheme: %w", err)
	}
	var err error
	if cl.c, err = client.New(cl.cfg, client.Options{Scheme: scheme}); err != nil {
		return fmt.Errorf("upstreamepp: client: %w", err)
	}
	if err := cl.writeKubeconfig(); err != nil {
		return err
	}
	o := cl.opts
	// "default" and the system namespaces exist already.
	if err := cl.c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("upstreamepp: create namespace %s: %w", o.Namespace, err)
	}
	pool := &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: o.Pool, Namespace: o.Namespace},
		Spec: inferencev1.InferencePoolSpec{
			Selector: inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{
				"app": inferencev1.LabelValue(cl.appLabel()),
			}},
			TargetPorts:       []inferencev1.Port{{Number: inferencev1.PortNumber(o.Port)}},
			EndpointPickerRef: inferencev1.EndpointPickerRef{Name: inferencev1.ObjectName(o.Pool + "-epp"), Port: &inferencev1.Port{Number: 9002}},
		},
	}
	if err := cl.c.Create(ctx, pool); err != nil {
		return fmt.Errorf("upstreamepp: create InferencePool %s: %w", o.Pool, err)
	}
	for _, p := range o.Pods {
		if err := cl.createPod(ctx, p); err != nil {
			return err
		}
	}
	for _, obj := range o.Objectives {
		priority := obj.Priority
		io := &inferencev1alpha2.InferenceObjective{
			ObjectMeta: metav1.ObjectMeta{Name: obj.Name, Namespace: o.Namespace},
			Spec: inferencev1alpha2.InferenceObjectiveSpec{
				Priority: &priority,
				PoolRef:  inferencev1alpha2.PoolObjectReference{Group: "inference.networking.k8s.io", Name: inferencev1alpha2.ObjectName(o.Pool)},
			},
		}
		if err := cl.c.Create(ctx, io); err != nil {
			return fmt.Errorf("upstreamepp: create InferenceObjective %s: %w", obj.Name, err)
		}
	}
	return nil
}

func (cl *Cluster) appLabel() string { return cl.opts.Pool + "-engine" }

// createPod creates p and, since no kubelet runs, writes its status as a
// kubelet would once the model server is ready.
func (cl *Cluster) createPod(ctx context.Context, p Pod) error {
	if net.ParseIP(p.IP) == nil {
		return fmt.Errorf("upstreamepp: pod %s has no IP address: %q", p.Name, p.IP)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: cl.opts.Namespace, Labels: map[string]string{"app": cl.appLabel()}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "vllm", Image: "vllm",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(cl.opts.Port)}},
		}}},
	}
	if err := cl.c.Create(ctx, pod); err != nil {
		return fmt.Errorf("upstreamepp: create pod %s: %w", p.Name, err)
	}
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: p.IP, PodIPs: []corev1.PodIP{{IP: p.IP}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}},
	}
	if err := cl.c.Status().Update(ctx, pod); err != nil {
		return fmt.Errorf("upstreamepp: status of pod %s: %w", p.Name, err)
	}
	return nil
}

func (cl *Cluster) writeKubeconfig() error {
	user, err := cl.env.AddUser(envtest.User{Name: "upstream-epp", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("upstreamepp: API server user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("upstreamepp: kubeconfig: %w", err)
	}
	dir := cl.opts.Dir
	if dir == "" {
		if cl.tmp, err = os.MkdirTemp("", "upstreamepp-"); err != nil {
			return fmt.Errorf("upstreamepp: %w", err)
		}
		dir = cl.tmp
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("upstreamepp: %w", err)
	}
	cl.kubeconfig = filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(cl.kubeconfig, kc, 0o600); err != nil {
		return fmt.Errorf("upstreamepp: write kubeconfig: %w", err)
	}
	return nil
}

// Kubeconfig is the path of a kubeconfig that reaches the API server.
func (cl *Cluster) Kubeconfig() string { return cl.kubeconfig }

// Config reaches the API server as a cluster administrator.
func (cl *Cluster) Config() *rest.Config { return rest.CopyConfig(cl.cfg) }

// Namespace and Pool name the InferencePool.
func (cl *Cluster) Namespace() string { return cl.opts.Namespace }

// Pool names the InferencePool.
func (cl *Cluster) Pool() string { return cl.opts.Pool }

// Pods are the pool's pods.
func (cl *Cluster) Pods() []Pod { return append([]Pod(nil), cl.opts.Pods...) }

// Stop stops the API server and removes what StartCluster made in a
// temporary folder.
func (cl *Cluster) Stop() error {
	err := cl.env.Stop()
	if cl.tmp != "" {
		err = errors.Join(err, os.RemoveAll(cl.tmp))
	}
	if err != nil {
		return fmt.Errorf("upstreamepp: stop API server: %w", err)
	}
	return nil
}
