package openai

import "testing"

func TestUsageIsReadInEachAPIsShape(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, body string
		want       Usage
	}{
		{"a whole Messages answer from vLLM: input_tokens is the prompt",
			`{"id":"msg_1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":120,"output_tokens":8}}`,
			Usage{PromptTokens: 120, CompletionTokens: 8}},
		{"a Messages answer with Anthropic's cache counts",
			`{"type":"message","usage":{"input_tokens":20,"cache_read_input_tokens":96,"cache_creation_input_tokens":4,"output_tokens":8}}`,
			Usage{PromptTokens: 120, CompletionTokens: 8, CachedTokens: 96, CachedTokensKnown: true}},
		{"a message_start event's message",
			`{"type":"message_start","message":{"id":"m","content":[],"usage":{"input_tokens":24,"cache_read_input_tokens":96,"output_tokens":0}}}`,
			Usage{PromptTokens: 120, CachedTokens: 96, CachedTokensKnown: true}},
		{"a whole Responses answer",
			`{"id":"resp_1","object":"response","usage":{"input_tokens":120,"input_tokens_details":{"cached_tokens":64},"output_tokens":9,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":129}}`,
			Usage{PromptTokens: 120, CompletionTokens: 9, CachedTokens: 64, CachedTokensKnown: true}},
		{"a response.completed event's response",
			`{"type":"response.completed","sequence_number":9,"response":{"id":"r","status":"completed","usage":{"input_tokens":50,"input_tokens_details":{"cached_tokens":48},"output_tokens":3}}}`,
			Usage{PromptTokens: 50, CompletionTokens: 3, CachedTokens: 48, CachedTokensKnown: true}},
	} {
		u, found, err := ParseUsage([]byte(tc.body))
		if err != nil || !found || u.PromptTokens != tc.want.PromptTokens || u.CompletionTokens != tc.want.CompletionTokens ||
			u.CachedTokens != tc.want.CachedTokens || u.CachedTokensKnown != tc.want.CachedTokensKnown {
			t.Errorf("%s: %+v, %v, %v; want %+v", tc.name, u, found, err, tc.want)
		}
	}
	for _, body := range []string{
		`{"response":{"usage":{"input_tokens_details":{}}}}`,
		`{"usage":{"input_tokens":-1}}`,
		`{"message":{"usage":"x"}}`,
	} {
		if _, _, err := ParseUsage([]byte(body)); err == nil {
			t.Errorf("accepted %s", body)
		}
	}
}

func TestStreamedUsageOfMessagesAndResponses(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, stream string
		want         Usage
	}{
		{"Messages: message_delta's output completes message_start's prompt",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":20,\"cache_read_input_tokens\":100,\"output_tokens\":0}}}\n\n" +
				"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":7}}\n\n" +
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
			Usage{PromptTokens: 120, CompletionTokens: 7, CachedTokens: 100, CachedTokensKnown: true}},
		{"Messages from vLLM: message_delta counts both",
			"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],\"usage\":{\"input_tokens\":0,\"output_tokens\":0}}}\n\n" +
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"input_tokens\":33,\"output_tokens\":4}}\n\n",
			Usage{PromptTokens: 33, CompletionTokens: 4}},
		{"Responses: response.completed",
			"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r\",\"status\":\"in_progress\",\"usage\":null}}\n\n" +
				"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n" +
				"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":\"r\",\"status\":\"completed\",\"usage\":{\"input_tokens\":64,\"input_tokens_details\":{\"cached_tokens\":32},\"output_tokens\":1}}}\n\n",
			Usage{PromptTokens: 64, CompletionTokens: 1, CachedTokens: 32, CachedTokensKnown: true}},
	} {
		for _, step := range []int{1, 3, 17, len(tc.stream)} {
			var s SSEUsageScanner
			for i := 0; i < len(tc.stream); i += step {
				s.Write([]byte(tc.stream[i:min(i+step, len(tc.stream))]))
			}
			u, ok := s.Usage()
			if !ok || u.PromptTokens != tc.want.PromptTokens || u.CompletionTokens != tc.want.CompletionTokens ||
				u.CachedTokens != tc.want.CachedTokens || u.CachedTokensKnown != tc.want.CachedTokensKnown || s.Errors() != 0 {
				t.Errorf("%s, %d bytes at a time: %+v, %v (%d errors); want %+v", tc.name, step, u, ok, s.Errors(), tc.want)
			}
		}
	}
}
