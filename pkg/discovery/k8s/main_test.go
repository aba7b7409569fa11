package k8s

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvroute/kvroute/pkg/testkit/apiserver"
)

// waitLimit bounds every wait in these tests. It guards against hangs; it
// is not a timing assertion: on a loaded machine things take long, never
// this long.
const waitLimit = 60 * time.Second

// apiServer is the envtest API server shared by the package's tests; each
// test works in a namespace of its own.
var apiServer apiserver.Server

func TestMain(m *testing.M) { os.Exit(apiServer.Main(m, "../../../deploy/crds")) }

// cluster is a test's view of the API server: a client and a namespace of
// its own.
type cluster struct {
	t  *testing.T
	c  client.Client
	ns string
}

var nsSeq atomic.Int64

func newCluster(t *testing.T) *cluster {
	t.Helper()
	apiServer.Require(t)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := inferencev1.Install(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(apiServer.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("client: %v", err)
	}
	name := fmt.Sprintf("t%d-%s", nsSeq.Add(1), strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name())))
	if len(name) > 63 {
		name = strings.TrimRight(name[:63], "-")
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), ns); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return &cluster{t: t, c: c, ns: name}
}

// pod creates a pod and, since envtest has no kubelet, sets its status
// itself: an IP, and Ready as asked.
func (cl *cluster) pod(name, ip string, ready bool, labels map[string]string) *corev1.Pod {
	cl.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cl.ns, Labels: labels,
			Annotations: map[string]string{DefaultModelAnnotation: "org/model-a"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
	}
	cl.create(p)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	cl.setReady(p, ready)
	return p
}

func (cl *cluster) setReady(p *corev1.Pod, ready bool) {
	cl.t.Helper()
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
	if err := cl.c.Status().Update(context.Background(), p); err != nil {
		cl.t.Fatalf("update status of pod %s: %v", p.Name, err)
	}
}

func (cl *cluster) pool(name string, selector map[string]string, ports ...int32) *inferencev1.InferencePool {
	cl.t.Helper()
	p := &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cl.ns},
		Spec: inferencev1.InferencePoolSpec{
			EndpointPickerRef: inferencev1.EndpointPickerRef{
				Name: "epp", Port: &inferencev1.Port{Number: 9002},
			},
		},
	}
	setPoolSpec(p, selector, ports...)
	cl.create(p)
	return p
}

func setPoolSpec(p *inferencev1.InferencePool, selector map[string]string, ports ...int32) {
	p.Spec.Selector.MatchLabels = map[inferencev1.LabelKey]inferencev1.LabelValue{}
	for k, v := range selector {
		p.Spec.Selector.MatchLabels[inferencev1.LabelKey(k)] = inferencev1.LabelValue(v)
	}
	p.Spec.TargetPorts = nil
	for _, n := range ports {
		p.Spec.TargetPorts = append(p.Spec.TargetPorts, inferencev1.Port{Number: inferencev1.PortNumber(n)})
	}
}

func (cl *cluster) create(o client.Object) {
	cl.t.Helper()
	if err := cl.c.Create(context.Background(), o); err != nil {
		cl.t.Fatalf("create %T %s: %v", o, o.GetName(), err)
	}
}

func (cl *cluster) update(o client.Object) {
	cl.t.Helper()
	if err := cl.c.Update(context.Background(), o); err != nil {
		cl.t.Fatalf("update %T %s: %v", o, o.GetName(), err)
	}
}

func (cl *cluster) delete(o client.Object) {
	cl.t.Helper()
	// No kubelet confirms a graceful deletion in envtest; delete at once.
	if err := cl.c.Delete(context.Background(), o, client.GracePeriodSeconds(0)); err != nil {
		cl.t.Fatalf("delete %T %s: %v", o, o.GetName(), err)
	}
}

// eventually polls cond until it holds or waitLimit passes.
// restConfigForValidation is never dialled: options are checked first.
var restConfigForValidation = rest.Config{Host: "https://127.0.0.1:1"}

func (cl *cluster) getPod(name string) *corev1.Pod {
	cl.t.Helper()
	var p corev1.Pod
	if err := cl.c.Get(context.Background(), client.ObjectKey{Namespace: cl.ns, Name: name}, &p); err != nil {
		cl.t.Fatalf("get pod %s: %v", name, err)
	}
	return &p
}
