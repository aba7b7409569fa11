package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// RoleLabel is the pod label naming the stages a pod serves, as llm-d
// labels them; the sim's engines carry its value in EngineConfig.Role so
// that discovery (static endpoints, pods) can label them.
const RoleLabel = "llm-d.ai/role"

// Role values an engine can be given. Every engine serves every request,
// as vLLM with the NIXL connector in kv_both does: the role says what the
// router is meant to send it.
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// DefaultHoldTimeout is how long a prefill engine keeps the blocks of a
// prefill-only request that no decode engine pulls: vLLM's
// VLLM_NIXL_ABORT_REQUEST_TIMEOUT default.
const DefaultHoldTimeout = 480 * time.Second

// Transfer is the KV transfer between engines, as the NIXL connector makes
// it: a pull by the decode engine of the blocks it lacks, costing Latency
// plus their bytes over Bandwidth.
type Transfer struct {
	// Latency is each pull's fixed cost (the handshake and descriptors).
	Latency time.Duration
	// BlockBytes is one block's KV over every layer.
	BlockBytes int64
	// Bandwidth is the link's bytes per second; 0 means unbounded.
	Bandwidth float64
	// HoldTimeout bounds how long a prefill engine keeps blocks no one
	// pulls (DefaultHoldTimeout when zero).
	HoldTimeout time.Duration
	// ByNear, when set, prices a pull between engines of known places by
	// how near they are (indexed by Near: host, rack, zone, region); a
	// zero Link, engines farther apart and engines of unknown place pay
	// Latency and Bandwidth.
	ByNear [NearNone]Link
}

// Cost is the time to pull blocks blocks over the default link.
func (t Transfer) Cost(blocks int) time.Duration {
	return t.cost(blocks, Link{Latency: t.Latency, Bandwidth: t.Bandwidth})
}

// CostAt is the time to pull blocks blocks between engines near apart.
func (t Transfer) CostAt(blocks int, near Near) time.Duration {
	if near < NearNone && t.ByNear[near] != (Link{}) {
		return t.cost(blocks, t.ByNear[near])
	}
	return t.Cost(blocks)
}

func (t Transfer) cost(blocks int, l Link) time.Duration {
	d := l.Latency
	if l.Bandwidth > 0 && blocks > 0 {
		d += time.Duration(float64(blocks) * float64(t.BlockBytes) / l.Bandwidth * float64(time.Second))
	}
	return d
}

func (t Transfer) holdTimeout() time.Duration {
	if t.HoldTimeout <= 0 {
		return DefaultHoldTimeout
	}
	return t.HoldTimeout
}

// KVTransferParams is vLLM's kv_transfer_params as the NIXL connector
// reads and writes them: a prefill-only request says do_remote_decode; its
// answer, and the decode request that follows, say do_remote_prefill and
// name the prefill engine and the blocks it holds.
type KVTransferParams struct {
	DoRemoteDecode  bool   `json:"do_remote_decode"`
	DoRemotePrefill bool   `json:"do_remote_prefill"`
	RemoteEngineID  string `json:"remote_engine_id,omitempty"`
	RemoteRequestID string `json:"remote_request_id,omitempty"`
	RemoteHost      string `json:"remote_host,omitempty"`
	RemotePort      int    `json:"remote_port,omitempty"`
	// RemoteBlockIDs are the prefill engine's block ids, one list per KV
	// cache group in vLLM's hybrid form or a flat list.
	RemoteBlockIDs json.RawMessage `json:"remote_block_ids,omitempty"`
	TPSize         int             `json:"tp_size,omitempty"`
}

// errKVParams is wrapped by every kv_transfer_params refusal.
var errKVParams = errors.New("kv_transfer_params")

// maxRemoteID bounds the engine and request ids a decode request names.
const maxRemoteID = 256

