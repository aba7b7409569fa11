package openai

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/jsonscan"
	"github.com/kvroute/kvroute/pkg/request"
)

// checkConverted holds what every request the server renders as a chat
// must be: messages that are valid JSON, each with a role and a string or
// array content, that the chat API itself accepts.
func checkConverted(t *testing.T, path string, body []byte, o ParseOptions) {
	req, err := ParseRequestWith(path, body, nil, o)
	if err != nil {
		if !errors.Is(err, ErrBadRequest) {
			t.Fatalf("error %q does not wrap ErrBadRequest", err)
		}
		return
	}
	if req.Chat == nil {
		t.Fatalf("%s request accepted without a chat to render", path)
	}
	if !jsonscan.Valid(req.Chat.Messages) || (req.Chat.Tools != nil && !jsonscan.Valid(req.Chat.Tools)) {
		t.Fatalf("converted messages or tools are not valid JSON: %s %s", req.Chat.Messages, req.Chat.Tools)
	}
	chat := map[string]json.RawMessage{"model": json.RawMessage(`"m"`), "messages": req.Chat.Messages}
	if req.Chat.Tools != nil {
		chat["tools"] = req.Chat.Tools
	}
	b, _ := json.Marshal(chat)
	again, err := ParseRequest("/v1/chat/completions", b)
	if err != nil {
		t.Fatalf("the converted chat is refused by the chat API: %v\n%s", err, b)
	}
	if again.Prompt != req.Prompt {
		t.Fatalf("the converted chat reads as %q; converted %q", again.Prompt, req.Prompt)
	}
}

func FuzzParseMessages(f *testing.F) {
	for _, s := range messagesSeeds {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, keep bool) {
		checkConverted(t, "/v1/messages", body, ParseOptions{KeepBillingHeader: keep})
		checkConverted(t, "/v1/messages/count_tokens", body, ParseOptions{KeepBillingHeader: keep})
	})
}

func FuzzParseResponses(f *testing.F) {
	for _, s := range responsesSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkConverted(t, "/v1/responses", body, ParseOptions{})
	})
}

func FuzzParseTokenAPIs(f *testing.F) {
	for _, s := range []struct{ path, body string }{
		{"/inference/v1/generate", `{"token_ids":[1,2,3],"sampling_params":{"max_tokens":8},"stream":true}`},
		{"/inference/v1/generate", `{"model":"m","token_ids":[],"prompt":[4,5]}`},
		{"/inference/v1/generate", `{"token_ids":[1,2],"token_ids":[3]}`},
		{"/v1/embeddings", `{"model":"e","input":["a","b"]}`},
		{"/v1/embeddings", `{"input":[[1,2],[3]],"add_special_tokens":false}`},
		{"/v1/embeddings", `{"input":[7,8,9]}`},
	} {
		f.Add(s.path, []byte(s.body))
	}
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		req, err := ParseRequestInto(path, body, make([]uint32, 0, 4))
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("error %q does not wrap ErrBadRequest", err)
			}
			return
		}
		var fields map[string]json.RawMessage
		var want []uint32
		if apiOf(path) == request.APIGenerate && json.Unmarshal(body, &fields) == nil {
			if json.Unmarshal(fields["token_ids"], &want) != nil || len(want) == 0 {
				t.Fatalf("generate accepted token_ids %s", fields["token_ids"])
			}
			if len(want) != len(req.TokenIDs) {
				t.Fatalf("token ids %v, encoding/json reads %v", req.TokenIDs, want)
			}
			for i := range want {
				if want[i] != req.TokenIDs[i] {
					t.Fatalf("token ids %v, encoding/json reads %v", req.TokenIDs, want)
				}
			}
		}
	})
}
