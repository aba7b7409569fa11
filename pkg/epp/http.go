package epp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
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
			http.Error(w, fmt.Sprintf("not ready: %d endpoints known, event consumer connected: %t; %s",
				e.ds.Len(), e.consumer.Connected(), e.share.Detail()), http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n"+e.share.Detail()+"\n")
	})
	return mux
}

// debugRoutes are what DebugAddr serves: /debug/prefix, and pprof when
// enabled.
func (e *EPP) debugRoutes() http.Handler {
	mux := http.NewServeMux()
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

func (e *EPP) debugPrefix(w http.ResponseWriter, r *http.Request) {
	q, err := parsePrefixQuery(r)
	if err != nil {
		http.Error(w, "bad /debug/prefix request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ans, err := e.Lookup(r.Context(), q)
	if errors.Is(err, ErrNoPrefixProducer) {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(ans)
}

// ErrNoPrefixProducer: the scheduling configuration runs no producer of
// PrefixCacheInfo, so there is nothing PrepareData would tell about a prompt.
var ErrNoPrefixProducer = errors.New("the scheduling configuration runs no producer of " + datalayer.PrefixCacheMatchInfoKey)

// Lookup answers a prefix query as PrepareData would for a request with
// those token ids: it runs the very producers the scheduler runs, over the
// endpoints serving the query's model (every endpoint when it names none).
func (e *EPP) Lookup(ctx context.Context, q prefixquery.Query) (*prefixquery.Answer, error) {
	if !e.graph.Produces(datalayer.PrefixCacheMatchInfoKey) {
		return nil, ErrNoPrefixProducer
	}
	cands := e.ds.Candidates(func(ep *datalayer.Endpoint) bool {
		return q.Model == "" || ep.Model == q.Model
	})
	req := &request.Request{ID: "debug", Model: q.Model, LoRA: q.LoRA, CacheSalt: q.CacheSalt, TokenIDs: q.TokenIDs}
	if err := e.graph.Run(ctx, e.prepareDataTimeout(), req, cands); err != nil {
		return nil, fmt.Errorf("prefix lookup: %w", err)
	}
	ans := &prefixquery.Answer{Model: q.Model, Tokens: len(q.TokenIDs), Endpoints: make([]prefixquery.Endpoint, 0, len(cands))}
	for _, c := range cands {
		a := prefixquery.Endpoint{Name: c.Name, Address: c.Address, Model: c.Model, Stream: c.Stream}
		a.Prefix, _ = datalayer.PrefixCacheInfoOf(c)
		ans.Endpoints = append(ans.Endpoints, a)
	}
	return ans, nil
}

func parsePrefixQuery(r *http.Request) (prefixquery.Query, error) {
	var q prefixquery.Query
	switch r.Method {
	case http.MethodGet:
		v := r.URL.Query()
		q.Model, q.LoRA, q.CacheSalt = v.Get("model"), v.Get("lora"), v.Get("cache_salt")
		ids, err := prefixquery.ParseTokenList(v.Get("token_ids"))
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
		return q, fmt.Errorf("method %s not allowed (GET or POST)", director.Echo(r.Method))
	}
	if len(q.TokenIDs) == 0 {
		return q, errors.New("token_ids is empty")
	}
	return q, nil
}