// ParseKVTransferParams reads a request's kv_transfer_params; null or
// absent is nil. Fields sent as null (llm-d's sidecar sends every one) are
// their zero values.
func ParseKVTransferParams(raw json.RawMessage) (*KVTransferParams, error) {
	if isNull(raw) {
		return nil, nil
	}
	var w struct {
		DoRemoteDecode  *bool           `json:"do_remote_decode"`
		DoRemotePrefill *bool           `json:"do_remote_prefill"`
		RemoteEngineID  *string         `json:"remote_engine_id"`
		RemoteRequestID *string         `json:"remote_request_id"`
		RemoteHost      *string         `json:"remote_host"`
		RemotePort      json.RawMessage `json:"remote_port"`
		RemoteBlockIDs  json.RawMessage `json:"remote_block_ids"`
		TPSize          *int            `json:"tp_size"`
	}
	if bytes.TrimSpace(raw)[0] != '{' {
		return nil, fmt.Errorf("%w must be an object", errKVParams)
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return nil, fmt.Errorf("%w: %s", errKVParams, jsonReason(err))
	}
	p := &KVTransferParams{}
	p.DoRemoteDecode = w.DoRemoteDecode != nil && *w.DoRemoteDecode
	p.DoRemotePrefill = w.DoRemotePrefill != nil && *w.DoRemotePrefill
	if p.DoRemoteDecode && p.DoRemotePrefill {
		return nil, fmt.Errorf("%w: do_remote_decode and do_remote_prefill cannot both be true", errKVParams)
	}
	for _, f := range []struct {
		v    *string
		into *string
		name string
	}{{w.RemoteEngineID, &p.RemoteEngineID, "remote_engine_id"}, {w.RemoteRequestID, &p.RemoteRequestID, "remote_request_id"}, {w.RemoteHost, &p.RemoteHost, "remote_host"}} {
		if f.v == nil {
			continue
		}
		if len(*f.v) > maxRemoteID {
			return nil, fmt.Errorf("%w: %s is longer than %d bytes", errKVParams, f.name, maxRemoteID)
		}
		*f.into = *f.v
	}
	if !isNull(w.RemotePort) {
		// vLLM writes the port as a number; routers have sent it as a string.
		s := string(bytes.Trim(bytes.TrimSpace(w.RemotePort), `"`))
		port, err := strconv.Atoi(s)
		if err != nil || port < 1 || port > math.MaxUint16 {
			return nil, fmt.Errorf("%w: remote_port must be a port number, got %s", errKVParams, Echo(string(w.RemotePort)))
		}
		p.RemotePort = port
	}
	if !isNull(w.RemoteBlockIDs) {
		if bytes.TrimSpace(w.RemoteBlockIDs)[0] != '[' {
			return nil, fmt.Errorf("%w: remote_block_ids must be an array", errKVParams)
		}
		p.RemoteBlockIDs = w.RemoteBlockIDs
	}
	if w.TPSize != nil {
		p.TPSize = *w.TPSize
	}
	if p.DoRemotePrefill && (p.RemoteRequestID == "" || p.RemoteHost == "" || p.RemotePort == 0) {
		return nil, fmt.Errorf("%w: do_remote_prefill needs remote_request_id, remote_host and remote_port (the prefill answer's kv_transfer_params)", errKVParams)
	}
	return p, nil
}

// Echo quotes a client's value in an error, cut to 64 bytes.
func Echo(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}

// PDStats are an engine's counters of the P/D contract.
type PDStats struct {
	// Held is the prefill-only requests whose blocks the engine keeps for
	// a remote decode now; Pulled, Aborted and Expired count how holds
	// ended: pulled by a decode engine, released when told, or timed out.
	Held, Pulled, Aborted, Expired int64
	// RemotePrefills counts decode requests that named a prefill engine;
	// PulledBlocks the blocks they pulled, LocalBlocks the leading blocks
	// they found cached at home instead; LoadFailures the pulls that
	// failed (the prompt then recomputed locally, vLLM's recompute policy).
	RemotePrefills, PulledBlocks, LocalBlocks, LoadFailures int64
	// TransferTime is the pulls' simulated cost, summed.
	TransferTime time.Duration
	// PullsByNear counts the pulls by how near the prefill engine was
	// (indexed by Near; NearNone also for places unknown).
	PullsByNear [NearNone + 1]int64
	// Pulling is the decode requests waiting on their transfer now.
	Pulling int64
}

// pdState is a server's side of the P/D contract: the holds it keeps as a
// prefill engine, its counters.
type pdState struct {
	mu     sync.Mutex
	holds  map[string]*kvHold
	next   uint64
	stats  PDStats
	client *http.Client
}

// kvHold is a finished prefill-only request's blocks, kept in the pool
// under its request id until pulled, aborted or timed out.
type kvHold struct {
	poolID string
	blocks int
	timer  *time.Timer
}

