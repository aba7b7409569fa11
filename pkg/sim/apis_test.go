package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// The engine's Messages and Responses endpoints render the chat vLLM
// converts them to: the same prompt as the equivalent chat, which its own
// /tokenize counts.
func TestMessagesAndResponsesRenderAsTheirChat(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	chat := `{"model":"m","messages":[{"role":"system","content":"you help"},{"role":"user","content":"what is a block"},` +
		`{"role":"assistant","content":"","tool_calls":[{"id":"t1","type":"function","function":{"name":"look","arguments":{"q":"block"}}}]},` +
		`{"role":"tool","content":"a unit of cache","tool_call_id":"t1"},{"role":"user","content":"thanks"}]}`
	code, b := post(t, s, "/tokenize", chat)
	if code != http.StatusOK {
		t.Fatalf("/tokenize: %d %s", code, b)
	}
	var want struct{ Count int }
	_ = json.Unmarshal(b, &want)
	for _, tc := range []struct{ path, body string }{
		{"/v1/messages/count_tokens", `{"model":"m","system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=abc;"},{"type":"text","text":"you help"}],` +
			`"messages":[{"role":"user","content":"what is a block"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"look","input":{"q":"block"}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"a unit of cache"},{"type":"text","text":"thanks"}]}]}`},
	} {
		code, b := post(t, s, tc.path, tc.body)
		var got struct {
			InputTokens int `json:"input_tokens"`
		}
		if code != http.StatusOK || json.Unmarshal(b, &got) != nil || got.InputTokens != want.Count {
			t.Fatalf("%s: %d %s; want %d input tokens, as the chat", tc.path, code, b, want.Count)
		}
	}
}

func TestTheNewAPIsServeFromTheCache(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	long := strings.Repeat("the cat sat on the mat ", 8)
	for _, tc := range []struct {
		name, path, body string
		cached           func(b []byte) (prompt, cached int)
	}{
		{"Messages", "/v1/messages", `{"model":"m","max_tokens":2,"system":"` + long + `","messages":[{"role":"user","content":"hi"}]}`,
			func(b []byte) (int, int) {
				var r struct {
					Usage struct {
						In     int `json:"input_tokens"`
						Cached int `json:"cache_read_input_tokens"`
					}
				}
				_ = json.Unmarshal(b, &r)
				return r.Usage.In + r.Usage.Cached, r.Usage.Cached
			}},
		{"Responses", "/v1/responses", `{"model":"m","max_output_tokens":2,"instructions":"` + long + `","input":"hi"}`,
			func(b []byte) (int, int) {
				var r struct {
					Usage struct {
						In      int `json:"input_tokens"`
						Details struct {
							Cached int `json:"cached_tokens"`
						} `json:"input_tokens_details"`
					}
				}
				_ = json.Unmarshal(b, &r)
				return r.Usage.In, r.Usage.Details.Cached
			}},
		{"generate", "/inference/v1/generate", `{"token_ids":[` + strings.Repeat("7,", 40) + `8],"sampling_params":{"max_tokens":2}}`, chatUsage},
		{"embeddings", "/v1/embeddings", `{"model":"m","input":"` + long + `"}`, chatUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Each its own text: the APIs render alike, and share blocks.
			body := strings.ReplaceAll(tc.body, "the cat", tc.name+" cat")
			var prompts, hits []int
			for range 2 {
				code, b := post(t, s, tc.path, body)
				if code != http.StatusOK {
					t.Fatalf("%d %s", code, b)
				}
				p, c := tc.cached(b)
				prompts, hits = append(prompts, p), append(hits, c)
			}
			// The second is served from the first's blocks: all but the
			// last partial block, and at least one token left to compute.
			if prompts[0] < 16 || hits[0] != 0 || hits[1] < prompts[1]-4 || hits[1] >= prompts[1] {
				t.Fatalf("prompt tokens %v, cached %v: want the second served from the first's blocks", prompts, hits)
			}
		})
	}
}

func chatUsage(b []byte) (int, int) {
	var r struct{ Usage usage }
	_ = json.Unmarshal(b, &r)
	return r.Usage.PromptTokens, r.Usage.PromptTokensDetails.CachedTokens
}

func TestMessagesStreamAsAnthropicEvents(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	code, b := post(t, s, "/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"one two three four five"}]}`)
	if code != http.StatusOK {
		t.Fatalf("%d %s", code, b)
	}
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if name, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			names = append(names, name)
		}
	}
	want := "message_start content_block_start content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != want {
		t.Fatalf("events %v, want %s", names, want)
	}
	code, b = post(t, s, "/v1/messages", `{"model":"m","max_tokens":3,"messages":[]}`)
	var e struct {
		Type  string                `json:"type"`
		Error struct{ Type string } `json:"error"`
	}
	if code != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Type != "error" || e.Error.Type != "invalid_request_error" {
		t.Fatalf("an empty Messages request: %d %s; want 400 in Anthropic's error shape", code, b)
	}
	if code, b := post(t, s, "/v1/responses", `{"model":"m","previous_response_id":"resp_x","input":"hi"}`); code != http.StatusBadRequest || !bytes.Contains(b, []byte("stores no responses")) {
		t.Fatalf("previous_response_id: %d %s", code, b)
	}
}
