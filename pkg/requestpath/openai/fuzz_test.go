package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
)

var requestSeeds = []struct{ path, body string }{
	{"/v1/completions", `{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Once upon a time","max_tokens":64,"temperature":0.7}`},
	{"/v1/completions", `{"model":"m","prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true}}`},
	{"/v1/completions", `{"model":"m","prompt":[128000,9906,1917],"add_special_tokens":false,"cache_salt":"tenant-a"}`},
	{"/v1/completions", `{"model":"m","prompt":[[1,2],[3]]}`},
	{"/v1/completions", `{"model":"m","prompt":[0,1,22,333,4444,55555,666666,7777777,88888888,999999999,4294967295,01,12 ,3]}`},
	{"/v1/completions", `{"model":"m","prompt":[4294967295,1234567,1]}`},
	{"/v1/completions", `{"model":"m","prompt":[1,-1]}`},
	{"/v1/completions", `{"model":"m","prompt":[99999999999999999999]}`},
	{"/v1/completions", `{"model":"m","prompt_embeds":"AAAA"}`},
	{"/v1/chat/completions", `{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi"}],"stream":true}`},
	{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what"},{"type":"image_url","image_url":{"url":"https://x/y.png"}}]}]}`},
	{"/v1/chat/completions", `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"chat_template_kwargs":{"enable_thinking":false},"add_generation_prompt":false,"continue_final_message":true}`},
	{"/v1/chat/completions", `{"model":"m","messages":[]}`},
	{"/v1/chat/completions?x=1", `{"model":"m","messages":[{"role":"user","content":[{"text":"untyped"}]}]}`},
	{"/v1/embeddings", `{"model":"e","input":"x"}`},
	{"/v1/completions", ``},
	{"/v1/completions", `{"model":"m","prompt":"x"} trailing`},
	{"/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}"},
	// Prompts long enough for the token-id reader's fast path, which reads
	// 64 bytes at a time: compact, spaced, and with what it leaves to the
	// slow path (a long id, a leading zero, other whitespace) past a block.
	{"/v1/completions", `{"model":"m","prompt":[` + longIDs(",", "") + `]}`},
	{"/v1/completions", `{"model":"m","prompt":[` + longIDs(", ", "") + `],"max_tokens":8}`},
	{"/v1/completions", `{"model":"m","prompt":[` + longIDs(",", "123456789") + `]}`},
	{"/v1/completions", `{"model":"m","prompt":[` + longIDs(",", "0123") + `]}`},
	{"/v1/completions", `{"model":"m","prompt":[` + longIDs(",\n  ", "") + `]}`},
}

// longIDs is 40 token ids of one to seven digits separated by sep, the
// 30th replaced by odd when it is set.
func longIDs(sep, odd string) string {
	var ids []string
	for i := range 40 {
		id := strconv.Itoa(i * 7919 % 1000003)
		if i == 30 && odd != "" {
			id = odd
		}
		ids = append(ids, id)
	}
	return strings.Join(ids, sep)
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add(s.path, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		req, err := ParseRequest(path, body)
		// Parsing into a reused buffer that holds an earlier request's ids
		// reads the same.
		buf := slices.Repeat([]uint32{0xdeadbeef}, 64)[:7]
		if again, errAgain := ParseRequestInto(path, body, buf); (err == nil) != (errAgain == nil) {
			t.Fatalf("ParseRequest: %v; into a buffer: %v", err, errAgain)
		} else if err == nil && (!slices.Equal(again.TokenIDs, req.TokenIDs) || again.Prompt != req.Prompt || again.Model != req.Model) {
			t.Fatalf("into a buffer: ids %v prompt %q model %q; ParseRequest: %v %q %q",
				again.TokenIDs, again.Prompt, again.Model, req.TokenIDs, req.Prompt, req.Model)
		}
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %q does not wrap ErrBadRequest", err)
			}
			return
		}
		if string(req.Body) != string(body) {
			t.Fatal("Body is not the body as received")
		}
		if req.Chat != nil && len(req.Chat.Messages) == 0 {
			t.Fatal("a chat request without messages was accepted")
		}
		if modelRequired(req.API) && req.API != 0 && req.Model == "" {
			t.Fatalf("a %s request without a model was accepted", req.API)
		}
		// Token ids read from a flat prompt array must be encoding/json's.
		var fields map[string]json.RawMessage
		var want []uint32
		if req.API == request.APICompletions && json.Unmarshal(body, &fields) == nil && json.Unmarshal(fields["prompt"], &want) == nil && len(want) > 0 {
			if !slices.Equal(req.TokenIDs, want) {
				t.Fatalf("token ids %v, encoding/json reads %v", req.TokenIDs, want)
			}
		}
	})
}

