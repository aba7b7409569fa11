package openai

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
)

const billing = `{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli; cch=694d6;"}`

var messagesSeeds = []string{
	`{"model":"m","max_tokens":64,"system":[` + billing + `,{"type":"text","text":"You are Claude Code."}],"messages":[{"role":"user","content":"hi"}]}`,
	`{"model":"m","max_tokens":64,"system":"plain system","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"hmm","signature":"s"},{"type":"text","text":"let me look"},{"type":"tool_use","id":"toolu_1","name":"grep","input":{"pattern":"x","path":"."}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"found"},{"type":"text","text":"twice"}]},{"type":"text","text":"go on"}]}],"tools":[{"name":"grep","description":"search","input_schema":{"type":"object","properties":{"pattern":{"type":"string"}}}}],"stream":true}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AAAA"}}]}]}`,
	`{"model":"m","messages":[{"role":"system","content":"inline"},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]}]}`,
	`{"model":"m","messages":[{"role":"assistant","content":[{"type":"tool_result","content":"r"},{"type":"redacted_thinking","data":"x"}]}]}`,
	`{"model":"m","messages":[]}`,
	`{"model":"m","messages":[{"role":"user","content":[]}]}`,
	`{"model":"m","messages":[{"role":"robot","content":"x"}]}`,
}

var responsesSeeds = []string{
	`{"model":"m","input":"hello"}`,
	`{"model":"m","instructions":"Be brief.","input":[{"role":"user","content":"weather?"},{"type":"reasoning","id":"rs_1","summary":[],"content":[{"type":"reasoning_text","text":"call the tool"}]},{"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},{"type":"function_call_output","call_id":"call_1","output":"sunny"},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is sunny."}],"status":"completed"},{"type":"message","role":"user","content":[{"type":"input_text","text":"and tomorrow?"}]}],"tools":[{"type":"function","name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true},{"type":"web_search"}]}`,
	`{"model":"m","previous_response_id":"resp_1","input":"more"}`,
	`{"input":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"The best answer is"}],"status":"incomplete"}]}`,
	`{"input":[{"type":"reasoning","encrypted_content":"xyz","summary":[]}]}`,
	`{"input":[{"type":"web_search_call","id":"ws"}]}`,
	`{"input":7}`,
}

func TestMessagesBecomeTheChatVLLMRenders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		body      string
		o         ParseOptions
		messages  string
		tools     string
		multimode bool
	}{
		{"the billing header block is dropped by default", messagesSeeds[0], ParseOptions{},
			`[{"role":"system","content":"You are Claude Code."},{"role":"user","content":"hi"}]`, "", false},
		{"the billing header block is kept for servers that keep it", messagesSeeds[0], ParseOptions{KeepBillingHeader: true},
			`[{"role":"system","content":"x-anthropic-billing-header: cc_version=2.1.37.3a3; cc_entrypoint=cli; cch=694d6;You are Claude Code."},{"role":"user","content":"hi"}]`, "", false},
		{"thinking, tool use and tool results become reasoning, tool calls and tool messages", messagesSeeds[1], ParseOptions{},
			`[{"role":"system","content":"plain system"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},` +
				`{"role":"assistant","content":"let me look","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"grep","arguments":{"pattern":"x","path":"."}}}],"reasoning":"hmm","reasoning_content":"hmm"},` +
				`{"role":"tool","content":"found\ntwice","tool_call_id":"toolu_1"},{"role":"user","content":"go on"}]`,
			`[{"type":"function","function":{"name":"grep","description":"search","parameters":{"type":"object","properties":{"pattern":{"type":"string"}}},"defer_loading":null}}]`, false},
		{"an image makes the prefix one text cannot key", messagesSeeds[2], ParseOptions{},
			`[{"role":"user","content":[{"type":"image_url"}]}]`, "", true},
		{"system messages join the system prompt; a user message of tool results alone leaves only them", messagesSeeds[3], ParseOptions{},
			`[{"role":"system","content":"inline"},{"role":"tool","content":"","tool_call_id":"t"}]`, "", false},
		{"an assistant's tool result is text", messagesSeeds[4], ParseOptions{},
			`[{"role":"assistant","content":"Tool result: r"}]`, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
				req, err := ParseRequestWith(path, []byte(tc.body), nil, tc.o)
				if err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				if req.Chat == nil || string(req.Chat.Messages) != tc.messages {
					t.Fatalf("%s: messages\n%s\nwant\n%s", path, req.Chat.Messages, tc.messages)
				}
				if string(req.Chat.Tools) != tc.tools || !req.Chat.AddGenerationPrompt || req.NoReproduciblePrefix != tc.multimode {
					t.Fatalf("%s: tools %s, add_generation_prompt %v, multimodal %v", path, req.Chat.Tools, req.Chat.AddGenerationPrompt, req.NoReproduciblePrefix)
				}
			}
		})
	}
	for i, body := range messagesSeeds[5:] {
		if _, err := ParseRequest("/v1/messages", []byte(body)); err == nil {
			t.Errorf("seed %d accepted: %s", i+5, body)
		}
	}
}

