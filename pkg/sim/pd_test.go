package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// storedSink counts the blocks an engine publishes as stored on GPU.
type storedSink struct {
	mu     sync.Mutex
	stored int
}

func (s *storedSink) Apply(_ events.Origin, b *events.Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range b.Events {
		if e.Kind == events.KindBlockStored && e.Medium == events.TierGPU {
			s.stored += len(e.BlockHashes)
		}
	}
}
func (s *storedSink) Uncertain(events.Stream, events.Reason) {}
func (s *storedSink) Restart(events.Stream)                  {}

func (s *storedSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stored
}

// startRole runs one engine of role on loopback, with its stored blocks
// counted.
func startRole(t *testing.T, pod, role string, tr Transfer) (*Server, *storedSink) {
	t.Helper()
	return startRoleTimed(t, pod, role, tr, Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 4})
}

func startRoleTimed(t *testing.T, pod, role string, tr Transfer, tm Timing) (*Server, *storedSink) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sink := &storedSink{}
	eng := NewEngine(EngineConfig{Pod: pod, Address: ln.Addr().String(), Model: "m", Role: role, Transfer: tr, Sink: sink,
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 512, CPUBlocks: 64, Seed: 1}}, nil)
	s := NewServer(NewCore(eng, tm), ln)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	go func() { done <- s.Core().Run(ctx) }()
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	})
	return s, sink
}

