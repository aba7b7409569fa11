package k8s

import (
	"errors"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	inferencev1 "sigs.k8s.io/gateway-api-inference-extension/api/v1"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

func readyPod(name, ip string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: labels},
		Status: corev1.PodStatus{PodIP: ip, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue},
		}},
	}
}

func TestEndpointsForAPod(t *testing.T) {
	t.Parallel()
	pool := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
	setPoolSpec(pool, map[string]string{"app": "vllm"}, 8000, 8001)
	info, err := poolInfoFrom(pool)
	if err != nil {
		t.Fatal(err)
	}
	single := *info
	single.TargetPorts = []int32{8000}
	now := metav1.Now()
	cases := []struct {
		name  string
		pool  *PoolInfo
		pod   func() *corev1.Pod
		want  []string // name=address
		isErr bool
	}{
		{"a ready matching pod has one endpoint per port", info,
			func() *corev1.Pod { return readyPod("a", "10.1.0.1", map[string]string{"app": "vllm"}) },
			[]string{"a-rank-0=10.1.0.1:8000", "a-rank-1=10.1.0.1:8001"}, false},
		{"a pool of one port names the endpoint after the pod", &single,
			func() *corev1.Pod { return readyPod("a", "10.1.0.1", map[string]string{"app": "vllm"}) },
			[]string{"a=10.1.0.1:8000"}, false},
		{"an IPv6 pod is bracketed", &single,
			func() *corev1.Pod { return readyPod("a", "fd00::1", map[string]string{"app": "vllm"}) },
			[]string{"a=[fd00::1]:8000"}, false},
		{"an IPv4-mapped IPv6 address is written as IPv4", &single,
			func() *corev1.Pod { return readyPod("a", "::ffff:10.1.0.9", map[string]string{"app": "vllm"}) },
			[]string{"a=10.1.0.9:8000"}, false},
		{"an unready pod has none", info, func() *corev1.Pod {
			p := readyPod("a", "10.1.0.1", map[string]string{"app": "vllm"})
			p.Status.Conditions[0].Status = corev1.ConditionFalse
			return p
		}, nil, false},
		{"a pod with no Ready condition has none", info, func() *corev1.Pod {
			p := readyPod("a", "10.1.0.1", map[string]string{"app": "vllm"})
			p.Status.Conditions = nil
			return p
		}, nil, false},
		{"a terminating pod has none", info, func() *corev1.Pod {
			p := readyPod("a", "10.1.0.1", map[string]string{"app": "vllm"})
			p.DeletionTimestamp = &now
			return p
		}, nil, false},
		{"a pod without an IP has none", info,
			func() *corev1.Pod { return readyPod("a", "", map[string]string{"app": "vllm"}) }, nil, false},
		{"an unmatched pod has none", info,
			func() *corev1.Pod { return readyPod("a", "10.1.0.1", map[string]string{"app": "other"}) }, nil, false},
		{"no pool, no endpoints", nil,
			func() *corev1.Pod { return readyPod("a", "10.1.0.1", map[string]string{"app": "vllm"}) }, nil, false},
		{"a garbled IP is an error", info,
			func() *corev1.Pod { return readyPod("a", "10.1.0", map[string]string{"app": "vllm"}) }, nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eps, err := tc.pool.endpointsFor(tc.pod(), DefaultModelAnnotation, "m", datalayer.Topology{})
			if (err != nil) != tc.isErr {
				t.Fatalf("err = %v, want error %t", err, tc.isErr)
			}
			var got []string
			for _, ep := range eps {
				got = append(got, ep.Name+"="+ep.Address)
				if ep.Model != "m" || ep.Pod != "a" || ep.Namespace != "ns" {
					t.Errorf("endpoint %+v: want model m, pod a, namespace ns", ep)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("endpoints = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPoolInfoRefusesPoolsItCannotServe(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		selector map[string]string
		ports    []int32
	}{
		{"empty selector", nil, []int32{8000}},
		{"no ports", map[string]string{"app": "vllm"}, nil},
		{"duplicate port", map[string]string{"app": "vllm"}, []int32{8000, 8000}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := &inferencev1.InferencePool{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}
			setPoolSpec(p, tc.selector, tc.ports...)
			if info, err := poolInfoFrom(p); err == nil {
				t.Errorf("poolInfoFrom = %+v, want an error", info)
			}
		})
	}
}

func TestParsePorts(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in   string
		want []int32
	}{
		{"8000", []int32{8000}},
		{"8000, 8001,", []int32{8000, 8001}},
		{"", nil},
		{"http", nil},
		{"0", nil},
		{"65536", nil},
		{"8000,8000", nil},
		{"99999999999", nil},
	}
	for _, tc := range cases {
		got, err := ParsePorts(tc.in)
		if tc.want == nil {
			if !errors.Is(err, ErrOptions) {
				t.Errorf("ParsePorts(%q) = %v, %v; want ErrOptions", tc.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParsePorts(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSelector(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"", "app in (", "=x"} {
		if _, err := ParseSelector(in); !errors.Is(err, ErrOptions) {
			t.Errorf("ParseSelector(%q) = %v, want ErrOptions", in, err)
		}
	}
	sel, err := ParseSelector("app=vllm,tier in (a,b)")
	if err != nil {
		t.Fatal(err)
	}
	if !sel.Matches(labels.Set{"app": "vllm", "tier": "b"}) || sel.Matches(labels.Set{"app": "vllm", "tier": "c"}) {
		t.Errorf("selector %s matches wrongly", sel)
	}
}

// FuzzParsePorts checks that no --endpoint-target-ports value panics and
// that what is accepted is a valid, duplicate-free port list.
func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"8000", "8000,8001", " 1 , 65535 ", "", ",", "-1", "0x50", "8000,8000", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ports, err := ParsePorts(s)
		if err != nil {
			if !errors.Is(err, ErrOptions) {
				t.Fatalf("ParsePorts(%q) error %v does not wrap ErrOptions", s, err)
			}
			return
		}
		if len(ports) == 0 || checkPorts(ports) != nil {
			t.Fatalf("ParsePorts(%q) = %v, accepted but invalid", s, ports)
		}
	})
}

// FuzzParseSelector checks that no --endpoint-selector value panics and
// that an accepted selector never selects every pod.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{"app=vllm", "app in (a,b),!legacy", "", "a=b,", "x notin ()", "=", "a==b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			if !errors.Is(err, ErrOptions) {
				t.Fatalf("ParseSelector(%q) error %v does not wrap ErrOptions", s, err)
			}
			return
		}
		if sel.Empty() {
			t.Fatalf("ParseSelector(%q) accepted a selector of every pod", s)
		}
	})
}
