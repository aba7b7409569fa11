package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
)

// PrefillFailure is what the proxy does with a split request whose
// prefill leg failed.
type PrefillFailure int

const (
	// PrefillFailRefuse answers the client with the failure (502, or the
	// prefill pod's own 4xx) and sends no decode leg.
	PrefillFailRefuse PrefillFailure = iota
	// PrefillFailDecodeOnly sends the request whole to the decode pod,
	// which prefills it itself.
	PrefillFailDecodeOnly
)

// DefaultPrefillTimeout bounds a prefill leg when Options leave it zero.
const DefaultPrefillTimeout = 2 * time.Minute

// maxPrefillAnswer bounds a prefill pod's answer: one token and the
// transfer's parameters (a block id per block of the prompt).
const maxPrefillAnswer = 4 << 20

// ErrPrefill is wrapped by the error a split request's client gets when
// its prefill leg failed.
var ErrPrefill = errors.New("prefill leg failed")

// prefillParams are the kv_transfer_params of a prefill-only request, as
// vLLM's NIXL connector and llm-d's sidecar write them.
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

// pdMetrics count split requests' legs through the proxy.
type pdMetrics struct {
	prefillFailures *prometheus.CounterVec
	aborts          *prometheus.CounterVec
}

func newPDMetrics(reg prometheus.Registerer) pdMetrics {
	m := pdMetrics{
		prefillFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_proxy_pd_prefill_failures_total",
			Help: "Split requests whose prefill leg failed, by what the proxy did: refused (the client got the failure) or decode_only (the decode pod served the request whole).",
		}, []string{"action"}),
		aborts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_proxy_pd_aborts_total",
			Help: "Prefill legs whose held KV the proxy told the prefill pod to release (the decode leg never reached a decode pod), by result: released, or failed (the pod's connector timeout frees it).",
		}, []string{"result"}),
	}
	for _, a := range []string{"refused", "decode_only"} {
		m.prefillFailures.WithLabelValues(a)
	}
	for _, r := range []string{"released", "failed"} {
		m.aborts.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.prefillFailures, m.aborts)
	}
	return m
}

// transferParams is what the proxy reads of a prefill answer's
// kv_transfer_params: where to release the hold if no decode pod pulls it.
type transferParams struct {
	RemoteRequestID string          `json:"remote_request_id"`
	RemoteHost      string          `json:"remote_host"`
	RemotePort      json.RawMessage `json:"remote_port"`
}

// split runs a split pick's prefill leg and returns the decode leg's body.
// ok false: the client has been answered (or has left); the decode pod's
// accounting then ends with no answer of its own (Served.Status 0), which
// counts neither for nor against it.
func (s *Server) split(w http.ResponseWriter, r *http.Request, ex *exchange) (body []byte, ok bool) {
	p := ex.pick
	ex.served = director.Served{Endpoint: p.Targets[0]}
	fields, err := s.members(ex, ex.body)
	if err != nil {
		code := http.StatusBadRequest
		if errors.Is(err, errBudget) {
			code = http.StatusServiceUnavailable
			w.Header().Set("Retry-After", "1")
		}
		s.answerSplit(w, ex, code, err)
		return nil, false
	}
	kv, err := s.prefill(r, ex, fields)
	if err == nil && r.Context().Err() == nil {
		fields["kv_transfer_params"] = kv
		if body, err = json.Marshal(fields); err == nil && ex.hold(int64(len(body))) {
			var tp transferParams
			_ = json.Unmarshal(kv, &tp)
			ex.transfer = &tp
			return body, true
		}
		s.release(kv)
		w.Header().Set("Retry-After", "1")
		s.answerSplit(w, ex, http.StatusServiceUnavailable, fmt.Errorf("%w: the decode leg's body", errBudget))
		return nil, false
	}
	if r.Context().Err() != nil {
		// The client left during the prefill leg (whose request was then
		// cancelled: the engine aborts it and frees its blocks) or just
		// after it: what the prefill pod holds is released now.
		if kv != nil {
			s.release(kv)
		}
		return nil, false
	}
	if errors.Is(err, errBudget) {
		w.Header().Set("Retry-After", "1")
		s.answerSplit(w, ex, http.StatusServiceUnavailable, err)
		return nil, false
	}
	if s.o.PrefillFailure == PrefillFailDecodeOnly {
		s.m.pd.prefillFailures.WithLabelValues("decode_only").Inc()
		if s.upstreamLog.Allow() {
			s.log.LogAttrs(r.Context(), slog.LevelWarn, "prefill leg failed; serving decode-only",
				slog.String("prefill", p.Prefill), slog.String("decode", p.Targets[0]), slog.Any("error", err))
		}
		return ex.body, true
	}
	s.m.pd.prefillFailures.WithLabelValues("refused").Inc()
	code := http.StatusBadGateway
	var pe *prefillError
	if errors.As(err, &pe) && pe.status >= 400 && pe.status < 500 {
		code = pe.status // the request's own fault, as the prefill pod judged it
	}
	if s.upstreamLog.Allow() {
		s.log.LogAttrs(r.Context(), slog.LevelWarn, "prefill leg failed; decode leg not sent",
			slog.String("prefill", p.Prefill), slog.String("decode", p.Targets[0]), slog.Any("error", err))
	}
	w.Header().Set(director.HeaderPrefiller, p.Prefill)
	s.answerSplit(w, ex, code, err)
	return nil, false
}

