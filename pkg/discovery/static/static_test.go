package static

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

const twoEndpoints = `
endpoints:
- name: vllm-0
  address: 10.0.0.7:8000
  model: meta-llama/Llama-3.1-8B-Instruct
  labels: {zone: a}
- name: vllm-1
  address: "[fd00::1]:8000"
  model: meta-llama/Llama-3.1-8B-Instruct
  pod: vllm-1-abcde
  namespace: serving
  topology: {hostname: node-7, rack: r12, zone: us-east-1a, region: us-east-1}
`

func TestParseStaticEndpoints(t *testing.T) {
	t.Parallel()
	eps, err := Parse([]byte(twoEndpoints))
	if err != nil {
		t.Fatal(err)
	}
	want := []datalayer.Endpoint{
		{Name: "vllm-0", Address: "10.0.0.7:8000", Pod: "vllm-0", Model: "meta-llama/Llama-3.1-8B-Instruct", Labels: map[string]string{"zone": "a"}},
		{Name: "vllm-1", Address: "[fd00::1]:8000", Pod: "vllm-1-abcde", Namespace: "serving", Model: "meta-llama/Llama-3.1-8B-Instruct",
			Topology: datalayer.Topology{Host: "node-7", Rack: "r12", Zone: "us-east-1a", Region: "us-east-1"}},
	}
	if len(eps) != len(want) {
		t.Fatalf("got %d endpoints, want %d", len(eps), len(want))
	}
	for i := range want {
		if !eps[i].Equal(&want[i]) {
			t.Errorf("endpoint %d = %+v, want %+v", i, *eps[i], want[i])
		}
	}
}

func TestParseStaticEndpointsRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		file  string
		wants []string // each must appear in the error
	}{
		{
			name:  "a host name instead of an IP is refused, naming the entry",
			file:  "endpoints:\n- {name: a, address: 'vllm.local:8000', model: m}\n",
			wants: []string{`endpoints[0] "a"`, "must be an IP address"},
		},
		{
			name:  "an address without a port is refused",
			file:  "endpoints:\n- {name: a, address: 10.0.0.1, model: m}\n",
			wants: []string{`endpoints[0] "a"`, "want ip:port"},
		},
		{
			name:  "port zero is refused",
			file:  "endpoints:\n- {name: a, address: '10.0.0.1:0', model: m}\n",
			wants: []string{"port must be 1 to 65535"},
		},
		{
			name:  "a port beyond 65535 is refused",
			file:  "endpoints:\n- {name: a, address: '10.0.0.1:70000', model: m}\n",
			wants: []string{"port must be 1 to 65535"},
		},
		{
			name:  "a duplicate name names both entries",
			file:  "endpoints:\n- {name: a, address: '10.0.0.1:80', model: m}\n- {name: a, address: '10.0.0.2:80', model: m}\n",
			wants: []string{`endpoints[1] "a": duplicate name, also endpoints[0]`},
		},
		{
			name:  "the same address written two ways is a duplicate",
			file:  "endpoints:\n- {name: a, address: '[::ffff:10.0.0.1]:80', model: m}\n- {name: b, address: '10.0.0.1:80', model: m}\n",
			wants: []string{`endpoints[1] "b": duplicate address 10.0.0.1:80`},
		},
		{
			name:  "a missing model and a missing name are both reported",
			file:  "endpoints:\n- {name: a, address: '10.0.0.1:80'}\n- {address: '10.0.0.2:80', model: m}\n",
			wants: []string{`endpoints[0] "a": missing model`, "endpoints[1]: missing name"},
		},
		{
			name:  "a misspelt field is an error, not an endpoint without an address",
			file:  "endpoints:\n- {name: a, adress: '10.0.0.1:80', model: m}\n",
			wants: []string{"adress"},
		},
		{
			name:  "a misspelt topology field is refused",
			file:  "endpoints:\n- {name: a, address: '10.0.0.1:80', model: m, topology: {host: n1}}\n",
			wants: []string{`unknown field "host"`},
		},
		{
			name:  "an overlong topology value is refused",
			file:  "endpoints:\n- {name: a, address: '10.0.0.1:80', model: m, topology: {rack: " + strings.Repeat("r", 254) + "}}\n",
			wants: []string{`endpoints[0] "a": topology.rack is 254 bytes, at most 253`},
		},
		{
			name:  "YAML that is not the file's shape is refused",
			file:  "endpoints: 7\n",
			wants: []string{"invalid static endpoints file"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			eps, err := Parse([]byte(tt.file))
			if err == nil {
				t.Fatalf("accepted: %v", eps)
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v does not wrap ErrStaticConfig", err)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func FuzzParseStaticEndpoints(f *testing.F) {
	f.Add([]byte(twoEndpoints))
	f.Add([]byte("endpoints: []\n"))
	f.Add([]byte("endpoints:\n- {name: a, address: '[::1]:1', model: m, labels: {a: b}}\n"))
	f.Add([]byte("endpoints:\n- {name: a, address: '10.0.0.1:80', model: m}\n- {name: a, address: '10.0.0.1:80'}\n"))
	f.Add([]byte("{\"endpoints\": [{\"name\": 1}]}"))
	f.Add([]byte("endpoints: &a [*a]\n"))
	f.Add([]byte("endpoints:\n- {name: a, address: '10.0.0.1:80', model: m, topology: {hostname: n1, rack: r1, zone: z1, region: g1}}\n"))
	f.Add([]byte("endpoints:\n- {name: a, address: '10.0.0.1:80', model: m, topology: {datacenter: d1}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		eps, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error %v does not wrap ErrStaticConfig", err)
			}
			return
		}
		// What is accepted is usable: named, modelled, unique, canonical.
		seen := map[string]bool{}
		for _, e := range eps {
			if e.Name == "" || e.Model == "" || seen[e.Name] || seen["@"+e.Address] {
				t.Fatalf("accepted bad or duplicate endpoint %+v", *e)
			}
			seen[e.Name], seen["@"+e.Address] = true, true
			for _, v := range []string{e.Topology.Host, e.Topology.Rack, e.Topology.Zone, e.Topology.Region} {
				if len(v) > maxTopologyValue {
					t.Fatalf("accepted a topology value of %d bytes", len(v))
				}
			}
			if again, err := parseEndpointAddress(e.Address); err != nil || again != e.Address {
				t.Fatalf("address %q is not canonical: %q, %v", e.Address, again, err)
			}
		}
	})
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	// Write then rename, as editors and ConfigMap updates do, so the watcher
	// never reads a half-written file.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestStaticFileFollowsItsFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "endpoints.yaml")
	writeFile(t, path, twoEndpoints)

	ds := datalayer.NewDatastore(nil)
	reg := prometheus.NewRegistry()
	// Something else (another discovery source) owns this endpoint; the
	// static file must never remove it.
	ds.Upsert(ep("k8s-pod", "10.9.9.9:8000"))
	logs := &testkit.LogBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	f, err := Load(path, ds, reg, logger)
	if err != nil {
		t.Fatal(err)
	}
	members := func(want ...string) func() bool {
		return func() bool { return slices.Equal(names(ds.List()), want) }
	}
	if !members("k8s-pod", "vllm-0", "vllm-1")() {
		t.Fatalf("after the first load: %v", names(ds.List()))
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.run(ctx, 10*time.Millisecond); close(done) }()

	writeFile(t, path, "endpoints:\n- {name: vllm-1, address: '10.0.0.8:8000', model: m}\n- {name: vllm-2, address: '10.0.0.9:8000', model: m}\n")
	testkit.WaitFor(t, "the reload", func() error {
		if !members("k8s-pod", "vllm-1", "vllm-2")() {
			return errors.New("members(\"k8s-pod\", \"vllm-1\", \"vllm-2\")() is false")
		}
		return nil
	})
	if e, _ := ds.Get("vllm-1"); e.Address != "10.0.0.8:8000" {
		t.Fatalf("vllm-1 address = %s after reload", e.Address)
	}

	writeFile(t, path, "endpoints:\n- {name: vllm-3, address: 'nope', model: m}\n")
	testkit.WaitFor(t, "the bad file to be logged", func() error {
		if !(strings.Contains(logs.String(), "rejected")) {
			return errors.New("strings.Contains(logs.String(), \"rejected\") is false")
		}
		return nil
	})
	if got := names(ds.List()); !slices.Equal(got, []string{"k8s-pod", "vllm-1", "vllm-2"}) {
		t.Fatalf("a bad file changed the endpoints: %v", got)
	}
	// The same bad content is reported once, not at every check.
	checked := f.w.checks.Load()
	testkit.WaitFor(t, "three more checks of the file", func() error {
		if seen := f.w.checks.Load(); seen < checked+3 {
			return fmt.Errorf("f.w.checks.Load() is %v, want >= %v", seen, checked+3)
		}
		return nil
	})
	if n := strings.Count(logs.String(), "rejected"); n != 1 {
		t.Fatalf("bad file logged %d times, want 1", n)
	}
	if got := testkit.Value(t, reg, "kvroute_static_discovery_reloads_total", "result", "error"); got != 1 {
		t.Fatalf("error reloads = %v, want 1", got)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the missing file to be logged", func() error {
		if seen := strings.Count(logs.String(), "rejected"); seen != 2 {
			return fmt.Errorf("strings.Count(logs.String(), \"rejected\") is %v, want %v", seen, 2)
		}
		return nil
	})
	writeFile(t, path, "endpoints: []\n")
	testkit.WaitFor(t, "recovery to an empty file", func() error {
		if !members("k8s-pod")() {
			return errors.New("members(\"k8s-pod\")() is false")
		}
		return nil
	})

	cancel()
	<-done
	if got := testkit.Value(t, reg, "kvroute_static_discovery_reloads_total", "result", "ok"); got != 3 {
		t.Fatalf("good reloads = %v, want 3", got)
	}
}

func TestLoadStaticFileRefusesABadFirstVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content *string
	}{
		{name: "a missing file stops start-up"},
		{name: "an invalid file stops start-up", content: new("endpoints:\n- {name: a}\n")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "endpoints.yaml")
			if tt.content != nil {
				writeFile(t, path, *tt.content)
			}
			ds := datalayer.NewDatastore(nil)
			_, err := Load(path, ds, nil, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), path) {
				t.Fatalf("err = %v, want an error naming %s", err, path)
			}
			if ds.Len() != 0 {
				t.Fatalf("a refused file added %d endpoints", ds.Len())
			}
		})
	}
}

func ep(name, addr string) *datalayer.Endpoint {
	return &datalayer.Endpoint{Name: name, Address: addr, Pod: name, Model: "m"}
}

func names(eps []*datalayer.Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}
