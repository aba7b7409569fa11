package deploy

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/testkit/apiserver"
	"github.com/kvroute/kvroute/pkg/transport/natscallout"
)

const chartDir = "charts/kvroute"

var apiServer apiserver.Server

// The pool's CRD as users install it, and the published CRDs of the other
// projects whose kinds the chart renders.
func TestMain(m *testing.M) { os.Exit(apiServer.Main(m, "crds", "testdata/crds")) }

// render renders the chart as `helm install` would, into namespace.
func render(t *testing.T, values map[string]any, namespace string) []*unstructured.Unstructured {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatalf("load chart: %v", err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.34.2", Major: "1", Minor: "34"}
	vals, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{
		Name: "kv", Namespace: namespace, Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		t.Fatalf("values: %v", err)
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []*unstructured.Unstructured
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue
		}
		manifests := releaseutil.SplitManifests(files[name])
		keys := make([]string, 0, len(manifests))
		for k := range manifests {
			keys = append(keys, k)
		}
		sort.Sort(releaseutil.BySplitManifestsOrder(keys))
		for _, k := range keys {
			doc := strings.TrimSpace(manifests[k])
			if doc == "" {
				continue
			}
			var obj map[string]any
			if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
				t.Fatalf("%s: not YAML: %v\n%s", name, err, doc)
			}
			if len(obj) == 0 {
				continue
			}
			out = append(out, &unstructured.Unstructured{Object: obj})
		}
	}
	return out
}

func readValues(t *testing.T, path string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}

type chartCase struct {
	name   string
	values map[string]any
	// prefix starts the name of every object the chart names after the
	// release.
	prefix string
	// kinds are the "Kind/name" of every object the case must render,
	// and only those.
	kinds []string
	// extraNamespaces must exist before the dry run.
	extraNamespaces []string
}

func chartCases(t *testing.T) []chartCase {
	return []chartCase{
		{
			name:   "defaults render the EPP, NATS, the example vLLM, the pool, its route and dashboards",
			values: nil,
			prefix: "kv-kvroute",
			kinds:  defaultKinds,
		},
		{
			name:   "every documented value set",
			values: readValues(t, "testdata/all-values.yaml"),
			prefix: "kvroute-full",
			kinds: []string{
				"ClusterRole/ns-kvroute-full-epp-nodes", "ClusterRoleBinding/ns-kvroute-full-epp-nodes",
				"ConfigMap/kvroute-full-dashboard-epp", "ConfigMap/kvroute-full-dashboard-index", "ConfigMap/kvroute-full-dashboard-nats",
				"ConfigMap/kvroute-full-epp", "ConfigMap/kvroute-full-nats",
				"Deployment/kvroute-full-epp", "Deployment/kvroute-full-vllm",
				"HTTPRoute/llama-pool", "InferencePool/llama-pool",
				"NetworkPolicy/kvroute-full-epp", "NetworkPolicy/kvroute-full-nats", "NetworkPolicy/kvroute-full-vllm",
				"PodDisruptionBudget/kvroute-full-epp", "PodDisruptionBudget/kvroute-full-nats",
				"PodMonitor/kvroute-full-epp", "PodMonitor/kvroute-full-nats", "PodMonitor/kvroute-full-vllm",
				"PrometheusRule/kvroute-full",
				"Role/kvroute-full-epp", "RoleBinding/kvroute-full-epp",
				"Service/kvroute-full-epp", "Service/kvroute-full-nats", "Service/kvroute-full-nats-cluster",
				"ServiceAccount/kvroute-epp-sa", "StatefulSet/kvroute-full-nats",
			},
			extraNamespaces: []string{"monitoring"},
		},
		{
			name: "standalone with an external NATS and nothing optional",
			values: map[string]any{
				"pool":           map[string]any{"standalone": true, "selector": map[string]any{"app": "vllm"}, "targetPorts": []any{8000, 8002}, "model": "m"},
				"nats":           map[string]any{"enabled": false, "url": "nats://nats.shared:4222"},
				"vllm":           map[string]any{"enabled": false},
				"httpRoute":      map[string]any{"enabled": false},
				"monitoring":     map[string]any{"dashboards": map[string]any{"enabled": false}},
				"serviceAccount": map[string]any{"create": false, "name": "existing"},
				"rbac":           map[string]any{"create": false},
				"networkPolicy":  map[string]any{"enabled": false},
			},
			prefix: "kv-kvroute",
			kinds:  []string{"ConfigMap/kv-kvroute-epp", "Deployment/kv-kvroute-epp", "PodDisruptionBudget/kv-kvroute-epp", "Service/kv-kvroute-epp"},
		},
		{
			name: "an existing NATS cluster of the official chart, with its members listed and credentials; no Node reads, so no ClusterRole",
			values: map[string]any{
				"epp": map[string]any{"topology": map[string]any{"nodes": false}},
				"nats": map[string]any{"enabled": false, "credentialsSecret": "kvroute-nats",
					"url": "nats://nats-0.nats-headless.nats.svc:4222,nats://nats-1.nats-headless.nats.svc:4222,nats://nats-2.nats-headless.nats.svc:4222"},
			},
			prefix: "kv-kvroute",
			kinds: []string{
				"ConfigMap/kv-kvroute-dashboard-epp", "ConfigMap/kv-kvroute-dashboard-index", "ConfigMap/kv-kvroute-dashboard-nats",
				"ConfigMap/kv-kvroute-epp", "Deployment/kv-kvroute-epp", "Deployment/kv-kvroute-vllm",
				"HTTPRoute/kv-kvroute", "InferencePool/kv-kvroute",
				"NetworkPolicy/kv-kvroute-epp", "NetworkPolicy/kv-kvroute-vllm", "PodDisruptionBudget/kv-kvroute-epp",
				"Role/kv-kvroute-epp", "RoleBinding/kv-kvroute-epp", "Service/kv-kvroute-epp",
				"ServiceAccount/kv-kvroute-epp", "ServiceAccount/kv-kvroute-relay",
			},
		},
		{
			name: "NATS as a 3-node cluster with JetStream replicated, behind the auth callout",
			values: map[string]any{
				"epp":  map[string]any{"jetstream": true},
				"nats": map[string]any{"cluster": map[string]any{"enabled": true}, "jetstream": map[string]any{"enabled": true}},
			},
			prefix: "kv-kvroute",
			kinds:  append(slices.Clone(defaultKinds), "PodDisruptionBudget/kv-kvroute-nats", "Service/kv-kvroute-nats-cluster"),
		},
		{
			name: "JetStream behind the auth callout, ext_proc with mutual TLS",
			values: map[string]any{
				"epp":  map[string]any{"jetstream": true, "clientCASecret": "gateway-ca"},
				"nats": map[string]any{"jetstream": map[string]any{"enabled": true}},
			},
			prefix: "kv-kvroute",
			kinds:  defaultKinds,
		},
	}
}

