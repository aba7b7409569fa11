package k8s

import (
	"context"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// node creates a Node with labels; Nodes are cluster-wide, so its name
// carries the test's namespace.
func (cl *cluster) node(name string, labels map[string]string) *corev1.Node {
	cl.t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cl.ns + "-" + name, Labels: labels}}
	cl.create(n)
	cl.t.Cleanup(func() { _ = cl.c.Delete(context.Background(), n) })
	return n
}

// podOn creates a ready pod scheduled onto node.
func (cl *cluster) podOn(name, ip, node string) {
	cl.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: cl.ns, Labels: vllm,
			Annotations: map[string]string{DefaultModelAnnotation: "org/model-a"}},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}}},
	}
	cl.create(p)
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	cl.setReady(p, true)
}

func (e *epp) waitTopology(name string, want datalayer.Topology) {
	e.t.Helper()
	testkit.WaitFor(e.t, fmt.Sprintf("endpoint %s at %+v", name, want), func() error {
		ep, ok := e.ds.Get(name)
		if !ok {
			return fmt.Errorf("no endpoint %s", name)
		}
		if ep.Topology != want {
			return fmt.Errorf("endpoint %s at %+v", name, ep.Topology)
		}
		return nil
	})
}

func nodeLabels(host, rack, zone, region string) map[string]string {
	return map[string]string{
		"kubernetes.io/hostname": host, "example.com/rack": rack,
		"topology.kubernetes.io/zone": zone, "topology.kubernetes.io/region": region,
	}
}

func TestEndpointsCarryTheirNodesTopology(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	n1 := cl.node("n1", nodeLabels("host-1", "rack-a", "zone-1", "region-1"))
	cl.node("n2", nodeLabels("host-2", "rack-b", "zone-1", "region-1"))
	cl.podOn("a", "10.0.9.1", n1.Name)
	cl.podOn("b", "10.0.9.2", cl.ns+"-n2")
	// A pod on a Node not yet made is known by its node's name until the
	// Node arrives.
	cl.podOn("c", "10.0.9.3", cl.ns+"-n3")
	cl.pool("pool", vllm, 8000)
	e := startEPP(t, cl, Options{PoolName: "pool", RackLabel: "example.com/rack"})

	e.waitTopology("a", datalayer.Topology{Host: "host-1", Rack: "rack-a", Zone: "zone-1", Region: "region-1"})
	e.waitTopology("b", datalayer.Topology{Host: "host-2", Rack: "rack-b", Zone: "zone-1", Region: "region-1"})
	e.waitTopology("c", datalayer.Topology{Host: cl.ns + "-n3"})

	cl.node("n3", nodeLabels("host-3", "rack-b", "zone-2", "region-1"))
	e.waitTopology("c", datalayer.Topology{Host: "host-3", Rack: "rack-b", Zone: "zone-2", Region: "region-1"})

	// A node relabelled (moved to another rack) moves its pods' endpoints.
	n1.Labels["example.com/rack"] = "rack-b"
	cl.update(n1)
	e.waitTopology("a", datalayer.Topology{Host: "host-1", Rack: "rack-b", Zone: "zone-1", Region: "region-1"})
	if ep, _ := e.ds.Get("a"); ep.Address != "10.0.9.1:8000" {
		t.Fatalf("endpoint a at %s after its node's relabelling", ep.Address)
	}
}

func TestTheDefaultRackLabelAndNoNodeTopology(t *testing.T) {
	t.Parallel()
	cl := newCluster(t)
	n := cl.node("n1", map[string]string{"kubernetes.io/hostname": "host-1", "topology.kubernetes.io/rack": "rack-z", "example.com/rack": "rack-a"})
	cl.podOn("a", "10.0.9.11", n.Name)
	cl.pool("pool", vllm, 8000)
	e := startEPP(t, cl, Options{PoolName: "pool"})
	e.waitTopology("a", datalayer.Topology{Host: "host-1", Rack: "rack-z"})

	off := startEPP(t, cl, Options{PoolName: "pool", NoNodeTopology: true})
	off.waitEndpoints(map[string]string{"a": "10.0.9.11:8000"})
	if ep, _ := off.ds.Get("a"); !ep.Topology.IsZero() {
		t.Fatalf("with NoNodeTopology, endpoint a at %+v", ep.Topology)
	}
}
