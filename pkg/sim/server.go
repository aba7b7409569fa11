package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// MaxModelLen is the context length the simulated engines report.
const MaxModelLen = 131072

// maxBody bounds a request body.
const maxBody = 64 << 20

// defaultMaxTokens is the output length when a request gives none.
const defaultMaxTokens = 16

// Server is a core's OpenAI-compatible HTTP API, shaped as vLLM's:
// /v1/completions and /v1/chat/completions (streaming or not, with usage
// and cached tokens), /tokenize, /health, /v1/models and /metrics with
// vLLM's metric names.
type Server struct {
	r    *Core
	addr string
	srv  *http.Server
	reg  *prometheus.Registry
	next atomic.Uint64

	fault atomic.Int32
	// mu guards ln and listening: while the server refuses connections
	// (FaultRefuse) ln is closed and listening is the channel closed when
	// it listens again.
	mu        sync.Mutex
	ln        net.Listener
	listening chan struct{}
	stopped   chan struct{}
	// pd is the server's side of the P/D contract (pd.go).
	pd pdState
	// ranks are a data-parallel engine's cores, rank order (dp.go); nil
	// for an engine of one rank, r. rankServed and rankPinned count the
	// requests each rank was given, and those its header named.
	ranks                  []*Core
	rankServed, rankPinned [MaxDPRanks]atomic.Int64
}

// MaxDPRanks bounds a simulated engine's data-parallel ranks.
const MaxDPRanks = 64

// Fault is how a server fails its generation requests (/v1/completions
// and /v1/chat/completions), so that tests can make an engine fail and
// recover while it runs: SetFault.
type Fault int32

const (
	// FaultNone: the engine serves.
	FaultNone Fault = iota
	// FaultError answers every generation request at once with a 500.
	FaultError
	// FaultRefuse closes the listening socket, so that connections are
	// refused, and stops keeping connections alive, so that one already
	// open serves at most the request under way; the server listens at
	// the same address again when the fault is cleared.
	FaultRefuse
	// FaultFabricate answers every generation request at once with a 200
	// whose usage is made up: no output tokens, every prompt token cached.
	FaultFabricate
)

// NewServer serves r's API on ln once Run is called; with a nil ln only
// its Handler serves.
func NewServer(r *Core, ln net.Listener) *Server { return newServer([]*Core{r}, ln) }

func newServer(ranks []*Core, ln net.Listener) *Server {
	s := &Server{r: ranks[0], ln: ln, reg: prometheus.NewRegistry(), stopped: make(chan struct{})}
	if len(ranks) > 1 {
		s.ranks = ranks
	}
	if ln != nil {
		s.addr = ln.Addr().String()
	}
	s.reg.MustRegister(&vllmCollector{r: ranks[0], ranks: s.ranks})
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	return s
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.addr }

// SetFault switches the server's fault; FaultNone ends it. Leaving
// FaultRefuse fails when the address cannot be listened on again.
func (s *Server) SetFault(f Fault) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	was := Fault(s.fault.Swap(int32(f)))
	switch {
	case s.ln == nil:
		// Only a Handler: there is no socket to close.
	case f == FaultRefuse && was != FaultRefuse:
		s.listening = make(chan struct{})
		s.srv.SetKeepAlivesEnabled(false)
		if err := s.ln.Close(); err != nil {
			return fmt.Errorf("sim server %s: refuse: %w", s.addr, err)
		}
	case f != FaultRefuse && was == FaultRefuse:
		ln, err := net.Listen("tcp", s.addr)
		if err != nil {
			s.fault.Store(int32(FaultRefuse))
			return fmt.Errorf("sim server %s: listen again: %w", s.addr, err)
		}
		s.ln = ln
		s.srv.SetKeepAlivesEnabled(true)
		close(s.listening)
		s.listening = nil
	}
	return nil
}