// answerSplit answers a split request that gets no decode leg.
func (s *Server) answerSplit(w http.ResponseWriter, ex *exchange, code int, err error) {
	ex.refusedCode = code
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(director.ErrorJSON(code, err.Error()))
}

// members splits the request body into its top-level members, charged
// to the exchange's budget while the legs run, with the prefill leg's body
// made from them.
func (s *Server) members(ex *exchange, body []byte) (map[string]json.RawMessage, error) {
	if !ex.hold(2 * int64(len(body))) {
		return nil, errBudget
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("the body must be a JSON object to split it into prefill and decode legs")
	}
	return fields, nil
}

// prefillError is a prefill pod's failure answer.
type prefillError struct {
	addr   string
	status int
	msg    string
}

func (e *prefillError) Error() string {
	return fmt.Sprintf("%s: prefill pod %s answered %d: %s", ErrPrefill, e.addr, e.status, e.msg)
}

func (e *prefillError) Unwrap() error { return ErrPrefill }

// prefill sends the prefill leg: the client's request as a prefill-only
// one (do_remote_decode, one token, not streamed), and returns the
// kv_transfer_params its answer carries. The leg's end is accounted for
// with the director.
func (s *Server) prefill(r *http.Request, ex *exchange, fields map[string]json.RawMessage) (json.RawMessage, error) {
	p := ex.pick
	leg := make(map[string]json.RawMessage, len(fields)+2)
	for k, v := range fields {
		leg[k] = v
	}
	one := json.RawMessage("1")
	leg["kv_transfer_params"] = prefillParams
	leg["max_tokens"] = one
	if p.Request != nil && p.Request.API == request.APIChatCompletions {
		leg["max_completion_tokens"] = one
	}
	leg["stream"] = json.RawMessage("false")
	delete(leg, "stream_options")
	body, err := json.Marshal(leg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrefill, err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.o.PrefillTimeout)
	defer cancel()
	served := director.Served{Endpoint: p.Prefill}
	defer func() {
		if served.End.IsZero() {
			served.End = time.Now()
		}
		if ph, ok := s.d.(director.PrefillHandler); ok {
			ph.HandlePrefill(p, served)
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Prefill+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPrefill, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(director.HeaderRequestID, p.Request.ID)
	if auth := r.Header.Get("Authorization"); auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := s.o.Transport.RoundTrip(req)
	if err != nil {
		served.ConnFailed = r.Context().Err() == nil
		return nil, fmt.Errorf("%w: prefill pod %s: %w", ErrPrefill, p.Prefill, err)
	}
	defer resp.Body.Close()
	served.Status = resp.StatusCode
	if !ex.hold(maxPrefillAnswer) {
		served.Status = 0
		return nil, fmt.Errorf("%w: %w", ErrPrefill, errBudget)
	}
	defer ex.unhold(maxPrefillAnswer)
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer+1))
	served.FirstByte, served.End = time.Now(), time.Now()
	switch {
	case err != nil:
		served.ConnFailed = r.Context().Err() == nil
		return nil, fmt.Errorf("%w: read prefill pod %s's answer: %w", ErrPrefill, p.Prefill, err)
	case len(answer) > maxPrefillAnswer:
		return nil, &prefillError{addr: p.Prefill, status: resp.StatusCode, msg: fmt.Sprintf("an answer over %d bytes", maxPrefillAnswer)}
	case resp.StatusCode != http.StatusOK:
		return nil, &prefillError{addr: p.Prefill, status: resp.StatusCode, msg: errorMessage(answer)}
	}
	kv, err := transferOf(answer)
	if err != nil {
		served.Status = http.StatusBadGateway
		return nil, &prefillError{addr: p.Prefill, status: resp.StatusCode, msg: err.Error()}
	}
	if u, ok, err := openai.ParseUsage(answer); err == nil && ok {
		served.Usage = u
	}
	return kv, nil
}

