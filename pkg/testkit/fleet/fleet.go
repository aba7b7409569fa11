package fleet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// Options shape a Fleet. The zero value is three endpoints serving model
// "m" with 4-token blocks, the default scheduling configuration, and remote
// tokenization through a stand-in's /tokenize.
type Options struct {
	Endpoints int
	Model     string
	BlockSize int
	GPUBlocks int
	// Config is the scheduling configuration (the default when empty).
	Config string
	// NoTokenizer runs the EPP without tokenization.
	NoTokenizer bool
	// ScrapeInterval is how often the EPP scrapes each stand-in's /metrics
	// (20ms when zero).
	ScrapeInterval time.Duration
	// EPP, when set, adjusts the EPP's options before it is built.
	EPP func(*epp.Options)
	// Tokenize, when set, is what the stand-ins' /tokenize answers (the
	// EPP's remote tokenizer), while they serve with TokenizeText: an EPP
	// whose tokenizer disagrees with the engines'.
	Tokenize func(text string) []uint32
	// Process runs the stand-ins in a process of their own (this test
	// binary again, as Main runs it), so that their memory and CPU are not
	// the EPP's: in this process the EPP's garbage collector then marks
	// the EPP's heap alone, as a deployed EPP's does. Such a fleet's
	// Servers have an Addr and Serve only: no Engine, and Status, Waiting
	// and SetGate reach nothing there. A package whose tests use it calls
	// Main from TestMain.
	Process bool
	// EPPProcesses, when not empty, runs the EPP in processes of their
	// own instead of this one, one for each entry, all fed by the same
	// stand-ins (in a process of their own: Process is implied) through
	// the first one's embedded NATS server. Each serves ext_proc in
	// plaintext on loopback. The fleet's EPP, Director and Metrics are
	// then nil, and Options.EPP cannot cross. A package whose tests use it
	// calls Main from TestMain.
	EPPProcesses []EPPProcessOptions
}

// Fleet is a complete request path on loopback: an EPP (embedded NATS,
// event consumer, exact index, metrics scraping, its director) fed by
// simulated vLLM engines that publish real KV events, each behind an HTTP
// server that answers /metrics, /tokenize and /v1/* as vLLM does.
type Fleet struct {
	// EPP is the fleet's EPP in this process (nil when the EPPs run in
	// processes of their own: see Processes).
	EPP *epp.EPP
	// Processes are the EPPs in processes of their own
	// (Options.EPPProcesses), in the order asked for.
	Processes []*EPPProcess
	// Director is the EPP's own: what its ext_proc server and proxy run.
	Director *director.Director
	Servers  []*ModelServer
	// Metrics is the EPP's registry (what the director accounted, among
	// everything else).
	Metrics *prometheus.Registry
	model   string
}

// ModelServer is one vLLM stand-in.
type ModelServer struct {
	// Engine is the stand-in's simulated engine (nil when the fleet runs
	// in a process of its own: see Options.Process).
	Engine *sim.Engine
	Addr   string
	// Requests counts /v1/* requests served.
	Requests atomic.Int64
	// Status, when set, is answered to every /v1/* request instead of a
	// completion, with an OpenAI-style error body.
	Status atomic.Int32
	// Waiting is reported as vllm:num_requests_waiting.
	Waiting atomic.Int32

	srv   *httptest.Server
	mu    sync.Mutex
	gate  chan struct{}
	model string
}