// PDStats returns the engine's P/D counters.
func (s *Server) PDStats() PDStats {
	s.pd.mu.Lock()
	defer s.pd.mu.Unlock()
	st := s.pd.stats
	st.Held = int64(len(s.pd.holds))
	return st
}

// EngineID is the engine's id in kv_transfer_params (remote_engine_id).
func (s *Server) EngineID() string { return s.r.eng.instance }

// pdRoutes adds the connector's side channel: a decode engine's pull of a
// held request's blocks and the release of a hold nobody will pull. They
// stand for NIXL's transfer and its notifications; vLLM serves them on its
// side-channel port, the sim on its HTTP port (the remote_port it names).
func (s *Server) pdRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /kv_transfer/pull", s.kvPull)
	mux.HandleFunc("POST /kv_transfer/abort", s.kvAbort)
}

// sideChannelBody is the body of both side-channel calls.
type sideChannelBody struct {
	RemoteRequestID string `json:"remote_request_id"`
	Blocks          int    `json:"blocks"`
}

func readSideChannel(w http.ResponseWriter, r *http.Request) (sideChannelBody, bool) {
	var b sideChannelBody
	raw, err := io.ReadAll(io.LimitReader(r.Body, 4<<10))
	if err == nil {
		err = json.Unmarshal(raw, &b)
	}
	if err != nil || b.RemoteRequestID == "" {
		writeError(w, http.StatusBadRequest, "kv_transfer: the body must be {\"remote_request_id\": ...}")
		return b, false
	}
	return b, true
}

func (s *Server) kvPull(w http.ResponseWriter, r *http.Request) {
	b, ok := readSideChannel(w, r)
	if !ok {
		return
	}
	h := s.takeHold(b.RemoteRequestID)
	if h == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("kv_transfer: no blocks held for %s (released or timed out)", Echo(b.RemoteRequestID)))
		return
	}
	if b.Blocks > h.blocks {
		// Pulled all the same, as far as the hold goes; the puller learns how far.
		b.Blocks = h.blocks
	}
	s.endHold(h, func(st *PDStats) { st.Pulled++ })
	writeJSON(w, http.StatusOK, map[string]any{"blocks": b.Blocks})
}

func (s *Server) kvAbort(w http.ResponseWriter, r *http.Request) {
	b, ok := readSideChannel(w, r)
	if !ok {
		return
	}
	h := s.takeHold(b.RemoteRequestID)
	if h == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("kv_transfer: no blocks held for %s", Echo(b.RemoteRequestID)))
		return
	}
	s.endHold(h, func(st *PDStats) { st.Aborted++ })
	writeJSON(w, http.StatusOK, map[string]any{"released": true})
}

// hold keeps a finished prefill-only sequence's blocks for a remote decode
// and returns the kv_transfer_params the answer carries.
func (s *Server) hold(seq *Seq) map[string]any {
	bs := s.r.eng.cfg.Pool.BlockSize
	blocks := (seq.PromptTokens() + bs - 1) / bs
	s.pd.mu.Lock()
	if s.pd.holds == nil {
		s.pd.holds = map[string]*kvHold{}
	}
	s.pd.next++
	id := fmt.Sprintf("%s-xfer-%d", s.r.eng.cfg.Pod, s.pd.next)
	h := &kvHold{poolID: seq.req.ID, blocks: blocks}
	s.pd.holds[id] = h
	h.timer = time.AfterFunc(s.r.eng.cfg.Transfer.holdTimeout(), func() {
		if h := s.takeHold(id); h != nil {
			s.endHold(h, func(st *PDStats) { st.Expired++ })
		}
	})
	s.pd.mu.Unlock()
	ids := make([]int, blocks)
	for i := range ids {
		ids[i] = i
	}
	host, port, _ := net.SplitHostPort(s.r.eng.cfg.Address)
	portN, _ := strconv.Atoi(port)
	return map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": ids, "remote_engine_id": s.EngineID(), "remote_request_id": id,
		"remote_host": host, "remote_port": portN, "tp_size": 1,
	}
}

// takeHold removes and returns the hold id names, nil if there is none.
func (s *Server) takeHold(id string) *kvHold {
	s.pd.mu.Lock()
	defer s.pd.mu.Unlock()
	h := s.pd.holds[id]
	delete(s.pd.holds, id)
	return h
}

// endHold gives a hold's blocks back to the pool, where they stay cached.
func (s *Server) endHold(h *kvHold, count func(*PDStats)) {
	h.timer.Stop()
	_ = s.r.eng.release(h.poolID)
	s.pd.mu.Lock()
	count(&s.pd.stats)
	s.pd.mu.Unlock()
}

