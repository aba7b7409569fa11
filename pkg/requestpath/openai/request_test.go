package openai

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/testkit"
)

func TestParseRequestReadsEachForm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		path string
		body string
		want request.Request // Body and Chat.Messages are checked separately
		chat *request.Chat
	}{
		{
			name: "a completions prompt given as a string is routed by its text with special tokens added",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":"Hello there"}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "Hello there", AddSpecialTokens: true},
		},
		{
			name: "a query string does not hide the API",
			path: "/v1/completions?debug=1",
			body: `{"model":"llama","prompt":"x","stream":true,"cache_salt":"s1"}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "x", AddSpecialTokens: true, Stream: true, CacheSalt: "s1"},
		},
		{
			name: "a gateway prefix before /v1 does not hide the API",
			path: "/llm/v1/completions",
			body: `{"model":"llama","prompt":"x"}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "x", AddSpecialTokens: true},
		},
		{
			name: "max_tokens is read as the output length asked for",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":"x","max_tokens":64}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "x", AddSpecialTokens: true, MaxTokens: 64},
		},
		{
			name: "max_completion_tokens wins over max_tokens, and a bad value is left to the model server",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":"x","max_completion_tokens":"lots","max_tokens":7}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "x", AddSpecialTokens: true, MaxTokens: 7},
		},
		{
			name: "add_special_tokens false in the body is honoured",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":"x","add_special_tokens":false}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "x"},
		},
		{
			name: "a batch of string prompts is routed by the first",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":["first","second"]}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "first", AddSpecialTokens: true},
		},
		{
			name: "a prompt of token ids is taken as the token ids",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":[ 1, 22 ,333,4294967295 ]}`,
			want: request.Request{API: request.APICompletions, Model: "llama", TokenIDs: []uint32{1, 22, 333, 4294967295}, AddSpecialTokens: true},
		},
		{
			name: "a batch of token id lists is routed by the first list",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":[[5,6],[7]]}`,
			want: request.Request{API: request.APICompletions, Model: "llama", TokenIDs: []uint32{5, 6}, AddSpecialTokens: true},
		},
		{
			name: "a prompt given as embeddings is routed but never prefix-matched",
			path: "/v1/completions",
			body: `{"model":"llama","prompt_embeds":"AAAA"}`,
			want: request.Request{API: request.APICompletions, Model: "llama", AddSpecialTokens: true, NoReproduciblePrefix: true},
		},
		{
			name: "null optional fields take their defaults",
			path: "/v1/completions",
			body: `{"model":"llama","prompt":"x","stream":null,"cache_salt":null,"add_special_tokens":null}`,
			want: request.Request{API: request.APICompletions, Model: "llama", Prompt: "x", AddSpecialTokens: true},
		},
		{
			name: "a chat request with string content renders its messages and takes chat defaults",
			path: "/v1/chat/completions",
			body: `{"model":"llama","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]}`,
			want: request.Request{API: request.APIChatCompletions, Model: "llama", Prompt: "<system>\nBe brief.\n<user>\nHi\n"},
			chat: &request.Chat{AddGenerationPrompt: true},
		},
		{
			name: "a chat request keeps its template options and tools",
			path: "/v1/chat/completions",
			body: `{"model":"llama","stream":true,"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hel"}],
				"tools":[{"type":"function","function":{"name":"f"}}],"chat_template":"{{x}}","chat_template_kwargs":{"enable_thinking":false},
				"add_generation_prompt":false,"continue_final_message":true,"add_special_tokens":true}`,
			want: request.Request{API: request.APIChatCompletions, Model: "llama", Stream: true, AddSpecialTokens: true,
				Prompt: "<tools>\n[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]\n<user>\nHi\n<assistant>\nHel\n"},
			chat: &request.Chat{
				Tools:                json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`),
				ChatTemplate:         "{{x}}",
				ChatTemplateKwargs:   json.RawMessage(`{"enable_thinking":false}`),
				ContinueFinalMessage: true,
				AddSpecialTokens:     true,
			},
		},
		{
			name: "text parts, null content and tool calls are rendered",
			path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","name":"ann","content":[{"type":"text","text":"a"},{"text":"b"}]},
				{"role":"assistant","content":null,"tool_calls":[{"id":"1", "type":"function"}]}]}`,
			want: request.Request{API: request.APIChatCompletions, Model: "m",
				Prompt: "<user ann>\nab\n<assistant>\n\n<tool_calls>[{\"id\":\"1\",\"type\":\"function\"}]\n"},
			chat: &request.Chat{AddGenerationPrompt: true},
		},
		{
			name: "an image part makes the request routable but not prefix-matchable",
			path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:"}}]}]}`,
			want: request.Request{API: request.APIChatCompletions, Model: "m", NoReproduciblePrefix: true, Prompt: "<user>\nwhat is this<image_url>\n"},
			chat: &request.Chat{AddGenerationPrompt: true},
		},
		{
			name: "audio, video and file parts are treated like images",
			path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio"}]},{"role":"user","content":[{"type":"video_url"},{"type":"file"}]}]}`,
			want: request.Request{API: request.APIChatCompletions, Model: "m", NoReproduciblePrefix: true, Prompt: "<user>\n<input_audio>\n<user>\n<video_url><file>\n"},
			chat: &request.Chat{AddGenerationPrompt: true},
		},
		{
			name: "another API is routed with its model and no prompt",
			path: "/v1/rerank",
			body: `{"model":"emb","query":"x","stream":false}`,
			want: request.Request{API: request.APIOther, Model: "emb"},
		},
		{
			name: "another API with a body that is not JSON is not an error",
			path: "/health",
			body: `not json`,
			want: request.Request{API: request.APIOther},
		},
		{
			name: "another API with a model of the wrong type is routed without a model",
			path: "/v1/models",
			body: `{"model":7}`,
			want: request.Request{API: request.APIOther},
		},
		{
			name: "a trailing slash is another API, as the model server would not serve it",
			path: "/v1/completions/",
			body: `{"model":"m"}`,
			want: request.Request{API: request.APIOther, Model: "m"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseRequest(tt.path, []byte(tt.body))
			if err != nil {
				t.Fatalf("ParseRequest: %v", err)
			}
			if string(got.Body) != tt.body {
				t.Errorf("Body = %q, want the body as received", got.Body)
			}
			if tt.chat == nil && got.Chat != nil {
				t.Errorf("Chat = %+v, want nil", got.Chat)
			}
			if tt.chat != nil {
				if got.Chat == nil {
					t.Fatal("Chat is nil")
				}
				var parsed struct{ Messages json.RawMessage }
				if err := json.Unmarshal([]byte(tt.body), &parsed); err != nil {
					t.Fatal(err)
				}
				if string(got.Chat.Messages) != string(parsed.Messages) {
					t.Errorf("Chat.Messages = %s, want the raw messages %s", got.Chat.Messages, parsed.Messages)
				}
				gotChat := *got.Chat
				gotChat.Messages = nil
				if !reflect.DeepEqual(gotChat, *tt.chat) {
					t.Errorf("Chat = %+v, want %+v", gotChat, *tt.chat)
				}
			}
			gotReq := *got
			gotReq.Body, gotReq.Chat = nil, nil
			if !reflect.DeepEqual(gotReq, tt.want) {
				t.Errorf("Request =\n%+v, want\n%+v", gotReq, tt.want)
			}
		})
	}
}

