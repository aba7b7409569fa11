package deploy

import (
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// containerEnv is the env of the rendered container, name to value.
func containerEnv(t *testing.T, obj *unstructured.Unstructured, name string) map[string]string {
	t.Helper()
	env := map[string]string{}
	list, _ := container(t, obj, name)["env"].([]any)
	for _, e := range list {
		em := e.(map[string]any)
		if v, ok := em["value"].(string); ok {
			env[em["name"].(string)] = v
		}
	}
	return env
}

// nonLoopback is an address of this machine that other hosts could use,
// or "" when it has none.
func nonLoopback(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLoopback() && ipn.IP.To4() != nil {
			return ipn.IP.String()
		}
	}
	return ""
}

// The events a relay takes from ZeroMQ are published under its pod's
// identity, so its sockets, and vLLM's replay socket, must listen where
// only the pod can reach them. The chart puts both on the pod's loopback,
// and the relay, started as the chart configures it, is reachable there
// and nowhere else.
func TestTheChartKeepsTheEngineSocketsOnThePodsLoopback(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		values map[string]any
		prefix string
	}{
		{"defaults", nil, "kv-kvroute"},
		{"every documented value set", readValues(t, "testdata/all-values.yaml"), "kvroute-full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, tc.values, "ns")
			dep := find(t, objs, "Deployment", tc.prefix+"-vllm")
			env := containerEnv(t, dep, "kv-relay")
			if env["KV_ZMQ_MODE"] != "bind" {
				t.Fatalf("the relay's ZeroMQ mode is %q; the chart's engine dials it", env["KV_ZMQ_MODE"])
			}
			for _, name := range []string{"KV_ZMQ_ENDPOINT", "KV_REPLAY_ENDPOINT"} {
				assertLoopback(t, name, env[name])
			}
			// vLLM's own sockets, from its --kv-events-config: the events
			// endpoint, which it dials, and the replay socket, which it
			// always binds.
			args := containerArgs(t, dep, "vllm")
			var kv struct {
				Endpoint       string `json:"endpoint"`
				ReplayEndpoint string `json:"replay_endpoint"`
			}
			for i, a := range args {
				if a == "--kv-events-config" && i+1 < len(args) {
					if err := json.Unmarshal([]byte(args[i+1]), &kv); err != nil {
						t.Fatalf("--kv-events-config %q: %v", args[i+1], err)
					}
				}
			}
			assertLoopback(t, "vLLM's endpoint", kv.Endpoint)
			assertLoopback(t, "vLLM's replay_endpoint", kv.ReplayEndpoint)
			// No NetworkPolicy rule names the socket ports.
			np := find(t, objs, "NetworkPolicy", tc.prefix+"-vllm")
			rules, _, _ := unstructured.NestedSlice(np.Object, "spec", "ingress")
			for _, r := range rules {
				ports, _ := r.(map[string]any)["ports"].([]any)
				if len(ports) == 0 {
					t.Fatalf("a NetworkPolicy rule admits every port: %v", r)
				}
				for _, p := range ports {
					if port := p.(map[string]any)["port"]; port != "http" && port != "relay-metrics" {
						t.Errorf("the model servers' NetworkPolicy admits port %v", port)
					}
				}
			}
		})
	}

	t.Run("the relay, started as the chart configures it, is reachable only on loopback", func(t *testing.T) {
		t.Parallel()
		other := nonLoopback(t)
		if other == "" {
			t.Skip("this machine has no address but loopback: nothing to connect from")
		}
		env := containerEnv(t, find(t, render(t, nil, "ns"), "Deployment", "kv-kvroute-vllm"), "kv-relay")
		u, err := url.Parse(env["KV_ZMQ_ENDPOINT"])
		if err != nil {
			t.Fatal(err)
		}
		// The chart's host, on a port free here.
		port := strings.TrimPrefix(testkit.FreeAddr(t), "127.0.0.1:")
		endpoint := "tcp://" + u.Hostname() + ":" + port
		n := testkit.StartNATS(t, testkit.NATSOptions{})
		nc := n.Connect(t, "relay")
		sp, _ := strconv.Atoi(env["KV_SERVING_PORT"])
		r, err := relay.New(relay.Config{ZMQEndpoint: endpoint, Namespace: "ns", Pool: "pool", Pod: "vllm-0", PodIP: "10.0.0.1",
			ServingPort: sp, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}, nc)
		if err != nil {
			t.Fatal(err)
		}
		testkit.Go(t, "the relay", r.Run)
		testkit.WaitFor(t, "the relay's socket to be up", func() error {
			if !r.Ready() {
				return errors.New("r.Ready() is false")
			}
			return nil
		})
		c, err := net.Dial("tcp", "127.0.0.1:"+port)
		if err != nil {
			t.Fatalf("the relay is not reachable on loopback either, so this test proves nothing: %v", err)
		}
		c.Close()
		c, err = net.DialTimeout("tcp", net.JoinHostPort(other, port), 5*time.Second)
		if err == nil {
			c.Close()
			t.Fatalf("a peer reached the relay's ZeroMQ socket at %s:%s", other, port)
		}
		var op *net.OpError
		if !errors.As(err, &op) {
			t.Fatalf("dial %s: %v", other, err)
		}
	})
}