// waitUntil polls cond until it holds, failing with its last error.
func waitUntil(t *testing.T, what string, cond func() error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err = cond(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

// prefillLeg sends a prefill-only request as llm-d's sidecar does and
// returns the kv_transfer_params of its answer.
func prefillLeg(t *testing.T, p *Server, prompt string) json.RawMessage {
	t.Helper()
	code, body := post(t, p, "/v1/completions", `{"model":"m","prompt":"`+prompt+`","max_tokens":1,"stream":false,`+
		`"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`)
	if code != http.StatusOK {
		t.Fatalf("prefill leg: status %d: %s", code, body)
	}
	var resp struct {
		KV    json.RawMessage `json:"kv_transfer_params"`
		Usage usage           `json:"usage"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Usage.CompletionTokens != 1 {
		t.Errorf("prefill leg generated %d tokens, want 1", resp.Usage.CompletionTokens)
	}
	return resp.KV
}

func decodeLeg(t *testing.T, d *Server, prompt string, kv json.RawMessage) (int, usage, string) {
	t.Helper()
	code, body := post(t, d, "/v1/completions", `{"model":"m","prompt":"`+prompt+`","max_tokens":4,"kv_transfer_params":`+string(kv)+`}`)
	var resp struct{ Usage usage }
	_ = json.Unmarshal(body, &resp)
	return code, resp.Usage, string(body)
}

const pdPrompt = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty twentyone twentytwo"

func TestAPrefillLegHoldsItsBlocksUntilTheDecodeEnginePullsThem(t *testing.T) {
	t.Parallel()
	tr := Transfer{Latency: time.Millisecond, BlockBytes: 1 << 20, Bandwidth: 1 << 30}
	p, pSink := startRole(t, "p", RolePrefill, tr)
	d, dSink := startRole(t, "d", RoleDecode, tr)

	kv := prefillLeg(t, p, pdPrompt)
	var params KVTransferParams
	if err := json.Unmarshal(kv, &params); err != nil {
		t.Fatalf("kv_transfer_params %s: %v", kv, err)
	}
	host, port, _ := net.SplitHostPort(p.Addr())
	if !params.DoRemotePrefill || params.DoRemoteDecode || params.RemoteHost != host || fmt.Sprint(params.RemotePort) != port ||
		params.RemoteEngineID != p.EngineID() || params.RemoteRequestID == "" {
		t.Fatalf("kv_transfer_params %s do not name the prefill engine and its hold", kv)
	}
	if st := p.PDStats(); st.Held != 1 || p.Core().Engine().Usage() == 0 {
		t.Fatalf("after the prefill leg: %+v, usage %v: want the blocks held", st, p.Core().Engine().Usage())
	}
	// The step's batch is published once the step ends, which may be
	// after its answer went out.
	waitUntil(t, "the prefill engine published the prompt's blocks", func() error {
		if got := pSink.count(); got != 5 { // 22 tokens: 5 full blocks of 4
			return fmt.Errorf("%d stored blocks published, want 5", got)
		}
		return nil
	})

	code, u, body := decodeLeg(t, d, pdPrompt, kv)
	if code != http.StatusOK {
		t.Fatalf("decode leg: status %d: %s", code, body)
	}
	if u.CompletionTokens != 4 || u.PromptTokensDetails.CachedTokens != 20 {
		t.Errorf("decode usage %+v: want 4 tokens out and the 20 pulled tokens cached", u)
	}
	if st := p.PDStats(); st.Held != 0 || st.Pulled != 1 || p.Core().Engine().Usage() != 0 {
		t.Errorf("after the pull the prefill engine has %+v, usage %v: want nothing held", st, p.Core().Engine().Usage())
	}
	st := d.PDStats()
	if st.RemotePrefills != 1 || st.PulledBlocks != 5 || st.LocalBlocks != 0 || st.LoadFailures != 0 || st.TransferTime != tr.Cost(5) {
		t.Errorf("decode engine stats %+v: want one pull of 5 blocks costing %v", st, tr.Cost(5))
	}
	waitUntil(t, "the decode engine published the blocks it received", func() error {
		if got := dSink.count(); got != 5 {
			return fmt.Errorf("%d stored blocks published, want 5", got)
		}
		return nil
	})
	if h := d.Core().Engine().Held(blockpool.Request{Tokens: Tokenize(pdPrompt)}); h.Blocks != 5 {
		t.Errorf("the decode engine holds %d blocks of the prompt, want 5", h.Blocks)
	}
}

func TestADecodeEngineHoldingPartOfThePromptPullsOnlyTheRest(t *testing.T) {
	t.Parallel()
	tr := Transfer{Latency: time.Millisecond, BlockBytes: 1 << 20, Bandwidth: 1 << 30}
	p, _ := startRole(t, "p", RolePrefill, tr)
	d, _ := startRole(t, "d", RoleDecode, tr)
	// The first 3 blocks (12 tokens) are cached on the decode engine.
	head := strings.Join(strings.Fields(pdPrompt)[:13], " ")
	if code, body := post(t, d, "/v1/completions", `{"model":"m","prompt":"`+head+`","max_tokens":1}`); code != http.StatusOK {
		t.Fatalf("warm-up: %d %s", code, body)
	}
	code, _, body := decodeLeg(t, d, pdPrompt, prefillLeg(t, p, pdPrompt))
	if code != http.StatusOK {
		t.Fatalf("decode leg: status %d: %s", code, body)
	}
	if st := d.PDStats(); st.LocalBlocks != 3 || st.PulledBlocks != 2 || st.TransferTime != tr.Cost(2) {
		t.Errorf("decode engine stats %+v: want 3 blocks found locally and 2 pulled", st)
	}
}

func TestHeldBlocksEndWithoutAPull(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// end ends the hold kv names, on prefill engine p (decode engine d).
		end  func(t *testing.T, p, d *Server, kv json.RawMessage)
		want func(PDStats) bool
	}{
		{"an abort on the side channel releases them", func(t *testing.T, p, _ *Server, kv json.RawMessage) {
			var params KVTransferParams
			_ = json.Unmarshal(kv, &params)
			if code, body := post(t, p, "/kv_transfer/abort", `{"remote_request_id":"`+params.RemoteRequestID+`"}`); code != http.StatusOK {
				t.Fatalf("abort: %d %s", code, body)
			}
		}, func(s PDStats) bool { return s.Aborted == 1 }},
		{"a decode request refused before its pull releases them", func(t *testing.T, _, d *Server, kv json.RawMessage) {
			code, body := post(t, d, "/v1/completions", `{"model":"other","prompt":"x","kv_transfer_params":`+string(kv)+`}`)
			if code != http.StatusNotFound {
				t.Fatalf("a decode request for an unknown model: %d %s", code, body)
			}
		}, func(s PDStats) bool { return s.Aborted == 1 }},
		{"the hold timeout releases them", func(*testing.T, *Server, *Server, json.RawMessage) {},
			func(s PDStats) bool { return s.Expired == 1 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tr := Transfer{HoldTimeout: 300 * time.Millisecond}
			if tt.name != "the hold timeout releases them" {
				tr.HoldTimeout = time.Hour
			}
			p, _ := startRole(t, "p", RolePrefill, tr)
			d, _ := startRole(t, "d", RoleDecode, tr)
			kv := prefillLeg(t, p, pdPrompt)
			tt.end(t, p, d, kv)
			waitUntil(t, "the prefill engine holds nothing", func() error {
				if st, u := p.PDStats(), p.Core().Engine().Usage(); st.Held != 0 || u != 0 || !tt.want(st) {
					return fmt.Errorf("stats %+v, usage %v", st, u)
				}
				return nil
			})
			// A pull after the end fails; the decode engine computes the
			// prompt itself, as vLLM's recompute policy does.
			code, u, body := decodeLeg(t, d, pdPrompt, kv)
			if code != http.StatusOK || u.CompletionTokens != 4 {
				t.Fatalf("decode leg after the hold ended: %d %s", code, body)
			}
			if st := d.PDStats(); st.LoadFailures != 1 || st.PulledBlocks != 0 {
				t.Errorf("decode engine stats %+v: want one failed load", st)
			}
		})
	}
}

func TestAPrefillLegWhoseClientLeavesKeepsNothing(t *testing.T) {
	t.Parallel()
	// A prefill slow enough (22 tokens at 20ms) for the client to leave during it.
	p, _ := startRoleTimed(t, "p", RolePrefill, Transfer{HoldTimeout: time.Hour}, Timing{PrefillPerToken: 20 * time.Millisecond, MaxSeqs: 4})
	ctx, cancel := context.WithCancel(context.Background())
	body := `{"model":"m","prompt":"` + pdPrompt + `","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr()+"/v1/completions", strings.NewReader(body))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitUntil(t, "the prefill leg is admitted", func() error {
		if st := p.Core().Stats(); st.Requests == 0 {
			return fmt.Errorf("no request admitted yet")
		}
		return nil
	})
	cancel()
	<-errc
	waitUntil(t, "the prefill engine holds nothing", func() error {
		if st, u := p.PDStats(), p.Core().Engine().Usage(); st.Held != 0 || u != 0 {
			return fmt.Errorf("stats %+v, usage %v", st, u)
		}
		return nil
	})
}

func TestChatPrefillLegsCarryTheTransfer(t *testing.T) {
	t.Parallel()
	p, _ := startRole(t, "p", RolePrefill, Transfer{})
	d, _ := startRole(t, "d", RoleDecode, Transfer{})
	msgs := `"messages":[{"role":"user","content":"` + pdPrompt + `"}]`
	code, body := post(t, p, "/v1/chat/completions", `{"model":"m",`+msgs+`,"max_tokens":1,"max_completion_tokens":1,"stream":false,"kv_transfer_params":{"do_remote_decode":true}}`)
	if code != http.StatusOK {
		t.Fatalf("chat prefill leg: %d %s", code, body)
	}
	var resp struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(body, &resp); err != nil || len(resp.KV) == 0 {
		t.Fatalf("chat prefill answer without kv_transfer_params: %s", body)
	}
	code, body = post(t, d, "/v1/chat/completions", `{"model":"m",`+msgs+`,"max_completion_tokens":3,"stream":true,"kv_transfer_params":`+string(resp.KV)+`}`)
	if code != http.StatusOK {
		t.Fatalf("chat decode leg: %d %s", code, body)
	}
	if res, err := ReadStream(strings.NewReader(string(body)), nil); err != nil || len(strings.Fields(res.Text)) != 3 {
		t.Fatalf("chat decode stream %q: %v", res.Text, err)
	}
	if st := d.PDStats(); st.PulledBlocks == 0 || p.PDStats().Pulled != 1 {
		t.Errorf("decode %+v, prefill %+v: want the chat's blocks pulled", st, p.PDStats())
	}
}

func TestKVTransferParamsAreCheckedAsVLLMChecksThem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, raw string
		ok        bool
	}{
		{"llm-d's sidecar prefill params with nulls", `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`, true},
		{"a prefill answer's params", `{"do_remote_prefill":true,"do_remote_decode":false,"remote_block_ids":[0,1],"remote_engine_id":"e","remote_request_id":"r","remote_host":"10.0.0.1","remote_port":8000,"tp_size":1}`, true},
		{"a port given as a string", `{"do_remote_prefill":true,"remote_request_id":"r","remote_host":"h","remote_port":"8000"}`, true},
		{"both directions", `{"do_remote_prefill":true,"do_remote_decode":true}`, false},
		{"a remote prefill naming no engine", `{"do_remote_prefill":true}`, false},
		{"a port out of range", `{"do_remote_prefill":true,"remote_request_id":"r","remote_host":"h","remote_port":70000}`, false},
		{"block ids that are not an array", `{"remote_block_ids":3}`, false},
		{"not an object", `[1]`, false},
		{"an id too long", `{"remote_engine_id":"` + strings.Repeat("x", 300) + `"}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseKVTransferParams(json.RawMessage(tt.raw))
			if (err == nil) != tt.ok {
				t.Errorf("ParseKVTransferParams(%s) = %v, want ok %v", tt.raw, err, tt.ok)
			}
		})
	}
}

func TestATransferCostsItsLatencyPlusItsBytesOverTheBandwidth(t *testing.T) {
	t.Parallel()
	tr := Transfer{Latency: 2 * time.Millisecond, BlockBytes: 1 << 20, Bandwidth: 1 << 30}
	for blocks, want := range map[int]time.Duration{0: 2 * time.Millisecond, 1024: 1002 * time.Millisecond, 512: 502 * time.Millisecond} {
		if got := tr.Cost(blocks); got != want {
			t.Errorf("Cost(%d) = %v, want %v", blocks, got, want)
		}
	}
	if got := (Transfer{Latency: time.Millisecond, BlockBytes: 1 << 20}).Cost(1 << 20); got != time.Millisecond {
		t.Errorf("an unbounded link costs %v, want only its latency", got)
	}
}

func TestADecodeRequestWhoseClientLeavesBeforeItsPullReleasesThePrefillHold(t *testing.T) {
	t.Parallel()
	p, _ := startRole(t, "p", RolePrefill, Transfer{HoldTimeout: time.Hour})
	// A transfer slow enough for the client to leave during it.
	d, _ := startRole(t, "d", RoleDecode, Transfer{Latency: time.Hour})
	kv := prefillLeg(t, p, pdPrompt)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.Addr()+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"`+pdPrompt+`","max_tokens":4,"kv_transfer_params":`+string(kv)+`}`))
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	waitUntil(t, "the decode request is in its transfer", func() error {
		if st := d.PDStats(); st.Pulling != 1 {
			return fmt.Errorf("%d pulling", st.Pulling)
		}
		return nil
	})
	cancel()
	<-errc
	waitUntil(t, "the prefill engine released its hold", func() error {
		if st, u := p.PDStats(), p.Core().Engine().Usage(); st.Held != 0 || st.Aborted != 1 || u != 0 {
			return fmt.Errorf("stats %+v, usage %v", st, u)
		}
		return nil
	})
	if st := d.Core().Stats(); st.Requests != 0 {
		t.Errorf("the decode engine admitted %d requests whose client left during the transfer", st.Requests)
	}
}
