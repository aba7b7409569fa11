package extproc_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/requestpath/director"
)

// BenchmarkDecodedBytesPerBodyByte measures what the director allocates
// routing a request, per byte of its body, for the three shapes a prompt
// comes in: the multiple openai.DecodedBytesPerBodyByte charges.
func BenchmarkDecodedBytesPerBodyByte(b *testing.B) {
	d := plainDirector(b, 2)
	words := strings.Repeat("the quick brown fox jumps over the lazy dog ", 20000)
	ids := make([]uint32, 200000)
	for i := range ids {
		ids[i] = uint32(i*7919) % 150000
	}
	shortIDs := make([]uint32, 400000)
	for i := range shortIDs {
		shortIDs[i] = uint32(i % 10)
	}
	msgs := make([]map[string]string, 0, 2000)
	for i := range 2000 {
		msgs = append(msgs, map[string]string{"role": []string{"user", "assistant"}[i%2], "content": words[:400]})
	}
	// Messages and Responses bodies become chat messages as well: Anthropic
	// content blocks and Responses items, the shapes agents send.
	blocks := make([]map[string]any, 0, 2000)
	items := make([]map[string]any, 0, 2000)
	for i := range 2000 {
		text := []map[string]string{{"type": "text", "text": words[:400]}}
		blocks = append(blocks, map[string]any{"role": []string{"user", "assistant"}[i%2], "content": text})
		if i%2 == 0 {
			items = append(items, map[string]any{"role": "user", "content": words[:400]})
		} else {
			items = append(items, map[string]any{"type": "message", "role": "assistant", "content": []map[string]string{{"type": "output_text", "text": words[:400]}}})
		}
	}
	shapes := []struct {
		name, path string
		body       any
	}{
		{"text", "/v1/completions", map[string]any{"model": "m", "prompt": words}},
		{"token-ids", "/v1/completions", map[string]any{"model": "m", "prompt": ids}},
		{"one-digit-token-ids", "/v1/completions", map[string]any{"model": "m", "prompt": shortIDs}},
		{"chat", "/v1/chat/completions", map[string]any{"model": "m", "messages": msgs}},
		{"messages", "/v1/messages", map[string]any{"model": "m", "max_tokens": 8, "messages": blocks}},
		{"responses", "/v1/responses", map[string]any{"model": "m", "input": items}},
		{"generate", "/inference/v1/generate", map[string]any{"token_ids": ids}},
	}
	for _, s := range shapes {
		b.Run(s.name, func(b *testing.B) {
			body, _ := json.Marshal(s.body)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for b.Loop() {
				in := &director.Input{Path: s.path, Headers: map[string]string{}, Body: body}
				p, err := d.HandleRequest(context.Background(), in)
				if err != nil {
					b.Fatal(err)
				}
				d.HandleResponse(p, director.Served{Status: 200})
			}
			runtime.ReadMemStats(&after)
			b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/float64(b.N)/float64(len(body)), "alloc-B/body-B")
			b.ReportMetric(float64(len(body)), "body-B")
		})
	}
}