// defaultKinds are what the defaults render: the EPP, NATS with its auth
// callout, the example vLLM with its relays' ServiceAccount, the pool, its
// route, the NetworkPolicies and the dashboards.
var defaultKinds = []string{
	"ClusterRole/ns-kv-kvroute-epp-nodes", "ClusterRole/ns-kv-kvroute-nats-auth", "ClusterRoleBinding/ns-kv-kvroute-epp-nodes", "ClusterRoleBinding/ns-kv-kvroute-nats-auth", "ClusterRoleBinding/ns-kv-kvroute-nats-auth-issuer-discovery",
	"ConfigMap/kv-kvroute-dashboard-epp", "ConfigMap/kv-kvroute-dashboard-index", "ConfigMap/kv-kvroute-dashboard-nats",
	"ConfigMap/kv-kvroute-epp", "ConfigMap/kv-kvroute-nats",
	"Deployment/kv-kvroute-epp", "Deployment/kv-kvroute-vllm",
	"HTTPRoute/kv-kvroute", "InferencePool/kv-kvroute",
	"NetworkPolicy/kv-kvroute-epp", "NetworkPolicy/kv-kvroute-nats", "NetworkPolicy/kv-kvroute-vllm",
	"PodDisruptionBudget/kv-kvroute-epp",
	"Role/kv-kvroute-epp", "Role/kv-kvroute-nats-auth", "RoleBinding/kv-kvroute-epp", "RoleBinding/kv-kvroute-nats-auth",
	"Service/kv-kvroute-epp", "Service/kv-kvroute-nats",
	"ServiceAccount/kv-kvroute-epp", "ServiceAccount/kv-kvroute-nats-auth", "ServiceAccount/kv-kvroute-relay",
	"StatefulSet/kv-kvroute-nats",
}

func kindNames(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	sort.Strings(out)
	return out
}

func TestChartRendersTheExpectedObjects(t *testing.T) {
	t.Parallel()
	for _, tc := range chartCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := kindNames(render(t, tc.values, "ns"))
			want := slices.Clone(tc.kinds)
			sort.Strings(want)
			if !slices.Equal(got, want) {
				t.Errorf("rendered\n  %v\nwant\n  %v", got, want)
			}
		})
	}
}