func TestParseRequestRejectsMalformedBodiesWithAReason(t *testing.T) {
	t.Parallel()
	const comp, chat = "/v1/completions", "/v1/chat/completions"
	tests := []struct {
		name, path, body, reason string
	}{
		{"an empty body", comp, ``, "the body is empty; expected a JSON object"},
		{"a body of spaces", chat, "  \n", "the body is empty"},
		{"a body that is an array", comp, `[1]`, "the body is an array; expected a JSON object"},
		{"a body that is null", chat, `null`, "the body is null; expected a JSON object"},
		{"a truncated body", comp, `{"model":"m","prompt":"x"`, "not valid JSON"},
		{"trailing garbage after the object", comp, `{"model":"m","prompt":"x"} x`, "not valid JSON"},
		{"two objects", comp, `{"model":"m","prompt":"x"}{}`, "not valid JSON"},
		{"a missing model", comp, `{"prompt":"x"}`, "model is required"},
		{"a null model", chat, `{"model":null,"messages":[]}`, "model is required"},
		{"a model that is a number", comp, `{"model":3,"prompt":"x"}`, "model is a number; expected a string"},
		{"an empty model", comp, `{"model":"","prompt":"x"}`, "model is an empty string"},
		{"a stream flag that is a string", comp, `{"model":"m","prompt":"x","stream":"yes"}`, "stream is a string; expected a boolean"},
		{"a cache salt that is an object", comp, `{"model":"m","prompt":"x","cache_salt":{}}`, "cache_salt is an object; expected a string"},
		{"a missing prompt", comp, `{"model":"m"}`, "prompt is required"},
		{"a prompt that is a number", comp, `{"model":"m","prompt":5}`, "prompt is a number; expected a string, an array of strings"},
		{"an empty prompt array", comp, `{"model":"m","prompt":[]}`, "prompt is an empty array"},
		{"a negative token id", comp, `{"model":"m","prompt":[1,-2]}`, "prompt[1] is a negative number; expected a token id"},
		{"a token id beyond uint32", comp, `{"model":"m","prompt":[4294967296]}`, "prompt[0] is larger than a token id can be"},
		{"a fractional token id", comp, `{"model":"m","prompt":[1,2.5]}`, "prompt[1] is a number; expected a token id (an integer"},
		{"a token id in exponent form", comp, `{"model":"m","prompt":[1e3]}`, "prompt[0] is a number; expected a token id"},
		{"a null token id", comp, `{"model":"m","prompt":[1,null]}`, "prompt[1] is null; expected a token id"},
		{"a string among token ids", comp, `{"model":"m","prompt":[1,"a"]}`, "prompt[1] is a string; expected a token id"},
		{"a token id among strings", comp, `{"model":"m","prompt":["a",1]}`, "prompt[1] is a number; expected a string like the first element"},
		{"a null among strings", comp, `{"model":"m","prompt":["a",null]}`, "prompt[1] is null; expected a string"},
		{"an empty token id list in a batch", comp, `{"model":"m","prompt":[[]]}`, "prompt[0] is an empty array of token ids"},
		{"a bad token id in a later list of a batch", comp, `{"model":"m","prompt":[[1],[-1]]}`, "prompt[1][0] is a negative number"},
		{"a string where a token id list belongs", comp, `{"model":"m","prompt":[[1],"x"]}`, "prompt[1] is a string; expected an array of token ids"},
		{"add_special_tokens that is a number", comp, `{"model":"m","prompt":"x","add_special_tokens":1}`, "add_special_tokens is a number; expected a boolean"},
		{"missing messages", chat, `{"model":"m"}`, "messages is required"},
		{"messages that are an object", chat, `{"model":"m","messages":{}}`, "messages is an object; expected an array of message objects"},
		{"empty messages", chat, `{"model":"m","messages":[]}`, "messages is an empty array"},
		{"a message that is a string", chat, `{"model":"m","messages":["hi"]}`, "messages[0] is a string; expected an object"},
		{"a message without a role", chat, `{"model":"m","messages":[{"content":"hi"}]}`, "messages[0].role is required"},
		{"a role that is a number", chat, `{"model":"m","messages":[{"role":1}]}`, "messages[0].role is a number; expected a string"},
		{"content that is a number", chat, `{"model":"m","messages":[{"role":"user","content":1}]}`, "messages[0].content is a number; expected a string, null or an array of content parts"},
		{"a content part that is a string", chat, `{"model":"m","messages":[{"role":"user","content":["hi"]}]}`, "messages[0].content[0] is a string; expected an object"},
		{"a text part without text", chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text"}]}]}`, "messages[0].content[0] is a text part whose text is missing"},
		{"a part type that is a number", chat, `{"model":"m","messages":[{"role":"user","content":[{"type":3}]}]}`, "messages[0].content[0] has a type that is not a string"},
		{"tools that are an object", chat, `{"model":"m","messages":[{"role":"user"}],"tools":{}}`, "tools is an object; expected an array"},
		{"template kwargs that are an array", chat, `{"model":"m","messages":[{"role":"user"}],"chat_template_kwargs":[]}`, "chat_template_kwargs is an array; expected an object"},
		{"a chat template that is a boolean", chat, `{"model":"m","messages":[{"role":"user"}],"chat_template":true}`, "chat_template is a boolean; expected a string"},
		{"a token id with a leading zero", comp, `{"model":"m","prompt":[1,02]}`, "not valid JSON"},
		{"a trailing comma in the token ids", comp, `{"model":"m","prompt":[1,2,]}`, "not valid JSON"},
		{"token ids without commas", comp, `{"model":"m","prompt":[1 2]}`, "not valid JSON"},
		{"bad JSON in the token ids even before a missing model", comp, `{"prompt":[1,2,],"x":1}`, "not valid JSON"},
		{"bad JSON after the token ids even before an empty model", comp, `{"prompt":[1,2],"model":"","x":tru}`, "not valid JSON"},
		{"a control character in a string", comp, "{\"model\":\"m\",\"prompt\":\"a\x01\"}", "not valid JSON"},
		{"a bad escape in a string", comp, `{"model":"m","prompt":"\q"}`, "not valid JSON"},
		{"a short unicode escape", comp, `{"model":"m","prompt":"\u12"}`, "not valid JSON"},
		{"a number without digits after its point", comp, `{"model":"m","prompt":"x","temperature":1.}`, "not valid JSON"},
		{"nesting deeper than encoding/json allows", comp, `{"model":"m","prompt":"x","a":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `}`, "not valid JSON"},
		{"add_generation_prompt that is a string", chat, `{"model":"m","messages":[{"role":"user"}],"add_generation_prompt":"no"}`, "add_generation_prompt is a string; expected a boolean"},
	}
	for _, tt := range tests {
		t.Run("rejects "+tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := ParseRequest(tt.path, []byte(tt.body))
			if err == nil {
				t.Fatalf("ParseRequest returned %+v, want an error", req)
			}
			if !errors.Is(err, ErrBadRequest) {
				t.Errorf("error %q does not wrap ErrBadRequest", err)
			}
			if !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("error %q does not say %q", err, tt.reason)
			}
		})
	}
}

func TestParseRequestMatchesKeysExactly(t *testing.T) {
	t.Parallel()
	// The model server ignores "Model"; routing by it would pick the wrong pool.
	req, err := ParseRequest("/v1/completions", []byte(`{"model":"a","Model":"b","prompt":"x","PROMPT":"y"}`))
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "a" || req.Prompt != "x" {
		t.Errorf("Model, Prompt = %q, %q; want %q, %q", req.Model, req.Prompt, "a", "x")
	}
}

func TestParseRequestRendersChatDeterministically(t *testing.T) {
	t.Parallel()
	a := `{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"one"}]}`
	b := `{"messages":[ {"content":"S","role":"system"} , {"role":"user","content":"one"},{"role":"assistant","content":"two"}],"model":"m"}`
	ra, err := ParseRequest("/v1/chat/completions", []byte(a))
	if err != nil {
		t.Fatal(err)
	}
	rb, err := ParseRequest("/v1/chat/completions", []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rb.Prompt, ra.Prompt) {
		t.Errorf("a longer conversation's rendering %q does not extend the shorter one's %q", rb.Prompt, ra.Prompt)
	}
}

// BenchmarkParseRequestTokenIDs8k reads an 8192-token completions body given
// as token ids: compact as Go's encoding/json writes it, and spaced (", ") as
// Python's json.dumps does; into fresh memory (ParseRequest) and, as the
// ext_proc path reads it, into a reused buffer (ParseRequestInto).
func BenchmarkParseRequestTokenIDs8k(b *testing.B) {
	ids := make([]int, 8192)
	for i := range ids {
		ids[i] = (i * 7919) % 128256
	}
	compact, err := json.Marshal(map[string]any{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": ids, "max_tokens": 64, "stream": true})
	if err != nil {
		b.Fatal(err)
	}
	spaced := strings.ReplaceAll(string(compact), ",", ", ")
	for _, bc := range []struct {
		name string
		body []byte
		into bool
	}{
		{"compact/ParseRequest", compact, false},
		{"compact/into-a-buffer", compact, true},
		{"spaced/into-a-buffer", []byte(spaced), true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var buf []uint32
			if bc.into {
				buf = make([]uint32, len(ids))
			}
			b.SetBytes(int64(len(bc.body)))
			b.ReportAllocs()
			cpu := testkit.CPUTime()
			for b.Loop() {
				req, err := ParseRequestInto("/v1/completions", bc.body, buf)
				if err != nil || len(req.TokenIDs) != len(ids) {
					b.Fatalf("ParseRequest: %d ids, %v", len(req.TokenIDs), err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/token")
			b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N*len(ids)), "cpu-ns/token")
		})
	}
}

func BenchmarkParseRequestChat(b *testing.B) {
	system := strings.Repeat("You are a careful assistant. ", 1000)
	body, err := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
		{"role": "system", "content": system}, {"role": "user", "content": "What is the capital of France?"},
	}})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu := testkit.CPUTime()
	for b.Loop() {
		if _, err := ParseRequest("/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

func TestParseRequestAcceptsNestingUpToEncodingJSONsLimit(t *testing.T) {
	t.Parallel()
	// The body object is one level; 9999 arrays inside it make 10000, the
	// most encoding/json accepts.
	body := `{"model":"m","prompt":"x","a":` + strings.Repeat("[", 9999) + strings.Repeat("]", 9999) + `}`
	if !json.Valid([]byte(body)) {
		t.Fatal("encoding/json rejects the body; the test no longer probes its limit")
	}
	if _, err := ParseRequest("/v1/completions", []byte(body)); err != nil {
		t.Fatalf("ParseRequest: %v", err)
	}
}

func TestParseRequestReadsTheLastOfRepeatedPrompts(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body string
		ids        []uint32
		prompt     string
	}{
		{"token ids after a string", `{"model":"m","prompt":"x","prompt":[7, 8]}`, []uint32{7, 8}, ""},
		{"a string after token ids", `{"model":"m","prompt":[7,8],"prompt":"x"}`, nil, "x"},
		{"token ids after token ids", `{"model":"m","prompt":[7],"prompt":[0,4294967295]}`, []uint32{0, 4294967295}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, err := ParseRequest("/v1/completions", []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(req.TokenIDs, tt.ids) || req.Prompt != tt.prompt {
				t.Errorf("read ids %v and prompt %q, want %v and %q", req.TokenIDs, req.Prompt, tt.ids, tt.prompt)
			}
		})
	}
}

func TestParseRequestIntoReadsTokenIDsIntoTheBufferWhenTheyFit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body string
		capacity   int
		ids        []uint32
		inBuffer   bool
	}{
		{"ids that fit", `{"model":"m","prompt":[7, 8, 9]}`, 8, []uint32{7, 8, 9}, true},
		{"ids that do not fit", `{"model":"m","prompt":[7,8,9]}`, 2, []uint32{7, 8, 9}, false},
		{"the last of repeated prompts", `{"model":"m","prompt":[1,2,3,4],"prompt":[5]}`, 8, []uint32{5}, true},
		{"a string after ids", `{"model":"m","prompt":[1,2],"prompt":"x"}`, 8, nil, false},
		{"a batch of id lists (read apart)", `{"model":"m","prompt":[[1,2],[3]]}`, 8, []uint32{1, 2}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			buf := slices.Repeat([]uint32{0xdeadbeef}, tt.capacity)
			req, err := ParseRequestInto("/v1/completions", []byte(tt.body), buf[:1])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(req.TokenIDs, tt.ids) {
				t.Errorf("ids %v, want %v", req.TokenIDs, tt.ids)
			}
			inBuffer := len(req.TokenIDs) > 0 && &req.TokenIDs[0] == &buf[0]
			if inBuffer != tt.inBuffer {
				t.Errorf("ids read into the buffer: %v, want %v", inBuffer, tt.inBuffer)
			}
		})
	}
}