// serve serves on the listener, and again on each new one after a
// FaultRefuse ends, until the server is shut down.
func (s *Server) serve() error {
	for {
		s.mu.Lock()
		ln := s.ln
		s.mu.Unlock()
		err := s.srv.Serve(ln)
		s.mu.Lock()
		wait, same := s.listening, s.ln == ln
		s.mu.Unlock()
		switch {
		case errors.Is(err, http.ErrServerClosed):
			return err
		case wait != nil:
			select {
			case <-wait:
			case <-s.stopped:
				return http.ErrServerClosed
			}
		case same:
			return err // the listener failed of itself
		}
		// Else a refusal began and ended meanwhile: serve the new listener.
	}
}

// Core is the engine behind the server.
func (s *Server) Core() *Core { return s.r }

// Run serves until ctx is done, then shuts the server down.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.serve() }()
	select {
	case err := <-errc:
		return fmt.Errorf("sim server %s: %w", s.Addr(), err)
	case <-ctx.Done():
	}
	close(s.stopped)
	defer s.pd.closeIdle()
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		_ = s.srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("sim server %s: %w", s.Addr(), err)
	}
	return nil
}

// Handler is the server's routes.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	metrics := promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		if s.r.eng.MetricsSilent() {
			writeError(w, http.StatusServiceUnavailable, "metrics not ready")
			return
		}
		metrics.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /tokenize", s.tokenize)
	mux.HandleFunc("POST /v1/completions", s.complete)
	mux.HandleFunc("POST /v1/chat/completions", s.complete)
	s.pdRoutes(mux)
	s.apiRoutes(mux)
	return mux
}

func (s *Server) model() string { return s.r.eng.cfg.Model }

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError answers in vLLM's error shape.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]any{
		"object": "error", "message": msg, "type": http.StatusText(code), "param": nil, "code": code,
	})
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{
		map[string]any{"id": s.model(), "object": "model", "owned_by": "kvsim", "max_model_len": MaxModelLen},
	}})
}