// The API server, with the real CRDs installed, must accept every object
// the chart renders: server-side dry run runs defaulting, validation
// (OpenAPI schemas and CEL rules) and admission without persisting.
func TestChartIsAcceptedByTheAPIServer(t *testing.T) {
	apiServer.Require(t)
	c, err := client.New(apiServer.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i, tc := range chartCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			ns := fmt.Sprintf("chart-%d", i)
			for _, name := range append([]string{ns}, tc.extraNamespaces...) {
				err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})
				if err != nil && !apierrors.IsAlreadyExists(err) {
					t.Fatalf("namespace %s: %v", name, err)
				}
			}
			for _, obj := range render(t, tc.values, ns) {
				if err := c.Create(ctx, obj, client.DryRunAll); err != nil {
					t.Errorf("%s/%s rejected: %v", obj.GetKind(), obj.GetName(), err)
				}
			}
		})
	}
}

// The dry run must be able to fail: a pool the CRD's schema forbids is
// rejected.
func TestChartDryRunRejectsWhatTheSchemaForbids(t *testing.T) {
	apiServer.Require(t)
	c, err := client.New(apiServer.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "chart-bad"}}); err != nil {
		t.Fatal(err)
	}
	pool := find(t, render(t, map[string]any{"pool": map[string]any{"appProtocol": "grpc"}}, "chart-bad"), "InferencePool", "kv-kvroute")
	if err := c.Create(ctx, pool, client.DryRunAll); !apierrors.IsInvalid(err) {
		t.Errorf("an InferencePool with appProtocol grpc: %v, want it rejected as invalid", err)
	}
}

// TestEveryValueIsCovered keeps testdata/all-values.yaml setting every
// value values.yaml documents, so the "every value" case means it.
func TestEveryValueIsCovered(t *testing.T) {
	t.Parallel()
	defaults := readValues(t, filepath.Join(chartDir, "values.yaml"))
	all := readValues(t, "testdata/all-values.yaml")
	for _, path := range leaves("", defaults) {
		if _, ok := lookup(all, path); !ok {
			t.Errorf("testdata/all-values.yaml does not set %s", path)
		}
	}
	for _, path := range leaves("", all) {
		if _, ok := lookup(defaults, path); !ok && !underFreeForm(path) {
			t.Errorf("testdata/all-values.yaml sets %s, which values.yaml does not document", path)
		}
	}
}

// freeForm values are maps whose keys are the user's (labels, resources).
var freeForm = []string{"pool.selector", "epp.resources", "epp.nodeSelector", "epp.affinity", "epp.podAnnotations",
	"serviceAccount.annotations", "nats.resources", "nats.auth.resources", "vllm.resources", "vllm.nodeSelector", "vllm.relay.resources",
	"networkPolicy.gatewayFrom", "networkPolicy.metricsFrom", "networkPolicy.natsClientsFrom",
	"monitoring.podMonitor.labels", "monitoring.prometheusRule.labels", "monitoring.dashboards.labels"}

func underFreeForm(path string) bool {
	for _, f := range freeForm {
		if path == f || strings.HasPrefix(path, f+".") {
			return true
		}
	}
	return false
}

func leaves(prefix string, v map[string]any) []string {
	var out []string
	for k, x := range v {
		path := k
		if prefix != "" {
			path = prefix + "." + k
		}
		if m, ok := x.(map[string]any); ok && len(m) > 0 && !underFreeForm(path) {
			out = append(out, leaves(path, m)...)
			continue
		}
		out = append(out, path)
	}
	sort.Strings(out)
	return out
}

func lookup(v map[string]any, path string) (any, bool) {
	var cur any = v
	for part := range strings.SplitSeq(path, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// The EPP must accept the scheduler configuration the chart mounts.
func TestChartEPPConfigLoadsInTheEPP(t *testing.T) {
	t.Parallel()
	for _, tc := range chartCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cm := find(t, render(t, tc.values, "ns"), "ConfigMap", tc.prefix+"-epp")
			text, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
			if !strings.Contains(text, "EndpointPickerConfig") {
				t.Fatalf("the EPP's ConfigMap holds no EndpointPickerConfig:\n%s", text)
			}
			e, err := epp.New(epp.Options{
				Pool: "p", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigText: text,
			})
			if err != nil {
				t.Fatalf("the EPP rejects the chart's config: %v\n%s", err, text)
			}
			e.Close()
		})
	}
}

