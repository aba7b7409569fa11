package epp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/framework/request"
)

func jetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("epp: JetStream: %w", err)
	}
	return js, nil
}

// maxDebugBody bounds a /debug/prefix request: 1M token ids as JSON.
const maxDebugBody = 8 << 20

func (e *EPP) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{Registry: e.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !e.Ready() {
			http.Error(w, fmt.Sprintf("not ready: %d endpoints known, event consumer connected: %t",
				e.ds.Len(), e.consumer.Connected()), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/debug/prefix", e.debugPrefix)
	if e.opts.EnablePprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// PrefixQuery is a /debug/prefix question: who holds this prompt? It comes
// as a JSON body (POST) or as query parameters (GET, token_ids
// comma-separated).
type PrefixQuery struct {
	Model     string   `json:"model"`
	LoRA      string   `json:"lora,omitempty"`
	CacheSalt string   `json:"cache_salt,omitempty"`
	TokenIDs  []uint32 `json:"token_ids"`
}

// PrefixAnswer is the /debug/prefix answer: every candidate endpoint's
// PrefixCacheInfo for the query.
type PrefixAnswer struct {
	Model     string           `json:"model"`
	Tokens    int              `json:"tokens"`
	Endpoints []EndpointAnswer `json:"endpoints"`
}

// EndpointAnswer is one endpoint's part of a PrefixAnswer.
type EndpointAnswer struct {
	Name    string                    `json:"name"`
	Address string                    `json:"address"`
	Model   string                    `json:"model"`
	Stream  datalayer.StreamState     `json:"stream"`
	Prefix  datalayer.PrefixCacheInfo `json:"prefix"`
}

func (e *EPP) debugPrefix(w http.ResponseWriter, r *http.Request) {
	q, err := parsePrefixQuery(r)
	if err != nil {
		http.Error(w, "bad /debug/prefix request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ans, err := e.Lookup(r.Context(), q)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(ans)
}

// Lookup answers a PrefixQuery with the same producer PrepareData runs, over
// the endpoints serving the query's model (every endpoint when it names none).
func (e *EPP) Lookup(ctx context.Context, q PrefixQuery) (*PrefixAnswer, error) {
	cands := e.ds.Candidates(func(ep *datalayer.Endpoint) bool {
		return q.Model == "" || ep.Model == q.Model
	})
	req := &request.Request{ID: "debug", Model: q.Model, LoRA: q.LoRA, CacheSalt: q.CacheSalt, TokenIDs: q.TokenIDs}
	if err := e.producer.Produce(ctx, req, cands); err != nil {
		return nil, fmt.Errorf("prefix lookup: %w", err)
	}
	ans := &PrefixAnswer{Model: q.Model, Tokens: len(q.TokenIDs), Endpoints: make([]EndpointAnswer, 0, len(cands))}
	for _, c := range cands {
		a := EndpointAnswer{Name: c.Name, Address: c.Address, Model: c.Model, Stream: c.Stream}
		if v, ok := c.Get(datalayer.PrefixCacheMatchInfoKey); ok {
			a.Prefix, _ = v.(datalayer.PrefixCacheInfo)
		}
		ans.Endpoints = append(ans.Endpoints, a)
	}
	return ans, nil
}

func parsePrefixQuery(r *http.Request) (PrefixQuery, error) {
	var q PrefixQuery
	switch r.Method {
	case http.MethodGet:
		v := r.URL.Query()
		q.Model, q.LoRA, q.CacheSalt = v.Get("model"), v.Get("lora"), v.Get("cache_salt")
		ids, err := ParseTokenList(v.Get("token_ids"))
		if err != nil {
			return q, err
		}
		q.TokenIDs = ids
	case http.MethodPost:
		dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxDebugBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&q); err != nil {
			return q, fmt.Errorf("JSON body: %w", err)
		}
	default:
		return q, fmt.Errorf("method %s not allowed (GET or POST)", r.Method)
	}
	if len(q.TokenIDs) == 0 {
		return q, errors.New("token_ids is empty")
	}
	return q, nil
}

// ParseTokenList parses comma-separated token ids ("1,2,3"; spaces allowed).
func ParseTokenList(s string) ([]uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	out := make([]uint32, 0, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("token id %d (%q): not a non-negative 32-bit integer", i, p)
		}
		out = append(out, uint32(v))
	}
	return out, nil
}