// errNoTransfer: a prefill answer without the transfer's parameters.
var errNoTransfer = errors.New("the answer carries no kv_transfer_params object (is the pod's KV connector, NIXL, configured?)")

// transferOf reads a prefill pod's answer: its kv_transfer_params, which
// must be an object naming the prefill pod's hold.
func transferOf(answer []byte) (json.RawMessage, error) {
	var out struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &out); err != nil {
		return nil, fmt.Errorf("the answer is not a completion: %w", err)
	}
	kv := bytes.TrimSpace(out.KV)
	if len(kv) == 0 || kv[0] != '{' {
		return nil, errNoTransfer
	}
	var tp transferParams
	if err := json.Unmarshal(kv, &tp); err != nil {
		return nil, fmt.Errorf("kv_transfer_params: %w", err)
	}
	return kv, nil
}

// errorMessage is an error answer's message, short.
func errorMessage(body []byte) string {
	var e struct {
		Message string `json:"message"`
		Error   *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	msg := ""
	if json.Unmarshal(body, &e) == nil {
		msg = e.Message
		if e.Error != nil && msg == "" {
			msg = e.Error.Message
		}
	}
	if msg == "" {
		msg = strings.TrimSpace(string(body))
	}
	return director.Echo(msg)
}

// release tells the prefill pod that the blocks it holds for kv will not
// be pulled, on its connector's side channel (remote_host:remote_port,
// the engine's /kv_transfer/abort). A pod that does not serve it frees
// them when its connector's timeout ends (vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
func (s *Server) release(kv json.RawMessage) {
	var tp transferParams
	if json.Unmarshal(kv, &tp) != nil {
		return
	}
	s.releaseHold(&tp)
}

func (s *Server) releaseHold(tp *transferParams) {
	port := strings.Trim(string(tp.RemotePort), `"`)
	if tp.RemoteRequestID == "" || tp.RemoteHost == "" {
		return
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return
	}
	body, _ := json.Marshal(map[string]string{"remote_request_id": tp.RemoteRequestID})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+net.JoinHostPort(tp.RemoteHost, port)+"/kv_transfer/abort", bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.o.Transport.RoundTrip(req)
	result := "failed"
	if err == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			result = "released"
		}
	}
	s.m.pd.aborts.WithLabelValues(result).Inc()
}

// String is the failure policy's flag value.
func (f PrefillFailure) String() string {
	if f == PrefillFailDecodeOnly {
		return "decode-only"
	}
	return "refuse"
}

// Set reads a flag value: refuse or decode-only.
func (f *PrefillFailure) Set(s string) error {
	switch s {
	case "refuse":
		*f = PrefillFailRefuse
	case "decode-only":
		*f = PrefillFailDecodeOnly
	default:
		return fmt.Errorf("prefill failure policy %q: want refuse or decode-only", s)
	}
	return nil
}
