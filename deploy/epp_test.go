package deploy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/discovery/k8s"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// The assembled EPP, as the chart runs it (--kubernetes), is ready only
// once discovery has read the pool and its pods.
func TestEPPOnKubernetesIsReadyAfterDiscoverySyncs(t *testing.T) {
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
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns = "epp-on-k8s"
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	e, err := epp.New(epp.Options{
		Pool: "pool", Namespace: ns, EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Discovery: func(ds *datalayer.Datastore, objectives *datalayer.Objectives, reg prometheus.Registerer, logger *slog.Logger) (epp.Discovery, error) {
			return k8s.NewSource(k8s.SourceOptions{Namespace: ns, Pool: "pool", Config: apiServer.Config, DefaultModel: "m"}, ds, objectives, reg, logger)
		},
	})
	if err != nil {
		t.Fatalf("epp.New: %v", err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vllm-0", Namespace: ns, Labels: map[string]string{"app": "vllm"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
	}
	if err := c.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{PodIP: "10.9.0.1", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	if err := c.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	// Once discovery has seen the pod, and with no pool to put it in, the
	// EPP must still not be ready.
	testkit.WaitFor(t, "discovery to reconcile the pod", func() error {
		if seen := testkit.Value(t, e.Registry(), "kvroute_k8s_reconciles_total", "kind", "pod", "result", "ok"); seen < 1 {
			return fmt.Errorf("testkit.Value(t, e.Registry(), \"kvroute_k8s_reconciles_total\", \"kind\", \"pod\", \"result\", \"ok\") is %v, want >= %v", seen, 1)
		}
		return nil
	})
	if e.Ready() {
		t.Fatal("ready before the InferencePool exists")
	}
	pool := &inferencev1.InferencePool{
		ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: ns},
		Spec: inferencev1.InferencePoolSpec{
			Selector:          inferencev1.LabelSelector{MatchLabels: map[inferencev1.LabelKey]inferencev1.LabelValue{"app": "vllm"}},
			TargetPorts:       []inferencev1.Port{{Number: 8000}},
			EndpointPickerRef: inferencev1.EndpointPickerRef{Name: "epp", Port: &inferencev1.Port{Number: 9002}},
		},
	}
	if err := c.Create(ctx, pool); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the EPP to be ready once the pool appeared", func() error {
		if !e.Ready() {
			return errors.New("e.Ready() is false")
		}
		return nil
	})
	ep, ok := e.Datastore().Get("vllm-0")
	if !ok || ep.Address != "10.9.0.1:8000" || ep.Model != "m" {
		t.Errorf("endpoint vllm-0 = %+v, %t; want 10.9.0.1:8000 serving m", ep, ok)
	}
}