// The chart's default scheduling is the EPP's own default, the best
// policy measured, word for word: one source, not two that drift.
func TestTheChartsDefaultConfigIsTheEPPsDefault(t *testing.T) {
	t.Parallel()
	cm := find(t, render(t, nil, "ns"), "ConfigMap", "kv-kvroute-epp")
	text, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	if strings.TrimSpace(text) != strings.TrimSpace(config.DefaultConfigText) {
		t.Errorf("the chart's default config is\n%s\nthe EPP's default is\n%s", text, config.DefaultConfigText)
	}
}

// NATS must accept the configuration file the chart gives it.
func TestChartNATSConfigLoadsInNATS(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name               string
		values             map[string]any
		configMap          string
		jetStream, callout bool
	}{
		{"defaults", nil, "kv-kvroute-nats", false, true},
		{"every documented value set", readValues(t, "testdata/all-values.yaml"), "kvroute-full-nats", true, false},
		{"JetStream behind the auth callout", map[string]any{"nats": map[string]any{"jetstream": map[string]any{"enabled": true}}}, "kv-kvroute-nats", true, true},
		{"a 3-node cluster with JetStream behind the auth callout", map[string]any{"nats": map[string]any{
			"cluster": map[string]any{"enabled": true}, "jetstream": map[string]any{"enabled": true}}}, "kv-kvroute-nats", true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts, _ := chartNATSOptions(t, render(t, tc.values, "ns"), tc.configMap)
			if opts.JetStream != tc.jetStream {
				t.Errorf("JetStream = %t, want %t", opts.JetStream, tc.jetStream)
			}
			if tc.jetStream && tc.values != nil && !tc.callout && (opts.JetStreamMaxMemory != 512<<20 || opts.JetStreamMaxStore != 8<<30) {
				t.Errorf("JetStream limits = %d memory, %d file; want 512Mi and 8Gi", opts.JetStreamMaxMemory, opts.JetStreamMaxStore)
			}
			if got := opts.AuthCallout != nil; got != tc.callout {
				t.Fatalf("auth callout configured: %t, want %t", got, tc.callout)
			}
			if tc.callout && (opts.AuthCallout.Account != "AUTH" || len(opts.AuthCallout.AuthUsers) != 1) {
				t.Errorf("auth callout %+v", opts.AuthCallout)
			}
			cluster, _, _ := unstructured.NestedBool(map[string]any{"v": tc.values}, "v", "nats", "cluster", "enabled")
			if members := natsMembers(tc.values); cluster || members > 1 {
				if opts.Cluster.Port == 0 || opts.Cluster.Name == "" || len(opts.Routes) != members || opts.ServerName != tc.configMap+"-0" {
					t.Errorf("cluster %q on port %d, %d routes (want %d), server name %q", opts.Cluster.Name, opts.Cluster.Port, len(opts.Routes), members, opts.ServerName)
				}
				for i, r := range opts.Routes {
					if want := fmt.Sprintf("%s-%d.%s-cluster.ns.svc", tc.configMap, i, tc.configMap); r.Hostname() != want || r.Port() != fmt.Sprint(opts.Cluster.Port) {
						t.Errorf("route %d is %s, want %s:%d", i, r, want, opts.Cluster.Port)
					}
				}
			} else if opts.Cluster.Port != 0 || len(opts.Routes) != 0 {
				t.Errorf("one server configured with a cluster: %+v, routes %v", opts.Cluster, opts.Routes)
			}
		})
	}
}

// chartNATSOptions lays the rendered nats.conf out as the NATS pod does
// (the ConfigMap in conf/, the keys kv-nats-auth init writes in auth/)
// and has nats-server read it; dir is the pod's /etc/nats.
func chartNATSOptions(t *testing.T, objs []*unstructured.Unstructured, configMap string) (opts *natsserver.Options, dir string) {
	t.Helper()
	cm := find(t, objs, "ConfigMap", configMap)
	text, _, _ := unstructured.NestedString(cm.Object, "data", "nats.conf")
	dir = t.TempDir()
	for _, sub := range []string{"conf", "auth"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if strings.Contains(text, natscallout.ConfFile) {
		if err := natscallout.GenerateKeys(filepath.Join(dir, "auth")); err != nil {
			t.Fatal(err)
		}
	}
	// The downward API gives the server its pod's name (member 0).
	text = strings.ReplaceAll(text, "$POD_NAME", configMap+"-0")
	path := filepath.Join(dir, "conf", "nats.conf")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := natsserver.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server rejects the chart's config: %v\n%s", err, text)
	}
	return opts, dir
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s named %s rendered", kind, name)
	return nil
}