// releaseKept gives back the blocks of a prefill-only sequence whose
// client went away: vLLM frees an aborted request's blocks at once. The
// sequence runs on in the core; its blocks are freed when it ends.
func (s *Server) releaseKept(seq *Seq) {
	go func() {
		for t := range seq.Tokens {
			if t.Done && t.Err == nil {
				_ = s.r.eng.release(seq.req.ID)
				s.pd.mu.Lock()
				s.pd.stats.Aborted++
				s.pd.mu.Unlock()
			}
		}
	}()
}

// remotePrefill is a decode request's pull: the full blocks of the prompt
// the engine lacks are fetched from the prefill engine its params name,
// at the transfer's cost, and stored in its pool (published as stored, as
// vLLM's received blocks are). A failed pull leaves the prompt to be
// computed here. It returns false when ctx ended first (the request is
// then aborted, and the prefill engine told).
func (s *Server) remotePrefill(ctx context.Context, p *KVTransferParams, req blockpool.Request) bool {
	eng := s.r.eng
	bs := eng.cfg.Pool.BlockSize
	full := len(req.Tokens) / bs
	local := min(eng.Held(req).Blocks, full)
	lack := full - local
	near := NearNone
	if eng.cfg.PlaceOf != nil {
		if from, ok := eng.cfg.PlaceOf(net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort))); ok {
			near = eng.cfg.Place.NearTo(from)
		}
	}
	cost := eng.cfg.Transfer.CostAt(lack, near)
	t := time.NewTimer(cost)
	defer t.Stop()
	s.pd.mu.Lock()
	s.pd.stats.Pulling++
	s.pd.mu.Unlock()
	defer func() {
		s.pd.mu.Lock()
		s.pd.stats.Pulling--
		s.pd.mu.Unlock()
	}()
	select {
	case <-ctx.Done():
		s.notifyPrefill(p, "abort", 0)
		return false
	case <-t.C:
	}
	ok := s.notifyPrefill(p, "pull", lack) == nil
	if ok && lack > 0 {
		// The received blocks, stored as a computed prompt's are.
		recv := req
		recv.ID = ""
		recv.Tokens = req.Tokens[:full*bs]
		if _, err := eng.Serve(recv); err != nil {
			ok = false
		}
	}
	s.pd.mu.Lock()
	defer s.pd.mu.Unlock()
	s.pd.stats.RemotePrefills++
	s.pd.stats.LocalBlocks += int64(local)
	s.pd.stats.TransferTime += cost
	s.pd.stats.PullsByNear[near]++
	if ok {
		s.pd.stats.PulledBlocks += int64(lack)
	} else {
		s.pd.stats.LoadFailures++
	}
	return true
}

// notifyPrefill calls the prefill engine's side channel: "pull" when the
// blocks are read, "abort" when they never will be.
func (s *Server) notifyPrefill(p *KVTransferParams, op string, blocks int) error {
	body, _ := json.Marshal(sideChannelBody{RemoteRequestID: p.RemoteRequestID, Blocks: blocks})
	addr := net.JoinHostPort(p.RemoteHost, strconv.Itoa(p.RemotePort))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/kv_transfer/"+op, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	s.pd.mu.Lock()
	if s.pd.client == nil {
		s.pd.client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}}
	}
	c := s.pd.client
	s.pd.mu.Unlock()
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("kv_transfer %s at %s: %w", op, addr, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kv_transfer %s at %s: status %d", op, addr, resp.StatusCode)
	}
	return nil
}

// refusalNotifier tells the prefill engine a decode request named when
// that request is refused (a 4xx) before it pulls.
type refusalNotifier struct {
	http.ResponseWriter
	notify func()
}

func (w *refusalNotifier) WriteHeader(code int) {
	if code >= 400 && code < 500 {
		w.notify()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *refusalNotifier) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// closeIdle closes the side channel's idle connections.
func (p *pdState) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.client != nil {
		p.client.CloseIdleConnections()
	}
}

// Labels are the engine's pod labels a discovery source carries: its
// llm-d.ai/role when it has one.
func (cfg EngineConfig) Labels() map[string]string {
	if cfg.Role == "" {
		return nil
	}
	return map[string]string{RoleLabel: cfg.Role}
}
