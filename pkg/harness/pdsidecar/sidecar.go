// Package pdsidecar is a P/D routing sidecar for tests and benchmarks,
// following the protocol llm-d's routing sidecar documents with vLLM's
// NIXL connector: it sits in front of a decode engine; a request whose
// x-prefiller-host-port header names a prefill pod is first sent there as
// a prefill-only request (kv_transfer_params do_remote_decode, one token,
// not streamed), then to the local engine with the kv_transfer_params the
// prefill pod returned; a request without the header goes to the local
// engine as it is. It lets the gateway path (Envoy and the EPP's
// ext_proc) be tested end to end with disaggregated picks.
package pdsidecar

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
)

// HeaderPrefiller names the prefill pod's host:port, as llm-d's EPP sets
// it on the request to the decode pod.
const HeaderPrefiller = "x-prefiller-host-port"

// maxBody bounds a request body and a prefill answer.
const maxBody = 16 << 20

// prefillParams are a prefill-only request's kv_transfer_params.
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// Stats count what a sidecar did.
type Stats struct {
	// Split is the generation requests that named a prefill pod; Local
	// those that did not (other requests, such as the EPP's scrapes of
	// the engine's metrics, are not counted); PrefillFailures the split ones whose prefill leg failed
	// (answered with the prefill pod's failure, no decode sent).
	Split, Local, PrefillFailures int64
}

// Sidecar is one decode pod's sidecar. Its zero value is not usable: New.
type Sidecar struct {
	decoder string
	rp      *httputil.ReverseProxy
	client  *http.Client
	ln      net.Listener
	srv     *http.Server

	split, local, failures atomic.Int64
}

// New listens on addr (port 0 picks one) in front of the engine serving
// at decoder (host:port).
func New(addr, decoder string) (*Sidecar, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("pdsidecar: listen on %s: %w", addr, err)
	}
	tr := &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, ResponseHeaderTimeout: 5 * time.Minute}
	s := &Sidecar{decoder: decoder, ln: ln, client: &http.Client{Transport: tr}}
	target := &url.URL{Scheme: "http", Host: decoder}
	s.rp = &httputil.ReverseProxy{
		Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Header.Del(HeaderPrefiller) },
		Transport:     tr,
		FlushInterval: -1,
		ErrorLog:      log.New(io.Discard, "", 0),
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// Addr is where the sidecar listens: the address the EPP routes the
// decode pod's requests to.
func (s *Sidecar) Addr() string { return s.ln.Addr().String() }

// Decoder is the engine behind the sidecar.
func (s *Sidecar) Decoder() string { return s.decoder }

// Stats returns the sidecar's counts.
func (s *Sidecar) Stats() Stats {
	return Stats{Split: s.split.Load(), Local: s.local.Load(), PrefillFailures: s.failures.Load()}
}

// Run serves until ctx ends.
func (s *Sidecar) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("pdsidecar: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		_ = s.srv.Close()
	}
	s.client.CloseIdleConnections()
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pdsidecar: %w", err)
	}
	return nil
}

// ServeHTTP splits a generation request that names a prefill pod, and
// passes everything else to the decode engine.
func (s *Sidecar) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	prefiller := strings.TrimSpace(r.Header.Get(HeaderPrefiller))
	generation := r.Method == http.MethodPost && (r.URL.Path == "/v1/completions" || r.URL.Path == "/v1/chat/completions")
	// The body is read whole before anything is proxied: the transport
	// then sends bytes of the sidecar's own, never the server's request
	// body, which net/http's server may drain or close as soon as the
	// response begins (an HTTP/1 handler does not read and write at once).
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return
	}
	if prefiller == "" || !generation {
		if generation {
			s.local.Add(1)
		}
		s.pass(w, r, body)
		return
	}
	s.split.Add(1)
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		writeError(w, http.StatusBadRequest, "the body must be a JSON object")
		return
	}
	if _, _, err := net.SplitHostPort(prefiller); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%s %q is not host:port", HeaderPrefiller, prefiller))
		return
	}
	kv, status, answer := s.prefill(r, prefiller, fields)
	if kv == nil {
		if r.Context().Err() != nil {
			return // the client left; the prefill request was cancelled with it
		}
		// The prefill pod's failure is the client's answer, and no decode
		// is sent.
		s.failures.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = w.Write(answer)
		return
	}
	fields["kv_transfer_params"] = kv
	decode, err := json.Marshal(fields)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	s.pass(w, r, decode)
}

// pass sends r to the decode engine with body.
func (s *Sidecar) pass(w http.ResponseWriter, r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Del("Content-Length")
	s.rp.ServeHTTP(w, r)
}

// prefill sends the prefill leg and returns the kv_transfer_params of its
// answer; with none, the status and body the client gets instead.
func (s *Sidecar) prefill(r *http.Request, prefiller string, fields map[string]json.RawMessage) (json.RawMessage, int, []byte) {
	leg := make(map[string]json.RawMessage, len(fields)+2)
	for k, v := range fields {
		leg[k] = v
	}
	leg["kv_transfer_params"] = prefillParams
	leg["stream"] = json.RawMessage("false")
	leg["max_tokens"] = json.RawMessage("1")
	if _, ok := fields["max_completion_tokens"]; ok || r.URL.Path == "/v1/chat/completions" {
		leg["max_completion_tokens"] = json.RawMessage("1")
	}
	delete(leg, "stream_options")
	body, _ := json.Marshal(leg)
	req, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://"+prefiller+r.URL.Path, bytes.NewReader(body))
	if err != nil {
		return nil, http.StatusBadGateway, errorJSON(http.StatusBadGateway, err.Error())
	}
	req.Header.Set("Content-Type", "application/json")
	if id := r.Header.Get("x-request-id"); id != "" {
		req.Header.Set("x-request-id", id)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return nil, http.StatusBadGateway, errorJSON(http.StatusBadGateway, "prefill pod "+prefiller+": "+err.Error())
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, http.StatusBadGateway, errorJSON(http.StatusBadGateway, "prefill pod "+prefiller+": "+err.Error())
	}
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode, answer
	}
	var out struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &out); err != nil || len(out.KV) == 0 || out.KV[0] != '{' {
		return nil, http.StatusBadGateway, errorJSON(http.StatusBadGateway, "prefill pod "+prefiller+" returned no kv_transfer_params")
	}
	return out.KV, 0, nil
}

func errorJSON(code int, msg string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "code": code}})
	return b
}

func writeError(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(errorJSON(code, msg))
}