// tokenize answers vLLM's /tokenize: a completion's prompt, or a chat's
// messages rendered as the chat endpoint renders them.
func (s *Server) tokenize(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	var in struct {
		Prompt   *string         `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		writeError(w, http.StatusBadRequest, "tokenize: "+jsonReason(err))
		return
	}
	if in.Prompt == nil && isNull(in.Messages) {
		writeError(w, http.StatusBadRequest, "tokenize: either prompt or messages is required")
		return
	}
	req, err := parseRequest(body, in.Prompt == nil)
	if err != nil {
		writeError(w, http.StatusBadRequest, "tokenize: "+err.Error())
		return
	}
	ids, err := s.promptTokens(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, "tokenize: "+err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": MaxModelLen, "tokens": ids})
}

// promptTokens is what the engine prefills for req: its token ids, or its
// text (a chat's rendered by the model's chat template) tokenized.
func (s *Server) promptTokens(req *genRequest) ([]uint32, error) {
	if req.TokenIDs != nil {
		return req.TokenIDs, nil
	}
	tok := s.r.eng.tokenizer()
	text := req.Prompt
	if req.Chat {
		var err error
		if text, err = tok.RenderChat(req.Messages); err != nil {
			return nil, fmt.Errorf("%w: chat template: %v", errBadRequest, err)
		}
	}
	ids, err := tok.Encode(text, req.AddSpecialTokens)
	if err != nil {
		return nil, fmt.Errorf("%w: tokenize: %v", errBadRequest, err)
	}
	return ids, nil
}

func (s *Server) complete(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	chat := r.URL.Path == "/v1/chat/completions"
	req, err := parseRequest(body, chat)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if kv := req.KVTransfer; kv != nil && kv.DoRemotePrefill {
		// A decode request refused before it pulls: the prefill engine
		// is told, as vLLM's connector tells it, rather than left holding.
		w = &refusalNotifier{ResponseWriter: w, notify: func() { _ = s.notifyPrefill(kv, "abort", 0) }}
	}
	if req.Model != s.model() {
		writeError(w, http.StatusNotFound, fmt.Sprintf("the model `%s` does not exist", req.Model))
		return
	}
	tokens, err := s.promptTokens(req)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch Fault(s.fault.Load()) {
	case FaultRefuse:
		// A connection accepted before the socket closed, or kept alive
		// from before: cut it, as a crashed engine's connections are, so
		// that no request is served once the fault is on.
		if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = c.Close()
			return
		}
		writeError(w, http.StatusServiceUnavailable, "the engine is down")
		return
	case FaultError:
		writeError(w, http.StatusInternalServerError, "the engine failed")
		return
	case FaultFabricate:
		s.fabricate(w, req, len(tokens))
		return
	}
	if len(tokens) == 0 {
		writeError(w, http.StatusBadRequest, "the prompt is empty")
		return
	}
	maxTokens := defaultMaxTokens
	if req.MaxTokens > 0 {
		maxTokens = req.MaxTokens
	}
	if len(tokens) >= MaxModelLen {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("this model's maximum context length is %d tokens, and the prompt alone is %d tokens; shorten the prompt",
			MaxModelLen, len(tokens)))
		return
	}
	if maxTokens > MaxModelLen-len(tokens) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("max_tokens must be in [1, %d] for a %d-token prompt (max_model_len %d)",
			MaxModelLen-len(tokens), len(tokens), MaxModelLen))
		return
	}
	breq := blockpool.Request{Tokens: tokens, Salt: req.CacheSalt}
	kv := req.KVTransfer
	keep := kv != nil && kv.DoRemoteDecode
	if keep && req.Stream {
		writeError(w, http.StatusBadRequest, "kv_transfer_params: do_remote_decode needs stream false: the answer carries the transfer's parameters")
		return
	}
	if kv != nil && kv.DoRemotePrefill {
		if rn, ok := w.(*refusalNotifier); ok {
			w = rn.ResponseWriter // from here the pull tells the prefill engine
		}
		if !s.remotePrefill(r.Context(), kv, breq) {
			return
		}
	}
	core, err := s.rankFor(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	seq, err := core.submit(breq, maxTokens, keep)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	id := fmt.Sprintf("cmpl-%s-%d", s.r.eng.cfg.Pod, s.next.Add(1))
	if chat {
		id = "chat" + id
	}
	e := emitter{w: w, id: id, model: req.Model, chat: chat, created: time.Now().Unix()}
	if keep {
		e.done = func() map[string]any { return map[string]any{"kv_transfer_params": s.hold(seq)} }
		e.gone = func() { s.releaseKept(seq) }
	}
	if req.Stream {
		e.stream(r.Context(), seq, req.IncludeUsage)
		return
	}
	e.whole(r.Context(), seq)
}

// fabricate answers at once with a made-up success: no output, and usage
// that claims every prompt token was cached and none generated.
func (s *Server) fabricate(w http.ResponseWriter, req *genRequest, prompt int) {
	usage := map[string]any{
		"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt,
		"prompt_tokens_details": map[string]any{"cached_tokens": prompt},
	}
	chat := req.Chat
	choice := map[string]any{"index": 0, "finish_reason": "stop", "logprobs": nil, "text": ""}
	obj := "text_completion"
	if chat {
		obj = "chat.completion"
		delete(choice, "text")
		choice["message"] = map[string]any{"role": "assistant", "content": ""}
	}
	if !req.Stream {
		writeJSON(w, http.StatusOK, map[string]any{"id": "cmpl-fabricated", "object": obj, "model": req.Model,
			"choices": []any{choice}, "usage": usage})
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := func(v any) {
		b, _ := json.Marshal(v)
		_, _ = fmt.Fprintf(w, "data: %s\n\n", b)
	}
	chunk(map[string]any{"id": "cmpl-fabricated", "object": obj, "model": req.Model, "choices": []any{choice}, "usage": nil})
	if req.IncludeUsage {
		chunk(map[string]any{"id": "cmpl-fabricated", "object": obj, "model": req.Model, "choices": []any{}, "usage": usage})
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
}

// outputWord is the text of output token i: deterministic, so that a
// conversation replayed gives the same history.
func outputWord(i int) string { return " w" + strconv.Itoa(i%97) }

// ReplyText is the text of an n-token completion, as the server streams it.
func ReplyText(n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(outputWord(i))
	}
	return b.String()
}

type emitter struct {
	w       http.ResponseWriter
	id      string
	model   string
	chat    bool
	created int64
	// done, when set, gives fields the whole answer adds; gone is called
	// when the client leaves before the end.
	done func() map[string]any
	gone func()
}

func (e *emitter) usage(seq *Seq, generated int) map[string]any {
	p := seq.PromptTokens()
	return map[string]any{
		"prompt_tokens": p, "completion_tokens": generated, "total_tokens": p + generated,
		"prompt_tokens_details": map[string]any{"cached_tokens": seq.Cached()},
	}
}

func (e *emitter) object() string {
	if e.chat {
		return "chat.completion"
	}
	return "text_completion"
}

func (e *emitter) whole(ctx context.Context, seq *Seq) {
	var text []byte
	n := 0
	for {
		select {
		case <-ctx.Done():
			if e.gone != nil {
				e.gone()
			}
			return
		case t := <-seq.Tokens:
			if t.Err != nil {
				writeError(e.w, http.StatusServiceUnavailable, t.Err.Error())
				return
			}
			if !t.Done {
				text = append(text, outputWord(t.Index)...)
				n++
				continue
			}
			choice := map[string]any{"index": 0, "finish_reason": "length", "logprobs": nil}
			if e.chat {
				choice["message"] = map[string]any{"role": "assistant", "content": string(text)}
			} else {
				choice["text"] = string(text)
			}
			resp := map[string]any{
				"id": e.id, "object": e.object(), "created": e.created, "model": e.model,
				"choices": []any{choice}, "usage": e.usage(seq, n),
			}
			if e.done != nil {
				for k, v := range e.done() {
					resp[k] = v
				}
			}
			writeJSON(e.w, http.StatusOK, resp)
			return
		}
	}
}

func (e *emitter) stream(ctx context.Context, seq *Seq, includeUsage bool) {
	e.w.Header().Set("Content-Type", "text/event-stream")
	e.w.Header().Set("Cache-Control", "no-cache")
	fl, _ := e.w.(http.Flusher)
	obj := "text_completion"
	if e.chat {
		obj = "chat.completion.chunk"
	}
	send := func(choices []any, usage any) {
		b, _ := json.Marshal(map[string]any{
			"id": e.id, "object": obj, "created": e.created, "model": e.model, "choices": choices, "usage": usage,
		})
		_, _ = fmt.Fprintf(e.w, "data: %s\n\n", b)
		if fl != nil {
			fl.Flush()
		}
	}
	choice := func(text string, finish any) []any {
		c := map[string]any{"index": 0, "finish_reason": finish, "logprobs": nil}
		if e.chat {
			c["delta"] = map[string]any{"content": text}
		} else {
			c["text"] = text
		}
		return []any{c}
	}
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case t := <-seq.Tokens:
			if t.Err != nil {
				b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": t.Err.Error(), "code": 503}})
				_, _ = fmt.Fprintf(e.w, "data: %s\n\n", b)
				return
			}
			if !t.Done {
				if n == 0 && e.chat {
					send([]any{map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "finish_reason": nil, "logprobs": nil}}, nil)
				}
				n++
				send(choice(outputWord(t.Index), nil), nil)
				continue
			}
			send(choice("", "length"), nil)
			if includeUsage {
				send([]any{}, e.usage(seq, n))
			}
			_, _ = fmt.Fprint(e.w, "data: [DONE]\n\n")
			if fl != nil {
				fl.Flush()
			}
			return
		}
	}
}

// vllmCollector exposes a core's state under vLLM's metric names; for a
// data-parallel engine, its ranks' summed (KV usage: averaged).
type vllmCollector struct {
	r     *Core
	ranks []*Core
}

var (
	labelsModel  = []string{"model_name"}
	descWaiting  = prometheus.NewDesc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labelsModel, nil)
	descRunning  = prometheus.NewDesc("vllm:num_requests_running", "Number of requests in model execution batches.", labelsModel, nil)
	descKVUsage  = prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labelsModel, nil)
	descCacheCfg = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", []string{"block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching"}, nil)
	// A data-parallel server's, one series per rank, as vLLM labels them.
	descCacheCfgDP = prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig.", []string{"block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching", "engine"}, nil)
	descLoRA       = prometheus.NewDesc("vllm:lora_requests_info", "Running stats on lora requests.", []string{"max_lora", "running_lora_adapters", "waiting_lora_adapters"}, nil)
	descQueries    = prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", labelsModel, nil)
	descHits       = prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", labelsModel, nil)
	descSuccess    = prometheus.NewDesc("vllm:request_success_total", "Count of successfully processed requests.", labelsModel, nil)
	descPromptTok  = prometheus.NewDesc("vllm:prompt_tokens_total", "Number of prefill tokens processed.", labelsModel, nil)
	descGenTok     = prometheus.NewDesc("vllm:generation_tokens_total", "Number of generation tokens processed.", labelsModel, nil)
)

func (c *vllmCollector) Describe(ch chan<- *prometheus.Desc) {
	cfg := descCacheCfg
	if len(c.ranks) > 1 {
		cfg = descCacheCfgDP
	}
	for _, d := range []*prometheus.Desc{descWaiting, descRunning, descKVUsage, cfg, descLoRA, descQueries, descHits, descSuccess, descPromptTok, descGenTok} {
		ch <- d
	}
}

func (c *vllmCollector) Collect(ch chan<- prometheus.Metric) {
	ranks := c.ranks
	if len(ranks) == 0 {
		ranks = []*Core{c.r}
	}
	var waiting, running int
	var usage float64
	var st CoreStats
	for _, r := range ranks {
		w, n := r.Load()
		waiting, running = waiting+w, running+n
		usage += r.eng.Usage() / float64(len(ranks))
		rs := r.Stats()
		st.PrefixQueries += rs.PrefixQueries
		st.PrefixHits += rs.PrefixHits
		st.Requests += rs.Requests
		st.PromptTokens += rs.PromptTokens
		st.GenerationTokens += rs.GenerationTokens
	}
	cfg := c.r.eng.cfg
	m := cfg.Model
	ch <- prometheus.MustNewConstMetric(descWaiting, prometheus.GaugeValue, float64(waiting), m)
	ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, float64(running), m)
	ch <- prometheus.MustNewConstMetric(descKVUsage, prometheus.GaugeValue, usage, m)
	if len(c.ranks) > 1 {
		for i := range c.ranks {
			ch <- prometheus.MustNewConstMetric(descCacheCfgDP, prometheus.GaugeValue, 1,
				strconv.Itoa(cfg.Pool.BlockSize), strconv.Itoa(cfg.Pool.GPUBlocks), strconv.Itoa(cfg.Pool.CPUBlocks), "True", strconv.Itoa(i))
		}
	} else {
		ch <- prometheus.MustNewConstMetric(descCacheCfg, prometheus.GaugeValue, 1,
			strconv.Itoa(cfg.Pool.BlockSize), strconv.Itoa(cfg.Pool.GPUBlocks), strconv.Itoa(cfg.Pool.CPUBlocks), "True")
	}
	ch <- prometheus.MustNewConstMetric(descLoRA, prometheus.GaugeValue, float64(time.Now().Unix()), "0", "", "")
	ch <- prometheus.MustNewConstMetric(descQueries, prometheus.CounterValue, float64(st.PrefixQueries), m)
	ch <- prometheus.MustNewConstMetric(descHits, prometheus.CounterValue, float64(st.PrefixHits), m)
	ch <- prometheus.MustNewConstMetric(descSuccess, prometheus.CounterValue, float64(st.Requests), m)
	ch <- prometheus.MustNewConstMetric(descPromptTok, prometheus.CounterValue, float64(st.PromptTokens), m)
	ch <- prometheus.MustNewConstMetric(descGenTok, prometheus.CounterValue, float64(st.GenerationTokens), m)
}