// Start starts a fleet that lives until the test ends.
func Start(t testing.TB, o Options) *Fleet {
	t.Helper()
	o = o.withDefaults()
	if (o.Process || len(o.EPPProcesses) > 0) && o.Tokenize != nil {
		t.Fatal("fleet: Options.Tokenize cannot cross to a fleet in a process of its own")
	}
	if len(o.EPPProcesses) > 0 {
		return startEPPProcesses(t, o)
	}
	eo := eppOptions(o)
	if o.EPP != nil {
		o.EPP(&eo)
	}
	e, err := epp.New(eo)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var stopOnce sync.Once
	// engines are the stand-ins' snapshot services, which end with ctx.
	var engines sync.WaitGroup
	stop := func() {
		stopOnce.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("EPP: %v", err)
			}
			engines.Wait()
		})
	}
	t.Cleanup(stop)

	f := &Fleet{EPP: e, Director: e.Director(), Metrics: e.Registry(), model: o.Model}
	if o.Process {
		for _, addr := range startProcess(t, o, e.NATSURL(), e.Namespace(), e.Pool()) {
			f.Servers = append(f.Servers, &ModelServer{Addr: addr, model: o.Model})
		}
	} else {
		nc, err := nats.Connect(e.NATSURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		pub := events.NewPublisher(nc, e.Namespace(), e.Pool())
		for i := range o.Endpoints {
			ms, err := startServer(ctx, i, o, pub, &engines, func(err error) { t.Errorf("engine %d: %v", i, err) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(ms.srv.Close)
			f.Servers = append(f.Servers, ms)
		}
	}
	for i, ms := range f.Servers {
		e.Datastore().Upsert(endpoint(i, ms.Addr, o.Model))
	}
	// The EPP stops before the stand-ins, so that it does not scrape them gone.
	t.Cleanup(stop)
	return f
}

// eppOptions are the options of a fleet's EPP, before Options.EPP.
func eppOptions(o Options) epp.Options {
	return epp.Options{
		Pool: "pool", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Scrape: true, ScrapeOptions: scrape.Options{Interval: o.ScrapeInterval},
		Prefix:     prefixmatch.Params{DefaultBlockSizeTokens: o.BlockSize},
		ConfigText: o.Config,
		RequestPath: epp.RequestPathOptions{
			Tokenize: !o.NoTokenizer, TokenizeTimeout: 2 * time.Second,
		},
	}
}

// endpoint is stand-in i at addr, as the EPP's datastore knows it.
func endpoint(i int, addr, model string) *datalayer.Endpoint {
	return &datalayer.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: addr, Pod: fmt.Sprintf("pod-%d", i), Model: model}
}

func (o Options) withDefaults() Options {
	if o.Endpoints <= 0 {
		o.Endpoints = 3
	}
	if o.Model == "" {
		o.Model = "m"
	}
	if o.BlockSize <= 0 {
		o.BlockSize = 4
	}
	if o.GPUBlocks <= 0 {
		o.GPUBlocks = 256
	}
	if o.ScrapeInterval <= 0 {
		o.ScrapeInterval = 20 * time.Millisecond
	}
	return o
}

// startServer starts stand-in i: its engine, publishing on pub, whose
// snapshot service runs in engines until ctx ends (reporting its error to
// fail), and its HTTP server.
func startServer(ctx context.Context, i int, o Options, pub *events.Publisher, engines *sync.WaitGroup, fail func(error)) (*ModelServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ms := &ModelServer{Addr: ln.Addr().String(), model: o.Model}
	ms.Engine = sim.NewEngine(sim.EngineConfig{
		Pod: fmt.Sprintf("pod-%d", i), Address: ms.Addr, Model: o.Model,
		Pool: blockpool.Config{BlockSize: o.BlockSize, GPUBlocks: o.GPUBlocks, Seed: uint64(i + 1)},
	}, pub)
	engines.Add(1)
	go func() {
		defer engines.Done()
		if err := ms.Engine.ServeSnapshots(ctx, 0); err != nil {
			fail(err)
		}
	}()
	ms.srv = httptest.NewUnstartedServer(ms.routes(o))
	ms.srv.Listener = ln
	ms.srv.Start()
	return ms, nil
}

// Server returns the stand-in at addr, or nil.
func (f *Fleet) Server(addr string) *ModelServer {
	for _, s := range f.Servers {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// WaitHeld waits until the index says addr holds every full block of
// tokens, which is when a pick can follow the cache there; with EPPs in
// processes of their own, until every one's index says so.
func (f *Fleet) WaitHeld(t testing.TB, addr string, tokens []uint32) {
	t.Helper()
	if f.EPP != nil {
		testkit.WaitFor(t, "the index to show "+addr+" holding the prompt", func() error {
			return holds(f.EPP, f.model, addr, tokens)
		})
	}
	for i, p := range f.Processes {
		testkit.WaitFor(t, fmt.Sprintf("EPP process %d's index to show %s holding the prompt", i, addr), func() error {
			var held bool
			if err := p.child.Call(opHeld, heldArg{Addr: addr, Tokens: tokens}, &held); err != nil {
				t.Fatal(err)
			}
			if !held {
				return fmt.Errorf("EPP process %d's index does not show %s holding it", i, addr)
			}
			return nil
		})
	}
}

// holds is nil when e's index shows addr holding every full block of
// tokens, else an error saying what the index answered.
func holds(e *epp.EPP, model, addr string, tokens []uint32) error {
	ans, err := e.Lookup(context.Background(), prefixquery.Query{Model: model, TokenIDs: tokens})
	if err != nil {
		return err
	}
	for _, a := range ans.Endpoints {
		if a.Address == addr && a.Prefix.MatchBlocks > 0 && a.Prefix.MatchBlocks == a.Prefix.TotalBlocks {
			return nil
		}
	}
	return fmt.Errorf("answer %+v", ans.Endpoints)
}

// TokenizeText is the stand-ins' tokenizer: one token per
// whitespace-separated word, a hash of the word below 50000.
func TokenizeText(s string) []uint32 {
	var ids []uint32
	for _, w := range strings.Fields(s) {
		h := fnv.New32a()
		_, _ = h.Write([]byte(w))
		ids = append(ids, h.Sum32()%50000)
	}
	return ids
}

func (ms *ModelServer) routes(o Options) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=%q} %d\n", o.Model, ms.Waiting.Load())
		fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=%q} 0\n", o.Model)
		fmt.Fprintf(w, "# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name=%q} %g\n", o.Model, ms.Engine.Usage())
		fmt.Fprintf(w, "# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{block_size=\"%d\",num_gpu_blocks=\"%d\"} 1\n", o.BlockSize, o.GPUBlocks)
	})
	mux.HandleFunc("POST /tokenize", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Prompt string `json:"prompt"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 16<<20)).Decode(&in); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		tokenize := TokenizeText
		if o.Tokenize != nil {
			tokenize = o.Tokenize
		}
		ids := tokenize(in.Prompt)
		if ids == nil {
			ids = []uint32{}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 131072, "tokens": ids})
	})
	mux.HandleFunc("/v1/", ms.serve)
	return mux
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(director.ErrorJSON(code, msg))
}

// serve answers a completion as vLLM would, after running the prompt
// through the engine so that its KV events are published.
func (ms *ModelServer) serve(w http.ResponseWriter, r *http.Request) {
	ms.Requests.Add(1)
	w.Header().Set("X-Served-By", ms.Addr)
	if code := ms.Status.Load(); code != 0 {
		writeError(w, int(code), "the model server is unhappy")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if r.Method == http.MethodGet {
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []any{map[string]any{"id": ms.Engine.Config().Model}}})
		return
	}
	req, err := openai.ParseRequest(r.URL.Path, body)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tokens := req.TokenIDs
	if len(tokens) == 0 {
		tokens = TokenizeText(req.Prompt)
	}
	hit, err := ms.Engine.Serve(blockpool.Request{Tokens: tokens})
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	usage := map[string]any{
		"prompt_tokens": len(tokens), "completion_tokens": 3, "total_tokens": len(tokens) + 3,
		"prompt_tokens_details": map[string]any{"cached_tokens": hit * ms.Engine.Config().Pool.BlockSize},
	}
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"id": "cmpl-1", "object": "text_completion", "model": req.Model,
			"choices": []any{map[string]any{"index": 0, "text": "one two three", "finish_reason": "length"}},
			"usage":   usage,
		})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl, _ := w.(http.Flusher)
	event := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	ms.mu.Lock()
	gate := ms.gate
	ms.mu.Unlock()
	for i, word := range []string{"one", "two", "three"} {
		event(map[string]any{"id": "cmpl-1", "object": "text_completion", "choices": []any{map[string]any{"index": 0, "text": word}}, "usage": nil})
		if i == 0 && gate != nil {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
	}
	event(map[string]any{"id": "cmpl-1", "object": "text_completion", "choices": []any{}, "usage": usage})
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// SetGate holds the next streaming responses after their first event
// until g is closed (nil: no hold).
func (ms *ModelServer) SetGate(g chan struct{}) {
	ms.mu.Lock()
	ms.gate = g
	ms.mu.Unlock()
}

// Close stops the stand-in's HTTP server: its address then refuses
// connections, as a pod that went away does. A stand-in in a process of
// its own cannot be closed alone.
func (ms *ModelServer) Close() {
	if ms.srv == nil {
		panic("fleet: a stand-in in a process of its own cannot be closed alone")
	}
	ms.srv.Close()
}

// Serve has the stand-in's engine compute a prompt of tokens, as a request
// it served would, publishing the KV events of the blocks it stores. A
// stand-in in a process of its own is sent the prompt as a completion.
func (ms *ModelServer) Serve(tokens []uint32) error {
	if ms.Engine != nil {
		_, err := ms.Engine.Serve(blockpool.Request{Tokens: tokens})
		return err
	}
	body, err := json.Marshal(map[string]any{"model": ms.model, "prompt": tokens, "max_tokens": 1})
	if err != nil {
		return err
	}
	resp, err := http.Post("http://"+ms.Addr+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("stand-in %s: %s: %s", ms.Addr, resp.Status, msg)
	}
	return nil
}

// FillPrefixes has every server's engine compute a prefix of its own,
// length tokens long, and returns the prefixes: server i's tokens are
// i*length to (i+1)*length-1, so no two share a block.
func (f *Fleet) FillPrefixes(tb testing.TB, length int) [][]uint32 {
	tb.Helper()
	prefixes := make([][]uint32, len(f.Servers))
	for i, s := range f.Servers {
		p := make([]uint32, length)
		for j := range p {
			p[j] = uint32(i*length + j)
		}
		prefixes[i] = p
		if err := s.Serve(p); err != nil {
			tb.Fatal(err)
		}
	}
	return prefixes
}

// PrefixBodies makes a completions body per prefix: a prompt of size token
// ids that shares all but its last 16 with the prefix.
func PrefixBodies(prefixes [][]uint32, size int) [][]byte {
	bodies := make([][]byte, len(prefixes))
	for i, p := range prefixes {
		prompt := append(slices.Clone(p[:size-16]), make([]uint32, 16)...)
		for j := size - 16; j < size; j++ {
			prompt[j] = uint32(1<<30 + j)
		}
		bodies[i], _ = json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
	}
	return bodies
}