func FuzzParseUsage(f *testing.F) {
	for _, s := range []string{
		`{"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}`,
		`{"usage":null}`,
		`{"usage":{"prompt_tokens":-1}}`,
		`{"usage":"x"}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		u, found, err := ParseUsage(body)
		if err != nil && !errors.Is(err, ErrBadUsage) {
			t.Fatalf("error %q does not wrap ErrBadUsage", err)
		}
		if found && (u.PromptTokens < 0 || u.CachedTokens < 0 || u.CompletionTokens < 0 || u.CachedTokens > u.PromptTokens) {
			t.Fatalf("accepted an impossible usage %+v", u)
		}
	})
}

func FuzzSSEUsageScanner(f *testing.F) {
	f.Add([]byte(stream), uint16(7))
	f.Add([]byte("data: {\"usage\":\r\ndata: {\"prompt_tokens\":9}}\r\n\r\n"), uint16(1))
	f.Add([]byte("data: [DONE]\r"), uint16(3))
	f.Fuzz(func(t *testing.T, body []byte, step uint16) {
		const maxLine = 128
		n := int(step%64) + 1
		whole := SSEUsageScanner{MaxLine: maxLine}
		whole.Write(body)
		split := SSEUsageScanner{MaxLine: maxLine}
		for i := 0; i < len(body); i += n {
			split.Write(body[i:min(i+n, len(body))])
		}
		// How the body is cut must not change what is seen, and memory
		// stays bounded.
		wu, wok := whole.Usage()
		su, sok := split.Usage()
		if wu != su || wok != sok || whole.Done() != split.Done() {
			t.Fatalf("whole %+v %v done %v; split by %d %+v %v done %v", wu, wok, whole.Done(), n, su, sok, split.Done())
		}
		if len(split.line) > maxLine || len(split.data) > maxLine {
			t.Fatalf("held %d and %d bytes, more than %d", len(split.line), len(split.data), maxLine)
		}
	})
}

// FuzzSplitBody holds the validating splitter of request bodies to
// encoding/json.
func FuzzSplitBody(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s.body))
	}
	f.Add([]byte(`{"a\"b":"x\\\"y","a\u0062":[1,"]",{"}":"\\"}],"e":-1.5e3,"t":true , "n" : null }`))
	f.Add([]byte(`{"k":"v","k":"w"}`))
	f.Add([]byte(`{"model":"a","mod\u0065l":"b","\u006dodel":1,"Model":"c","model\u0000":"d","max_tokens":7}`))
	f.Add([]byte(`{"prompt":[0,1,4294967295],"prompt":[01]}`))
	f.Add([]byte(`{"prompt":[1 , 2 ,3] , "x":[1e5,-0,0.5E+2,"\u00e9\ud83d"]}`))
	f.Add([]byte(`{"prompt":[1,2,],"a":[tru]}`))
	f.Add([]byte("{\"a\":\"\x01\"}"))
	f.Fuzz(func(t *testing.T, body []byte) {
		// The validating splitter of the whole body accepts exactly what
		// encoding/json accepts, reads the same members, and reads a flat
		// token-id prompt as parseTokenIDs does.
		valid := json.Valid(body)
		if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '{' {
			obj, ok, err := splitBody(trimmed, nil)
			if err != nil || ok != valid {
				t.Fatalf("splitBody: ok %v, error %v; json.Valid says %v", ok, err, valid)
			}
			var members map[string]json.RawMessage
			if ok && json.Unmarshal(body, &members) == nil {
				for f, name := range fieldNames {
					v, found := members[name]
					if got := obj.fields[f]; !bytes.Equal(got, bytes.TrimSpace(v)) || (got != nil) != found {
						t.Fatalf("splitBody: member %q = %q, encoding/json reads %q", name, got, v)
					}
				}
			}
			if obj.promptIDs != nil {
				ids, err := parseTokenIDs(obj.fields[fieldPrompt], "prompt")
				if err != nil || !slices.Equal(ids, obj.promptIDs) {
					t.Fatalf("prompt read while validating as %v; parseTokenIDs reads %v, %v", obj.promptIDs, ids, err)
				}
			}
		}
	})
}
