package k8s

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// PoolInfo is the pool as discovery currently understands it.
type PoolInfo struct {
	Namespace, Name string
	// Selector picks the pool's pods within Namespace.
	Selector labels.Selector
	// TargetPorts are the ports of each pod the gateway routes to; each is
	// a separate endpoint.
	TargetPorts []int32
	// AppProtocol is how the gateway speaks to the target ports: "http" or
	// "kubernetes.io/h2c".
	AppProtocol string
	// EndpointPicker names the service the pool sends picks to and what
	// the gateway does when it fails ("FailOpen" or "FailClose"); empty in
	// standalone mode.
	EndpointPicker, FailureMode string
}

// poolInfoFrom reads what discovery needs from an InferencePool.
func poolInfoFrom(p *inferencev1.InferencePool) (*PoolInfo, error) {
	if len(p.Spec.Selector.MatchLabels) == 0 {
		// An empty selector would select every pod in the namespace, which
		// the API's validation forbids; do not trust a pool that has one.
		return nil, fmt.Errorf("InferencePool %s/%s: empty selector", p.Namespace, p.Name)
	}
	set := make(labels.Set, len(p.Spec.Selector.MatchLabels))
	for k, v := range p.Spec.Selector.MatchLabels {
		set[string(k)] = string(v)
	}
	ports := make([]int32, 0, len(p.Spec.TargetPorts))
	for _, tp := range p.Spec.TargetPorts {
		ports = append(ports, int32(tp.Number))
	}
	if len(ports) == 0 {
		return nil, fmt.Errorf("InferencePool %s/%s: no target ports", p.Namespace, p.Name)
	}
	if err := checkPorts(ports); err != nil {
		return nil, fmt.Errorf("InferencePool %s/%s: %w", p.Namespace, p.Name, err)
	}
	info := &PoolInfo{
		Namespace:   p.Namespace,
		Name:        p.Name,
		Selector:    labels.SelectorFromValidatedSet(set),
		TargetPorts: ports,
		AppProtocol: string(p.Spec.AppProtocol),
		FailureMode: string(p.Spec.EndpointPickerRef.FailureMode),
	}
	if info.AppProtocol == "" {
		info.AppProtocol = string(inferencev1.AppProtocolHTTP)
	}
	if ref := p.Spec.EndpointPickerRef; ref.Name != "" {
		info.EndpointPicker = string(ref.Name)
		if ref.Port != nil {
			info.EndpointPicker += ":" + strconv.Itoa(int(ref.Port.Number))
		}
	}
	return info, nil
}

// same reports whether two views of the pool put the same endpoints in the
// datastore.
func (p *PoolInfo) same(q *PoolInfo) bool {
	if p == nil || q == nil {
		return p == q
	}
	return p.Selector.String() == q.Selector.String() && slices.Equal(p.TargetPorts, q.TargetPorts)
}

// podReady reports whether the pod can take traffic: Ready, addressed and
// not on its way out. A terminating pod stays Ready for a while; routing
// new requests to it only gets them cut off.
func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// endpointName names the endpoint of a pod's idx-th target port: the pod's
// name when the pool has one port, "<pod>-rank-<idx>" when it has several.
func endpointName(pod string, idx, ports int) string {
	if ports == 1 {
		return pod
	}
	return pod + "-rank-" + strconv.Itoa(idx)
}

// endpointsFor returns the endpoints pod should have in the pool: none
// unless it is ready and selected. The error is for a pod whose IP cannot
// be read, which the API server should never allow.
func (p *PoolInfo) endpointsFor(pod *corev1.Pod, modelAnnotation, defaultModel string, topo datalayer.Topology) ([]*datalayer.Endpoint, error) {
	if p == nil || !podReady(pod) || !p.Selector.Matches(labels.Set(pod.Labels)) {
		return nil, nil
	}
	ip, err := netip.ParseAddr(pod.Status.PodIP)
	if err != nil {
		return nil, fmt.Errorf("pod %s/%s: IP %q: %w", pod.Namespace, pod.Name, pod.Status.PodIP, err)
	}
	model := pod.Annotations[modelAnnotation]
	if model == "" {
		model = defaultModel
	}
	out := make([]*datalayer.Endpoint, len(p.TargetPorts))
	for i, port := range p.TargetPorts {
		out[i] = &datalayer.Endpoint{
			Name: endpointName(pod.Name, i, len(p.TargetPorts)),
			// The canonical form, so that it equals the Kv-Endpoint header
			// the pod's relay sends.
			Address:   netip.AddrPortFrom(ip.Unmap(), uint16(port)).String(),
			Pod:       pod.Name,
			Namespace: pod.Namespace,
			Model:     model,
			Labels:    maps.Clone(pod.Labels),
			Topology:  topo,
		}
	}
	return out, nil
}
