package sim

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// The engine reads every prompt form vLLM's completions API accepts, and
// the generation options, as vLLM does.
func TestCompletionRequestsReadAsVLLMReadsThem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body string
		want       genRequest
	}{
		{"a text prompt", `{"model":"m","prompt":"a b c"}`,
			genRequest{Model: "m", Prompt: "a b c", AddSpecialTokens: true, MaxTokens: -1}},
		{"a batch of text prompts, served as its first", `{"model":"m","prompt":["a b","c d"]}`,
			genRequest{Model: "m", Prompt: "a b", AddSpecialTokens: true, MaxTokens: -1}},
		{"token ids", `{"model":"m","prompt":[1, 2 ,4294967295],"add_special_tokens":false}`,
			genRequest{Model: "m", TokenIDs: []uint32{1, 2, 4294967295}, MaxTokens: -1}},
		{"a batch of token id lists, served as its first", `{"model":"m","prompt":[[5,6],[7]]}`,
			genRequest{Model: "m", TokenIDs: []uint32{5, 6}, AddSpecialTokens: true, MaxTokens: -1}},
		{"max_completion_tokens before max_tokens", `{"model":"m","prompt":"x","max_tokens":9,"max_completion_tokens":3}`,
			genRequest{Model: "m", Prompt: "x", AddSpecialTokens: true, MaxTokens: 3}},
		{"a null max_tokens is no limit given", `{"model":"m","prompt":"x","max_tokens":null}`,
			genRequest{Model: "m", Prompt: "x", AddSpecialTokens: true, MaxTokens: -1}},
		{"streaming with usage, a salt, and fields the engine ignores", `{"model":"m","prompt":"x","stream":true,"stream_options":{"include_usage":true},"cache_salt":"s","temperature":0.2,"n":1}`,
			genRequest{Model: "m", Prompt: "x", AddSpecialTokens: true, MaxTokens: -1, Stream: true, IncludeUsage: true, CacheSalt: "s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseRequest([]byte(tc.body), false)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(*got, tc.want) {
				t.Errorf("got %+v, want %+v", *got, tc.want)
			}
		})
	}
}

// A chat's messages reach the chat template as sent, with vLLM's defaults
// for the template's options.
func TestChatRequestsReadAsVLLMReadsThem(t *testing.T) {
	t.Parallel()
	msgs := `[{"role":"system","content":null},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"x"}}]}]`
	r, err := parseRequest([]byte(`{"model":"m","messages":`+msgs+`,"tools":[{"type":"function"}],"max_tokens":4}`), true)
	if err != nil {
		t.Fatal(err)
	}
	c := r.Messages
	if !r.Chat || r.AddSpecialTokens || r.MaxTokens != 4 || c == nil || string(c.Messages) != msgs || string(c.Tools) != `[{"type":"function"}]` ||
		!c.AddGenerationPrompt || c.ContinueFinalMessage {
		t.Fatalf("got %+v, chat %+v", r, c)
	}
	r, err = parseRequest([]byte(`{"model":"m","messages":[{"role":"assistant","content":"Once"}],"continue_final_message":true}`), true)
	if err != nil || !r.Messages.ContinueFinalMessage {
		t.Fatalf("continuing a final message with the default add_generation_prompt: %+v, %v", r, err)
	}
	text, err := Words{}.RenderChat(r.Messages)
	if err != nil || !strings.HasSuffix(text, "Once\n") {
		t.Errorf("a continued final message renders as %q (%v); it must end the prompt", text, err)
	}
}

