package k8s

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	inferencev1alpha2 "sigs.k8s.io/gateway-api-inference-extension/apix/v1alpha2"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

func objective(ns, name, pool string, priority *int, annotations map[string]string) *inferencev1alpha2.InferenceObjective {
	return &inferencev1alpha2.InferenceObjective{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: inferencev1alpha2.InferenceObjectiveSpec{Priority: priority,
			PoolRef: inferencev1alpha2.PoolObjectReference{Name: inferencev1alpha2.ObjectName(pool)}},
	}
}

func TestThePoolsInferenceObjectivesAreReconciled(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := inferencev1alpha2.Install(scheme); err != nil {
		t.Fatal(err)
	}
	c, err := client.New(apiServer.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	create := func(o client.Object) {
		t.Helper()
		if err := c.Create(context.Background(), o); err != nil {
			t.Fatalf("create %s: %v", o.GetName(), err)
		}
	}
	cl.pool("pool", vllm, 8000)
	minus, ten := -1, 10
	create(objective(cl.ns, "batch", "pool", &minus, map[string]string{AnnotationSLOTTFT: "2000", AnnotationSLOTPOT: "50"}))
	create(objective(cl.ns, "chat", "pool", &ten, map[string]string{AnnotationSLOTTFT: "soon"}))
	create(objective(cl.ns, "plain", "pool", nil, nil))
	create(objective(cl.ns, "elsewhere", "other-pool", &ten, nil))

	objs := datalayer.NewObjectives(nil)
	e := startEPP(t, cl, Options{PoolName: "pool", Objectives: objs})
	want := func(what string, expect map[string]datalayer.Objective) {
		t.Helper()
		testkit.WaitFor(t, what, func() error {
			got := objs.List()
			if len(got) != len(expect) {
				return fmt.Errorf("objectives %+v", got)
			}
			for _, o := range got {
				if expect[o.Name] != o {
					return fmt.Errorf("objective %+v, want %+v", o, expect[o.Name])
				}
			}
			return nil
		})
	}
	want("the pool's three objectives", map[string]datalayer.Objective{
		"batch": {Name: "batch", Priority: -1, TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond},
		// A bad annotation is ignored; the priority stays.
		"chat":  {Name: "chat", Priority: 10},
		"plain": {Name: "plain"},
	})
	if v := testkit.Value(t, e.reg, "kvroute_k8s_reconciles_total", "kind", "objective"); v < 4 {
		t.Errorf("objective reconciles = %v, want at least one per object", v)
	}

	var batch inferencev1alpha2.InferenceObjective
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: cl.ns, Name: "batch"}, &batch); err != nil {
		t.Fatal(err)
	}
	batch.Spec.Priority = &ten
	batch.Spec.PoolRef.Name = "pool"
	if err := c.Update(context.Background(), &batch); err != nil {
		t.Fatal(err)
	}
	var chat inferencev1alpha2.InferenceObjective
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: cl.ns, Name: "chat"}, &chat); err != nil {
		t.Fatal(err)
	}
	chat.Spec.PoolRef.Name = "other-pool" // moved to another pool: not ours any more
	if err := c.Update(context.Background(), &chat); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(context.Background(), objective(cl.ns, "plain", "pool", nil, nil)); err != nil {
		t.Fatal(err)
	}
	want("the updates, the move and the deletion", map[string]datalayer.Objective{
		"batch": {Name: "batch", Priority: 10, TTFT: 2 * time.Second, TPOT: 50 * time.Millisecond},
	})
}