// The dashboards may only query metrics that something really exports:
// kvroute's own (found as metric names in its Go source) or NATS's
// exporter's.
func TestDashboardsQueryExportedMetrics(t *testing.T) {
	t.Parallel()
	unknown := unexportedMetrics(t)
	files, err := filepath.Glob(filepath.Join(chartDir, "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards: %v", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Panels []struct {
				Title   string `json:"title"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if len(d.Panels) == 0 {
			t.Errorf("%s: no panels", f)
		}
		for _, p := range d.Panels {
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", f, p.Title)
			}
			for _, tg := range p.Targets {
				for _, name := range unknown(tg.Expr) {
					t.Errorf("%s: panel %q queries %s, which no code exports", filepath.Base(f), p.Title, name)
				}
			}
		}
	}
}

// unexportedMetrics returns a function listing the metrics a query names
// that nothing exports: not kvroute's own (found as metric names in its Go
// source) nor NATS's exporter's.
func unexportedMetrics(t *testing.T) func(expr string) []string {
	known := goStringLiterals(t, "../pkg", "../cmd")
	// Metrics built from a namespace and subsystem: the relay's and the
	// scheduler's.
	prefixes := []string{"", "kvroute_relay_", "inference_extension_"}
	metric := regexp.MustCompile(`\b(kvroute_[a-z0-9_]+|inference_[a-z0-9_]+|gnatsd_[a-z0-9_]+|jetstream_[a-z0-9_]+)\b`)
	return func(expr string) []string {
		var out []string
		for _, name := range metric.FindAllString(expr, -1) {
			if strings.HasPrefix(name, "gnatsd_") || strings.HasPrefix(name, "jetstream_") {
				continue // prometheus-nats-exporter's
			}
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")
			found := false
			for _, p := range prefixes {
				if rest, ok := strings.CutPrefix(base, p); ok && known[rest] {
					found = true
				}
			}
			if !found {
				out = append(out, name)
			}
		}
		return out
	}
}

// The alerts may only query metrics that something really exports, and
// each says what it means.
func TestAlertsQueryExportedMetrics(t *testing.T) {
	t.Parallel()
	unknown := unexportedMetrics(t)
	rule := find(t, render(t, readValues(t, "testdata/all-values.yaml"), "ns"), "PrometheusRule", "kvroute-full")
	groups, _, _ := unstructured.NestedSlice(rule.Object, "spec", "groups")
	alerts := 0
	for _, g := range groups {
		rules, _, _ := unstructured.NestedSlice(g.(map[string]any), "rules")
		for _, r := range rules {
			r := r.(map[string]any)
			name, _, _ := unstructured.NestedString(r, "alert")
			expr, _, _ := unstructured.NestedString(r, "expr")
			desc, _, _ := unstructured.NestedString(r, "annotations", "description")
			alerts++
			if expr == "" || desc == "" {
				t.Errorf("alert %s has no expression or no description", name)
			}
			for _, m := range unknown(expr) {
				t.Errorf("alert %s queries %s, which no code exports", name, m)
			}
		}
	}
	if alerts < 5 {
		t.Fatalf("%d alerts rendered", alerts)
	}
}

func goStringLiterals(t *testing.T, dirs ...string) map[string]bool {
	t.Helper()
	lit := regexp.MustCompile(`"([a-z][a-z0-9_]*)"`)
	out := map[string]bool{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range lit.FindAllSubmatch(data, -1) {
				out[string(m[1])] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// natsMembers is the NATS members values ask for (1 without a cluster).
func natsMembers(values map[string]any) int {
	v, _ := lookup(values, "nats.cluster.enabled")
	if on, _ := v.(bool); !on {
		return 1
	}
	if n, ok := lookup(values, "nats.cluster.replicas"); ok {
		switch n := n.(type) {
		case float64:
			return int(n)
		case int:
			return n
		}
	}
	return 3
}

// Flow control is on by default for a pool with objectives; "on" and
// "off" say so plainly, and anything else is refused at render.
func TestChartFlowControlFollowsItsValue(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"", []string{"--flow-control-when-objectives"}},
		{"on", []string{"--flow-control"}},
		{"off", nil},
	} {
		var values map[string]any
		if tc.value != "" {
			values = map[string]any{"epp": map[string]any{"flowControl": tc.value}}
		}
		dep := find(t, render(t, values, "ns"), "Deployment", "kv-kvroute-epp")
		containers, _, _ := unstructured.NestedSlice(dep.Object, "spec", "template", "spec", "containers")
		var got []string
		for _, c := range containers {
			args, _, _ := unstructured.NestedStringSlice(c.(map[string]any), "args")
			for _, a := range args {
				if strings.HasPrefix(a, "--flow-control") {
					got = append(got, a)
				}
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("epp.flowControl %q: args %q, want %q", tc.value, got, tc.want)
		}
	}
}