// Whatever vLLM refuses with a 400, the engine refuses with a reason.
func TestRequestsVLLMRefusesAreRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body string
		chat       bool
		reason     string
	}{
		{"not JSON", `{"model":`, false, "not valid JSON"},
		{"not an object", `[1]`, false, "JSON object"},
		{"no model", `{"prompt":"x"}`, false, "model is required"},
		{"a model that is not a string", `{"model":3,"prompt":"x"}`, false, "model"},
		{"no prompt", `{"model":"m"}`, false, "prompt is required"},
		{"prompt embeddings", `{"model":"m","prompt_embeds":"AAAA"}`, false, "prompt_embeds"},
		{"a prompt that is a number", `{"model":"m","prompt":3}`, false, "prompt must be"},
		{"an empty prompt array", `{"model":"m","prompt":[]}`, false, "empty"},
		{"an empty token id list", `{"model":"m","prompt":[[]]}`, false, "empty array of token ids"},
		{"a negative token id", `{"model":"m","prompt":[1,-2]}`, false, "prompt[1]"},
		{"a token id past uint32", `{"model":"m","prompt":[4294967296]}`, false, "prompt[0]"},
		{"a fractional token id", `{"model":"m","prompt":[1.5]}`, false, "prompt[0]"},
		{"strings and ids mixed", `{"model":"m","prompt":["a",1]}`, false, "prompt[1]"},
		{"zero max_tokens", `{"model":"m","prompt":"x","max_tokens":0}`, false, "max_tokens must be at least 1"},
		{"a max_tokens that is not an integer", `{"model":"m","prompt":"x","max_tokens":"many"}`, false, "max_tokens"},
		{"stream_options without streaming", `{"model":"m","prompt":"x","stream_options":{"include_usage":true}}`, false, "stream_options"},
		{"an empty cache_salt", `{"model":"m","prompt":"x","cache_salt":""}`, false, "cache_salt"},
		{"no messages", `{"model":"m"}`, true, "messages is required"},
		{"empty messages", `{"model":"m","messages":[]}`, true, "messages is empty"},
		{"a message that is not an object", `{"model":"m","messages":[1]}`, true, "messages[0]"},
		{"a message without a role", `{"model":"m","messages":[{"content":"x"}]}`, true, "role is required"},
		{"content that is a number", `{"model":"m","messages":[{"role":"user","content":1}]}`, true, "content must be"},
		{"a text part without text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, true, "content[0]"},
		{"both generation prompt and continuation", `{"model":"m","messages":[{"role":"user","content":"x"}],"add_generation_prompt":true,"continue_final_message":true}`, true, "cannot both"},
		{"tools that are not an array", `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":{}}`, true, "tools must be an array"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := parseRequest([]byte(tc.body), tc.chat)
			if !errors.Is(err, errBadRequest) || !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %v, want a bad request saying %q", err, tc.reason)
			}
		})
	}
}

// FuzzParseRequest: any body is read or refused as a bad request; what is
// read holds the parser's promises, and a chat's messages render.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"a b c","max_tokens":2}`,
		`{"model":"m","prompt":[1,2,3],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":[[1],[2,3]]}`,
		`{"model":"m","prompt":["a","b"],"cache_salt":"s"}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"},{"image_url":{}}]}],"tools":[],"max_completion_tokens":3}`,
		`{"model":"m","messages":[{"role":"assistant","content":"x","tool_calls":[{"id":"1"}]}],"continue_final_message":true}`,
		`{"model":"m","prompt":null,"prompt_embeds":""}`,
		`[]`, `null`, `{"model":"m","prompt":[-1]}`,
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		r, err := parseRequest([]byte(body), chat)
		if err != nil {
			if !errors.Is(err, errBadRequest) {
				t.Fatalf("%q: error %v is not a bad request", body, err)
			}
			return
		}
		if r.Chat != chat || (r.MaxTokens != -1 && r.MaxTokens < 1) || (r.IncludeUsage && !r.Stream) {
			t.Fatalf("%q: read as %+v", body, r)
		}
		if chat {
			if r.Messages == nil {
				t.Fatalf("%q: a chat without messages was read", body)
			}
			if _, err := (Words{}).RenderChat(r.Messages); err != nil {
				t.Fatalf("%q: checked messages do not render: %v", body, err)
			}
		} else if r.TokenIDs == nil && r.Prompt == "" && !strings.Contains(body, `"prompt"`) {
			t.Fatalf("%q: a completion without a prompt was read", body)
		}
	})
}