func assertLoopback(t *testing.T, what, endpoint string) {
	t.Helper()
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" {
		t.Fatalf("%s %q is not a tcp:// endpoint", what, endpoint)
	}
	if ip := net.ParseIP(u.Hostname()); ip == nil || !ip.IsLoopback() {
		t.Errorf("%s %q listens beyond the pod's loopback", what, endpoint)
	}
}

// servicePorts are the names of a rendered Service's ports.
func servicePorts(t *testing.T, svc *unstructured.Unstructured) []string {
	t.Helper()
	ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
	var names []string
	for _, p := range ports {
		names = append(names, p.(map[string]any)["name"].(string))
	}
	return names
}

// The chart's Services carry what clients need and nothing that tells
// more: no /debug, no NATS monitoring (it lists every connection); and
// every container but the model server's runs with the hardened security
// context.
func TestTheChartExposesNeitherDebugNorMonitoringAndHardensItsContainers(t *testing.T) {
	t.Parallel()
	objs := render(t, nil, "ns")
	for _, tc := range []struct {
		service string
		want    []string
	}{
		{"kv-kvroute-epp", []string{"grpc", "grpc-health", "metrics"}},
		{"kv-kvroute-nats", []string{"client"}},
	} {
		if got := servicePorts(t, find(t, objs, "Service", tc.service)); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("Service %s exposes %v, want %v", tc.service, got, tc.want)
		}
	}
	args := strings.Join(containerArgs(t, find(t, objs, "Deployment", "kv-kvroute-epp"), "epp"), " ")
	if strings.Contains(args, "--debug-addr") || strings.Contains(args, "--enable-pprof") {
		t.Errorf("the EPP runs with /debug on by default: %s", args)
	}
	// Asked for, /debug listens on the pod's loopback, behind no port.
	debugArgs := strings.Join(containerArgs(t, find(t, render(t, map[string]any{"epp": map[string]any{"debug": true}}, "ns"), "Deployment", "kv-kvroute-epp"), "epp"), " ")
	if !strings.Contains(debugArgs, "--debug-addr=127.0.0.1:") {
		t.Errorf("epp.debug: args %s, want --debug-addr on loopback", debugArgs)
	}
	for _, o := range objs {
		kind := o.GetKind()
		if kind != "Deployment" && kind != "StatefulSet" {
			continue
		}
		for _, field := range []string{"initContainers", "containers"} {
			cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			for _, c := range cs {
				m := c.(map[string]any)
				if m["name"] == "vllm" {
					continue // the engine's image is vLLM's, and it needs its GPU
				}
				sc, _ := m["securityContext"].(map[string]any)
				caps, _ := sc["capabilities"].(map[string]any)
				drop, _ := caps["drop"].([]any)
				if sc["allowPrivilegeEscalation"] != false || sc["readOnlyRootFilesystem"] != true || sc["runAsNonRoot"] != true ||
					len(drop) != 1 || drop[0] != "ALL" {
					t.Errorf("%s %s: container %s runs with security context %v", kind, o.GetName(), m["name"], sc)
				}
			}
		}
	}
}