func TestResponsesBecomeTheChatVLLMRenders(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body, messages, tools string
		inexact                     string
		continueFinal, multimodal   bool
	}{
		{"a string input is one user message", responsesSeeds[0], `[{"role":"user","content":"hello"}]`, "", "", false, false},
		{"items merge into the assistant turns they continue", responsesSeeds[1],
			`[{"role":"system","content":"Be brief."},{"role":"user","content":"weather?"},` +
				`{"role":"assistant","content":"","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}}],"reasoning":"call the tool","reasoning_content":"call the tool"},` +
				`{"role":"tool","content":"sunny","tool_call_id":"call_1"},{"role":"assistant","content":"It is sunny."},{"role":"user","content":[{"type":"text","text":"and tomorrow?"}]}]`,
			`[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"strict":true}}]`,
			"", false, false},
		{"previous_response_id is matched approximately", responsesSeeds[2], `[{"role":"user","content":"more"}]`, "", "previous_response_id", false, false},
		{"an incomplete final assistant message is continued", responsesSeeds[3], `[{"role":"assistant","content":"The best answer is"}]`, "", "", true, false},
		{"a built-in tool's item is not reproduced", responsesSeeds[5], `[]`, "", "", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			req, err := ParseRequest("/v1/responses", []byte(tc.body))
			if tc.messages == "[]" {
				if err == nil {
					t.Fatalf("accepted a request with nothing to render: %s", req.Chat.Messages)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(req.Chat.Messages) != tc.messages || string(req.Chat.Tools) != tc.tools {
				t.Fatalf("messages\n%s\nwant\n%s\ntools %s want %s", req.Chat.Messages, tc.messages, req.Chat.Tools, tc.tools)
			}
			if req.InexactPrefix != tc.inexact || req.Chat.ContinueFinalMessage != tc.continueFinal || req.Chat.AddGenerationPrompt == tc.continueFinal || req.NoReproduciblePrefix != tc.multimodal {
				t.Fatalf("inexact %q continue %v generation prompt %v multimodal %v", req.InexactPrefix, req.Chat.ContinueFinalMessage, req.Chat.AddGenerationPrompt, req.NoReproduciblePrefix)
			}
		})
	}
	for _, body := range []string{responsesSeeds[4], responsesSeeds[6]} {
		if _, err := ParseRequest("/v1/responses", []byte(body)); err == nil {
			t.Errorf("accepted %s", body)
		}
	}
}

func TestTokenIDsAreTakenAsGiven(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path, body string
		api        request.API
		ids        []uint32
		prompt     string
		special    bool
		maxTokens  int
	}{
		{"/inference/v1/generate", `{"token_ids":[5,6,7],"sampling_params":{"max_tokens":9}}`, request.APIGenerate, []uint32{5, 6, 7}, "", false, 9},
		{"/v1/embeddings", `{"model":"e","input":"some text"}`, request.APIEmbeddings, nil, "some text", true, 0},
		{"/v1/embeddings", `{"model":"e","input":[[1,2],[3]],"add_special_tokens":false}`, request.APIEmbeddings, []uint32{1, 2}, "", false, 0},
	} {
		req, err := ParseRequest(tc.path, []byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if req.API != tc.api || !slices.Equal(req.TokenIDs, tc.ids) || req.Prompt != tc.prompt || req.AddSpecialTokens != tc.special || req.MaxTokens != tc.maxTokens {
			t.Fatalf("%s: api %s ids %v prompt %q special %v max %d", tc.body, req.API, req.TokenIDs, req.Prompt, req.AddSpecialTokens, req.MaxTokens)
		}
	}
	for _, body := range []string{`{"token_ids":[]}`, `{"model":"m"}`, `{"token_ids":[1.5]}`} {
		if _, err := ParseRequest("/inference/v1/generate", []byte(body)); err == nil {
			t.Errorf("generate accepted %s", body)
		}
	}
}
