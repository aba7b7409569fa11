package epp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// The Gateway API Inference Extension's hermetic ext_proc tests
// (test/integration/epp/hermetic_test.go at v1.5.0, which llm-d-router
// keeps) state the contract a gateway relies on. Each case below carries
// the name of the upstream case it ports and runs it through kvroute's
// assembled EPP: its ext_proc server on loopback, its scheduler configured
// as upstream's test configures its own (queue, KV-cache, prefix and LoRA
// scorers, max-score picker), pods that are HTTP servers publishing vLLM's
// metrics, and the EPP's own metrics endpoint. Where kvroute deliberately
// answers otherwise, the case says so (docs/architecture.md, "The ext_proc
// contract", says why).

// The models and objectives of upstream's cases.
const (
	modelMyModel         = "my-model"
	modelMyModelTarget   = "my-model-12345"
	modelSQLLora         = "sql-lora"
	modelSQLLoraTarget   = "sql-lora-1fdg2"
	modelSheddable       = "sql-lora-sheddable"
	modelSheddableTarget = "sql-lora-1fdg3"
	modelDirect          = "direct-model"
	// baseModel is what every pod serves; the targets above are adapters
	// (or, for my-model-12345, the pods' base model).
	baseModel = modelMyModelTarget
	requestID = "test-request-id"
)

// upstreamConfig is the configuration upstream's hermetic tests run with.
const upstreamConfig = `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
- type: lora-affinity-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
  - pluginRef: kv-cache-utilization-scorer
  - pluginRef: prefix-cache-scorer
  - pluginRef: lora-affinity-scorer
  - pluginRef: max-score-picker
`

// pod is upstream's podState: a queue, a KV-cache usage and the LoRA
// adapters running.
type pod struct {
	queue  int
	kv     float64
	active []string
}

// P is upstream's pod constructor.
func P(queue int, kv float64, active ...string) pod { return pod{queue, kv, active} }

// hermetic is one EPP with its pods, shared by the cases run in turn.
type hermetic struct {
	e      *epp.EPP
	client *envoy.Client
	// pods are the current case's pod servers, by index.
	pods []*podServer
	gen  int
}

// podServer is a model server as the EPP sees it: vLLM's /metrics.
type podServer struct {
	name, addr string
	state      atomic.Pointer[pod]
}

func (p *podServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	s := p.state.Load()
	fmt.Fprintf(w, "vllm:num_requests_waiting{model_name=%q} %d\n", baseModel, s.queue)
	fmt.Fprintf(w, "vllm:num_requests_running{model_name=%q} 0\n", baseModel)
	fmt.Fprintf(w, "vllm:kv_cache_usage_perc{model_name=%q} %g\n", baseModel, s.kv)
	// max_lora 0, as upstream's harness leaves MaxActiveModels: no pod
	// has room for an adapter it is not running.
	fmt.Fprintf(w, "vllm:lora_requests_info{max_lora=\"0\",running_lora_adapters=%q,waiting_lora_adapters=\"\"} 1.7e+09\n", strings.Join(s.active, ","))
}

func startHermetic(t *testing.T, passUnknown bool) *hermetic {
	t.Helper()
	return startHermeticWith(t, upstreamConfig, passUnknown)
}

func startHermeticWith(t *testing.T, configText string, passUnknown bool) *hermetic {
	t.Helper()
	e, err := epp.New(epp.Options{
		Pool: "vllm-llama3-8b-instruct-pool", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ConfigText: configText, Scrape: true,
		RequestPath: epp.RequestPathOptions{ExtProcAddr: "127.0.0.1:0", Plaintext: true, PassUnknownModels: passUnknown,
			ExtProc: extproc.Options{EmitEndpointScores: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "the EPP", e.Run)
	for _, o := range []datalayer.Objective{
		{Name: modelMyModel, Priority: 2}, {Name: modelSQLLora, Priority: 2}, {Name: modelSheddable, Priority: 0}, {Name: modelDirect, Priority: 2},
	} {
		e.Objectives().Set(o)
	}
	c, err := envoy.Dial(e.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &hermetic{e: e, client: c}
}

// withPods replaces the pool's pods with servers in the states given and
// waits until the EPP has scraped every one.
func (h *hermetic) withPods(t *testing.T, states ...pod) {
	t.Helper()
	for _, p := range h.pods {
		h.e.Datastore().Remove(p.name)
	}
	h.pods = nil
	h.gen++
	for i, s := range states {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := &podServer{name: fmt.Sprintf("pod-%d-%d", h.gen, i), addr: ln.Addr().String()}
		p.state.Store(&s)
		srv := &http.Server{Handler: p}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		h.pods = append(h.pods, p)
		h.e.Datastore().Upsert(&datalayer.Endpoint{Name: p.name, Address: p.addr, Pod: p.name, Namespace: "default", Model: baseModel})
	}
	testkit.WaitFor(t, "every pod's metrics scraped", func() error {
		for i, p := range h.pods {
			m, ok := h.e.Datastore().Metrics(p.name)
			if !ok || m.UpdateTime.IsZero() || m.WaitingQueueSize != states[i].queue || !slices.Equal(m.ActiveLoRAs, states[i].active) {
				return fmt.Errorf("pod %d: metrics %+v (scraped %t), want queue %d and adapters %v", i, m, ok, states[i].queue, states[i].active)
			}
		}
		return nil
	})
}

// addr is pod i's address, upstream's 192.168.1.(i+1):8000.
func (h *hermetic) addr(i int) string { return h.pods[i].addr }

// metrics reads the EPP's metrics endpoint, as Prometheus would.
func (h *hermetic) metrics() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		resp, err := http.Get("http://" + h.e.HTTPAddr() + "/metrics")
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		if err != nil {
			return nil, err
		}
		out := make([]*dto.MetricFamily, 0, len(fams))
		for _, f := range fams {
			out = append(out, f)
		}
		return out, nil
	})
}

// llm is upstream's ReqLLM: a completion of prompt naming model, with the
// objective and model-rewrite headers upstream's Envoy sets, and its
// request id.
func llm(prompt, objective, target string, subset ...string) envoy.Request {
	body, _ := json.Marshal(map[string]any{"max_tokens": 100, "model": objective, "prompt": prompt, "temperature": 0})
	hs := map[string]string{"hi": "mom", "x-gateway-inference-objective": objective}
	if target != "" {
		hs["x-gateway-model-name-rewrite"] = target
	}
	return envoy.Request{Path: "/v1/completions", Body: body, RequestID: requestID, Headers: hs, Subset: subset}
}

// wantBody is the body upstream expects the model server to get: the
// request's, naming the target model. kvroute rewrites the model's value
// in place and leaves every other byte as the client sent it, where
// upstream re-serialises the whole body (its keys then sorted): the same
// JSON to the engine.
func wantBody(prompt, target string) string {
	b, _ := json.Marshal(map[string]any{"max_tokens": 100, "model": target, "prompt": prompt, "temperature": 0})
	return string(b)
}

// routedTo checks upstream's ExpectRouteTo: the destination in the header
// and in the envoy.lb metadata, the route cache cleared, the body with the
// target model and its content-length, and the request id set.
func routedTo(t *testing.T, res *envoy.Result, addr, body string) {
	t.Helper()
	if res.Immediate != nil {
		t.Fatalf("refused with %d: %s", res.Immediate.GetStatus().GetCode(), res.Immediate.GetBody())
	}
	if res.Destination != addr || res.MetadataDestination != addr {
		t.Errorf("destination header %q, envoy.lb metadata %q; want %s in both", res.Destination, res.MetadataDestination, addr)
	}
	if !res.ClearRouteCache {
		t.Error("the route cache is not cleared")
	}
	if string(res.Body) != body {
		t.Errorf("body passed on %s\nwant           %s", res.Body, body)
	}
	if got := res.SetHeaders["content-length"]; got != strconv.Itoa(len(body)) {
		t.Errorf("content-length %q, want %d", got, len(body))
	}
	if got := res.SetHeaders["x-request-id"]; got != requestID {
		t.Errorf("x-request-id %q, want the request's %q", got, requestID)
	}
}

// refused checks upstream's ExpectReject: an immediate response with code
// whose body mentions reason. kvroute's body is OpenAI's error object
// ({"error":{"message","type","code"}}), which clients of the API parse,
// where upstream's is a line of text.
func refused(t *testing.T, res *envoy.Result, code int, reason string) {
	t.Helper()
	if res.Immediate == nil {
		t.Fatalf("routed to %q; want refused with %d", res.Destination, code)
	}
	if got := int(res.Immediate.GetStatus().GetCode()); got != code {
		t.Fatalf("status %d, want %d (body %s)", got, code, res.Immediate.GetBody())
	}
	var e struct {
		Error struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(res.Immediate.GetBody(), &e); err != nil || e.Error.Code != code || !strings.Contains(e.Error.Message, reason) {
		t.Errorf("error body %s: want code %d and a message mentioning %q", res.Immediate.GetBody(), code, reason)
	}
}

// requestTotal reads inference_objective_request_total's series.
func requestTotal(t *testing.T, h *hermetic, model, target string, priority int) float64 {
	t.Helper()
	return testkit.Value(t, h.metrics(), "inference_objective_request_total",
		"model_name", model, "target_model_name", target, "priority", strconv.Itoa(priority))
}

func TestHermeticFullDuplexStreamedRequests(t *testing.T) {
	h := startHermetic(t, false)
	ctx := context.Background()
	do := func(t *testing.T, req envoy.Request, up envoy.Upstream) *envoy.Result {
		t.Helper()
		res, err := h.client.Do(ctx, req, up)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// routeCase is upstream's shape of a routing case: pods, a request,
	// the pod it must go to, and the request counter it must add one to.
	routeCase := func(t *testing.T, pods []pod, req envoy.Request, want int, model, target, prompt string, priority int) {
		h.withPods(t, pods...)
		before := requestTotal(t, h, model, target, priority)
		routedTo(t, do(t, req, nil), h.addr(want), wantBody(prompt, target))
		if got := requestTotal(t, h, model, target, priority) - before; got != 1 {
			t.Errorf("inference_objective_request_total{model_name=%q,target_model_name=%q,priority=\"%d\"} rose by %v, want 1", model, target, priority, got)
		}
	}

	t.Run("select lower queue and kv cache", func(t *testing.T) {
		routeCase(t, []pod{P(3, 0.2), P(0, 0.1), P(10, 0.2)}, llm("test1", modelMyModel, modelMyModelTarget), 1, modelMyModel, modelMyModelTarget, "test1", 2)
		// Upstream reads the pool's ready pods from the same endpoint.
		if got := testkit.Value(t, h.metrics(), "inference_pool_ready_pods", "name", "vllm-llama3-8b-instruct-pool"); got != 3 {
			t.Errorf("inference_pool_ready_pods{name=\"vllm-llama3-8b-instruct-pool\"} = %v, want 3", got)
		}
	})
	t.Run("select active lora, low queue", func(t *testing.T) {
		routeCase(t, []pod{P(0, 0.2, "foo", "bar"), P(0, 0.1, "foo", modelSQLLoraTarget), P(10, 0.2, "foo", "bar")},
			llm("test2", modelSQLLora, modelSQLLoraTarget), 1, modelSQLLora, modelSQLLoraTarget, "test2", 2)
	})
	t.Run("select lora despite higher kv cache (affinity)", func(t *testing.T) {
		routeCase(t, []pod{P(10, 0.2, "foo", "bar"), P(10, 0.4, "foo", modelSQLLoraTarget), P(10, 0.3, "foo")},
			llm("test3", modelSQLLora, modelSQLLoraTarget), 1, modelSQLLora, modelSQLLoraTarget, "test3", 2)
	})
	t.Run("do not shed requests by default", func(t *testing.T) {
		// Every pod is saturated (queue ≥ 5 or KV ≥ 0.8); a request of
		// priority 2 is served all the same.
		routeCase(t, []pod{P(6, 0.2, "foo", "bar", modelSQLLoraTarget), P(0, 0.85, "foo"), P(10, 0.9, "foo")},
			llm("test4", modelSQLLora, modelSQLLoraTarget), 0, modelSQLLora, modelSQLLoraTarget, "test4", 2)
	})
	t.Run("split body across chunks", func(t *testing.T) {
		req := llm("test6", modelSheddable, modelSheddableTarget)
		req.Body = []byte(`{"max_tokens":100,"model":"sql-lora-sheddable","prompt":"test6","temperature":0}`)
		req.Splits = []int{len(`{"max_tokens":100,"model":"sql-lo`)}
		routeCase(t, []pod{P(4, 0.2, "foo", "bar", modelSheddableTarget), P(4, 0.85, "foo", modelSheddableTarget)},
			req, 0, modelSheddable, modelSheddableTarget, "test6", 0)
	})
	t.Run("invalid json body", func(t *testing.T) {
		h.withPods(t, P(0, 0.2, "foo", "bar"))
		refused(t, do(t, envoy.Request{Path: "/v1/completions", Headers: map[string]string{"hi": "mom"}, Body: []byte("no healthy upstream")}, nil),
			400, "the body is not valid JSON")
	})
	t.Run("request missing model field", func(t *testing.T) {
		h.withPods(t, P(0, 0.2))
		refused(t, do(t, envoy.Request{Path: "/v1/completions", Body: []byte(`{"prompt":"hello world"}`)}, nil), 400, "model")
	})
	t.Run("subsetting: select best from subset", func(t *testing.T) {
		h.withPods(t, P(0, 0.2, "foo"), P(0, 0.1, "foo", modelSQLLoraTarget), P(10, 0.2, "foo"))
		res := do(t, llm("test2", modelSQLLora, modelSQLLoraTarget, h.addr(0), h.addr(1), h.addr(2)), nil)
		routedTo(t, res, h.addr(1), wantBody("test2", modelSQLLoraTarget))
	})
	t.Run("subsetting: partial match", func(t *testing.T) {
		h.withPods(t, P(0, 0.2, "foo"), P(0, 0.1, "foo", modelSQLLoraTarget), P(10, 0.2, "foo"))
		res := do(t, llm("test2", modelSQLLora, modelSQLLoraTarget, h.addr(2)), nil)
		routedTo(t, res, h.addr(2), wantBody("test2", modelSQLLoraTarget))
	})
	t.Run("subsetting: no pods match", func(t *testing.T) {
		h.withPods(t, P(0, 0.2, "foo"), P(0, 0.1, "foo", modelSQLLoraTarget))
		refused(t, do(t, llm("test2", modelSQLLora, modelSQLLoraTarget, "192.168.1.99:8000"), nil), 503, "subset")
	})
	t.Run("passthrough: model not in objectives", func(t *testing.T) {
		// kvroute differs: a model that no pod serves or has loaded is
		// refused with OpenAI's 404 rather than sent where it cannot be
		// served, unless the EPP runs with --pass-unknown-models
		// (TestHermeticUnknownModelsPassWhenAsked).
		h.withPods(t, P(4, 0.2, "foo", "bar", modelSheddableTarget))
		refused(t, do(t, llm("test6", modelDirect, modelDirect), nil), 404, modelDirect)
	})
	t.Run("rewrite request model", func(t *testing.T) {
		// kvroute takes the rewrite from the gateway's
		// x-gateway-model-name-rewrite header; it reads no
		// InferenceModelRewrite objects.
		routeCase(t, []pod{P(0, 0.1, "foo", modelSQLLoraTarget)}, llm("test-rewrite", modelSQLLora, modelSQLLoraTarget), 0,
			modelSQLLora, modelSQLLoraTarget, "test-rewrite", 2)
	})
	t.Run("protocol: simple GET (header only)", func(t *testing.T) {
		// kvroute answers a request without a body with a destination
		// (any ready pod) and no content-length, so that Envoy routes it.
		h.withPods(t, P(0, 0))
		res := do(t, envoy.Request{Method: "GET", Path: "/v1/models", Headers: map[string]string{"content-type": "text/event-stream"}}, nil)
		if res.Immediate != nil || res.Destination != h.addr(0) || res.MetadataDestination != h.addr(0) {
			t.Fatalf("answered %+v, want a route to %s", res, h.addr(0))
		}
		if _, ok := res.SetHeaders["content-length"]; ok {
			t.Error("a request without a body got a content-length")
		}
	})
	t.Run("no backend pods available", func(t *testing.T) {
		// kvroute differs: 503 (the pool has no ready pod, which retrying
		// may mend), where upstream answers 500.
		h.withPods(t)
		refused(t, do(t, envoy.Request{Method: "GET", Path: "/v1/models"}, nil), 503, "no ready endpoint")
		refused(t, do(t, llm("test1", modelMyModel, ""), nil), 503, "")
	})

	// The response phase. Upstream's server buffers a JSON response and
	// answers once at its end; kvroute passes every chunk on as it comes
	// (the client sees the first bytes sooner) and reads the usage from a
	// copy it keeps. Either way the client gets the model server's bytes.
	respond := func(ct string, parts ...string) envoy.Upstream {
		return func(ctx context.Context, target, path string, headers map[string]string, body []byte) (*envoy.Response, error) {
			r := &envoy.Response{Status: 200, ContentType: ct, Served: target}
			for _, p := range parts {
				r.Parts = append(r.Parts, []byte(p))
			}
			return r, nil
		}
	}
	inputTokens := func(t *testing.T) (float64, int) {
		g := h.metrics()
		return testkit.HistSum(t, g, "inference_objective_input_tokens", "model_name", modelSheddable),
			testkit.HistCount(t, g, "inference_objective_input_tokens", "model_name", modelSheddable)
	}
	responseCase := func(t *testing.T, ct string, wantTokens float64, parts ...string) {
		h.withPods(t, P(4, 0.2, modelSheddableTarget))
		sum0, n0 := inputTokens(t)
		res := do(t, llm("test6", modelSheddable, modelSheddableTarget), respond(ct, parts...))
		routedTo(t, res, h.addr(0), wantBody("test6", modelSheddableTarget))
		if want := strings.Join(parts, ""); string(res.ResponseBody) != want {
			t.Errorf("response passed back %q, want %q", res.ResponseBody, want)
		}
		wantN := 0
		if wantTokens > 0 {
			wantN = 1
		}
		testkit.WaitFor(t, "the response's usage counted", func() error {
			sum, n := inputTokens(t)
			if sum-sum0 != wantTokens || n-n0 != wantN {
				return fmt.Errorf("inference_objective_input_tokens rose by %v in %d samples, want %v in %d", sum-sum0, n-n0, wantTokens, wantN)
			}
			return nil
		})
	}
	t.Run("response buffering: multi-chunk JSON", func(t *testing.T) {
		responseCase(t, "application/json", 7, `{"id":"x","usage":{"prompt_tokens":7,`, `"completion_tokens":10,"total_tokens":17}}`)
	})
	t.Run("response buffering: invalid JSON", func(t *testing.T) {
		responseCase(t, "application/json", 0, "no healthy upstream")
	})
	t.Run("response buffering: empty EOS chunk (JSON)", func(t *testing.T) {
		responseCase(t, "application/json", 7, `{"id":"x","usage":{"prompt_tokens":7,"completion_tokens":10,"total_tokens":17}}`, "")
	})
	t.Run("response streaming: SSE token counting", func(t *testing.T) {
		responseCase(t, "text/event-stream", 7, "data: {}\n\n",
			"data: {\"usage\":{\"prompt_tokens\":7,\"total_tokens\":17,\"completion_tokens\":10}}\n\ndata: [DONE]\n\n", "")
		// Upstream's test reads the histogram bucket by bucket: its
		// bounds are upstream's.
		fam := testkit.Family(t, h.metrics(), "inference_objective_input_tokens")
		if fam == nil || len(fam.GetMetric()) == 0 {
			t.Fatal("no inference_objective_input_tokens on the metrics endpoint")
		}
		var bounds []float64
		for _, b := range fam.GetMetric()[0].GetHistogram().GetBucket() {
			bounds = append(bounds, b.GetUpperBound())
		}
		// The text format lists +Inf as a bucket of its own.
		want := []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576, math.Inf(1)}
		if !slices.Equal(bounds, want) {
			t.Errorf("inference_objective_input_tokens buckets %v, want upstream's %v", bounds, want)
		}
	})
}

// TestHermeticUnknownModelsPassWhenAsked is upstream's "passthrough: model
// not in objectives" with --pass-unknown-models: the request goes to the
// pool with its body as sent.
func TestHermeticUnknownModelsPassWhenAsked(t *testing.T) {
	h := startHermetic(t, true)
	h.withPods(t, P(4, 0.2, "foo", "bar", modelSheddableTarget))
	req := llm("test6", modelDirect, modelDirect)
	req.Body = []byte(`{"max_tokens":100,"model":"direct-model","prompt":"test6","temperature":0}`)
	req.Splits = []int{len(`{"max_tokens":100,"model":"direct-`)}
	res, err := h.client.Do(context.Background(), req, nil)
	if err != nil {
		t.Fatal(err)
	}
	routedTo(t, res, h.addr(0), string(req.Body))
	if got := requestTotal(t, h, modelDirect, modelDirect, 2); got != 1 {
		t.Errorf("inference_objective_request_total for the direct model = %v, want 1", got)
	}
}

// TestHermeticPassthroughParserSuccess is upstream's "passthrough parser
// success", with upstream's configuration: a body that is not JSON, on a
// path kvroute does not parse, goes to the least loaded pod unchanged,
// and is counted with empty model labels.
func TestHermeticPassthroughParserSuccess(t *testing.T) {
	h := startHermeticWith(t, `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
  - type: queue-scorer
  - type: kv-cache-utilization-scorer
  - type: passthrough-parser
schedulingProfiles:
  - name: default
    plugins:
      - pluginRef: queue-scorer
      - pluginRef: kv-cache-utilization-scorer
parser:
  pluginRef: passthrough-parser
featureGates:
  - enableLegacyMetrics
`, false)
	h.withPods(t, P(3, 0.2), P(0, 0.1), P(10, 0.2))
	body := "passthrough-parser"
	res, err := h.client.Do(context.Background(), envoy.Request{Path: "/custom/api", Body: []byte(body), RequestID: requestID,
		ContentType: "text/plain", Headers: map[string]string{"hi": "mom", "x-gateway-inference-objective": modelMyModel}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	routedTo(t, res, h.addr(1), body)
	g := h.metrics()
	if got := testkit.Value(t, g, "inference_objective_request_total", "model_name", "", "target_model_name", "", "priority", "2"); got != 1 {
		t.Errorf("inference_objective_request_total{model_name=\"\",target_model_name=\"\",priority=\"2\"} = %v, want 1", got)
	}
	if got := testkit.Value(t, g, "inference_pool_ready_pods", "name", "vllm-llama3-8b-instruct-pool"); got != 3 {
		t.Errorf("inference_pool_ready_pods = %v, want 3", got)
	}
}

// TestEndpointScoresMetadata is llm-d-router's case of that name: with
// --emit-endpoint-scores the envoy.lb metadata carries
// x-gateway-destination-endpoint-scores, every scored pod's address and
// weighted score, the picked one's highest and the runner-up's present too.
func TestEndpointScoresMetadata(t *testing.T) {
	h := startHermetic(t, false)
	h.withPods(t, P(0, 0.1), P(5, 0.5))
	lb := routeRaw(t, h.client, llm("hello", modelMyModel, modelMyModelTarget))
	dest := lb.GetFields()["x-gateway-destination-endpoint"].GetStringValue()
	if dest != h.addr(0) {
		t.Fatalf("destination %q, want %s", dest, h.addr(0))
	}
	scores := lb.GetFields()["x-gateway-destination-endpoint-scores"].GetStructValue().GetFields()
	if len(scores) != 2 {
		t.Fatalf("scores %v, want one for each of the 2 pods", scores)
	}
	// Queue 1 + KV 0.9 + prefix 0 + LoRA 0, against 0 + 0.5 + 0 + 0.
	for addr, want := range map[string]float64{h.addr(0): 1.9, h.addr(1): 0.5} {
		v, ok := scores[addr]
		if !ok || v.GetNumberValue() < want-1e-9 || v.GetNumberValue() > want+1e-9 {
			t.Errorf("score of %s = %v, want %v", addr, v, want)
		}
	}
}

// TestEndpointScoresMetadataOffByDefault: without the flag the envoy.lb
// metadata names the destination alone.
func TestEndpointScoresMetadataOffByDefault(t *testing.T) {
	e, err := epp.New(epp.Options{Pool: "p", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", ConfigText: upstreamConfig,
		RequestPath: epp.RequestPathOptions{ExtProcAddr: "127.0.0.1:0", Plaintext: true}})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Go(t, "the EPP", e.Run)
	e.Objectives().Set(datalayer.Objective{Name: modelMyModel})
	e.Datastore().Upsert(&datalayer.Endpoint{Name: "a", Address: "127.0.0.1:1", Pod: "a", Model: baseModel})
	e.Datastore().Upsert(&datalayer.Endpoint{Name: "b", Address: "127.0.0.1:2", Pod: "b", Model: baseModel})
	c, err := envoy.Dial(e.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lb := routeRaw(t, c, llm("hello", modelMyModel, modelMyModelTarget))
	if _, ok := lb.GetFields()["x-gateway-destination-endpoint"]; !ok {
		t.Fatalf("no destination in %v", lb)
	}
	if v, ok := lb.GetFields()["x-gateway-destination-endpoint-scores"]; ok {
		t.Errorf("scores %v without --emit-endpoint-scores", v)
	}
}

// routeRaw sends req's headers and body on a stream of its own and returns
// the envoy.lb dynamic metadata of the request headers' answer: what the
// testkit's Envoy reads of it is the destination alone.
func routeRaw(t *testing.T, c *envoy.Client, req envoy.Request) *structpb.Struct {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ps, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(req.Path)},
		{Key: "content-type", RawValue: []byte("application/json")}, {Key: "x-request-id", RawValue: []byte(req.RequestID)}}
	for k, v := range req.Headers {
		hs = append(hs, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: req.Body, EndOfStream: true}}},
	}
	for _, m := range msgs {
		if err := ps.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	r, err := ps.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if r.GetRequestHeaders() == nil {
		t.Fatalf("first answer %v, want the request headers' answer", r)
	}
	lb := r.GetDynamicMetadata().GetFields()["envoy.lb"].GetStructValue()
	if lb == nil {
		t.Fatalf("no envoy.lb metadata in %v", r.GetDynamicMetadata())
	}
	return lb
}
