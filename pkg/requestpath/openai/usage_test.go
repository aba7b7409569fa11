package openai

import (
	"errors"
	"strings"
	"testing"
)

func TestParseUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		body    string
		want    Usage
		found   bool
		wantErr string
	}{
		{
			name:  "a completion response with cached tokens reports all three counts",
			body:  `{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":120,"total_tokens":130,"completion_tokens":10,"prompt_tokens_details":{"cached_tokens":96}}}`,
			want:  Usage{PromptTokens: 120, CachedTokens: 96, CompletionTokens: 10, CachedTokensKnown: true},
			found: true,
		},
		{
			name:  "a response without prompt details has no cached tokens",
			body:  `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":null}}`,
			want:  Usage{PromptTokens: 5, CompletionTokens: 1},
			found: true,
		},
		{name: "a response without usage has none", body: `{"choices":[]}`},
		{name: "a streamed chunk with a null usage has none", body: `{"choices":[{"delta":{"content":"a"}}],"usage":null}`},
		{name: "an empty body is an error", body: ``, wantErr: "the body is missing; expected a JSON object"},
		{name: "an array body is an error", body: `[]`, wantErr: "the body is an array"},
		{name: "a truncated body is an error", body: `{"usage":{"prompt_tokens":1`, wantErr: "unexpected end"},
		{name: "a usage that is a string is an error", body: `{"usage":"lots"}`, wantErr: "usage is a string; expected an object"},
		{name: "a usage without prompt tokens is an error", body: `{"usage":{"completion_tokens":1}}`, wantErr: "usage.prompt_tokens is missing"},
		{name: "a fractional count is an error", body: `{"usage":{"prompt_tokens":1.5}}`, wantErr: "cannot unmarshal"},
		{name: "a negative count is an error", body: `{"usage":{"prompt_tokens":-1}}`, wantErr: "negative"},
		{name: "more cached than prompt tokens is an error", body: `{"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}`, wantErr: "exceeds prompt_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, found, err := ParseUsage([]byte(tt.body))
			if tt.wantErr != "" {
				if err == nil || !errors.Is(err, ErrBadUsage) || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want ErrBadUsage saying %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseUsage: %v", err)
			}
			if got != tt.want || found != tt.found {
				t.Errorf("ParseUsage = %+v, %v; want %+v, %v", got, found, tt.want, tt.found)
			}
		})
	}
}

// stream is a vLLM-shaped chat stream with include_usage set: usage is null
// in every chunk but the last before [DONE].
const stream = "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hello \\\"usage\\\": 1\"}}],\"usage\":null}\n\n" +
	": keep-alive comment\n\n" +
	"data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"!\"},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"total_tokens\":42,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n" +
	"data: [DONE]\n\n"

func TestSSEUsageScannerFindsTheFinalUsageAndCountsTheEventsAtAnySplit(t *testing.T) {
	t.Parallel()
	want := Usage{PromptTokens: 40, CachedTokens: 32, CompletionTokens: 2, CachedTokensKnown: true}
	for _, eol := range []string{"\n", "\r\n", "\r"} {
		body := strings.ReplaceAll(stream, "\n", eol)
		for split := 0; split <= len(body); split++ {
			for _, step := range []int{1, 7} {
				var s SSEUsageScanner
				s.Write([]byte(body[:split]))
				for i := split; i < len(body); i += step {
					s.Write([]byte(body[i:min(i+step, len(body))]))
				}
				got, ok := s.Usage()
				// Four data events: three of the reply's and the usage's; the
				// comment and [DONE] are none.
				if !ok || got != want || !s.Done() || s.Errors() != 0 || s.Overflows() != 0 || s.Events() != 4 {
					t.Fatalf("eol %q split %d step %d: Usage = %+v, %v; done %v errors %d overflows %d events %d",
						eol, split, step, got, ok, s.Done(), s.Errors(), s.Overflows(), s.Events())
				}
			}
		}
	}
}

func TestSSEUsageScanner(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		max       int
		body      string
		want      Usage
		found     bool
		overflows int
		errs      int
	}{
		{name: "a stream without usage reports none", body: "data: {\"usage\":null}\n\ndata: [DONE]\n\n"},
		{
			name:  "with continuous usage the last one wins",
			body:  "data: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n",
			want:  Usage{PromptTokens: 3, CompletionTokens: 2},
			found: true,
		},
		{
			name: "an event not closed by a blank line is not taken",
			body: "data: {\"usage\":{\"prompt_tokens\":3}}\n",
		},
		{
			name:  "data split over several lines is joined",
			body:  "data: {\"usage\":\ndata: {\"prompt_tokens\":9}}\n\n",
			want:  Usage{PromptTokens: 9},
			found: true,
		},
		{
			name:  "a data line without a space after the colon is read",
			body:  "event: message\nid: 4\ndata:{\"usage\":{\"prompt_tokens\":2}}\n\n",
			want:  Usage{PromptTokens: 2},
			found: true,
		},
		{
			name:      "an overlong line is skipped and counted but later events are read",
			max:       64,
			body:      "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 200) + "\"}}],\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":7}}\n\n",
			want:      Usage{PromptTokens: 7},
			found:     true,
			overflows: 1,
		},
		{
			name:      "an overlong event made of short lines is skipped and counted",
			max:       40,
			body:      "data: {\"usage\":\ndata: {\"prompt_tokens\":9,\ndata: \"completion_tokens\":1}}\n\n",
			overflows: 1,
		},
		{
			name: "a malformed usage is counted and does not replace a good one",
			body: "data: {\"usage\":{\"prompt_tokens\":5}}\n\ndata: {\"usage\":{\"prompt_tokens\":\"x\"}}\n\n",
			want: Usage{PromptTokens: 5}, found: true, errs: 1,
		},
		{name: "garbage is ignored", body: "\x00\xff\n\n::\n\ndata\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := SSEUsageScanner{MaxLine: tt.max}
			s.Write([]byte(tt.body))
			got, found := s.Usage()
			if got != tt.want || found != tt.found {
				t.Errorf("Usage = %+v, %v; want %+v, %v", got, found, tt.want, tt.found)
			}
			if s.Overflows() != tt.overflows || s.Errors() != tt.errs {
				t.Errorf("Overflows, Errors = %d, %d; want %d, %d", s.Overflows(), s.Errors(), tt.overflows, tt.errs)
			}
		})
	}
}

func TestSSEUsageScannerHoldsBoundedMemory(t *testing.T) {
	t.Parallel()
	s := SSEUsageScanner{MaxLine: 1024}
	chunk := []byte(strings.Repeat("y", 4096))
	s.Write([]byte("data: "))
	for range 1000 {
		s.Write(chunk)
	}
	if cap(s.line) > 1024 || cap(s.data) > 1024 {
		t.Errorf("buffers grew to %d and %d bytes, want at most 1024", cap(s.line), cap(s.data))
	}
	s.Write([]byte("\n\ndata: {\"usage\":{\"prompt_tokens\":1}}\n\n"))
	if u, ok := s.Usage(); !ok || u.PromptTokens != 1 || s.Overflows() != 1 {
		t.Errorf("after an overlong line: Usage = %+v, %v, overflows %d", u, ok, s.Overflows())
	}
}

func BenchmarkSSEUsageScanner(b *testing.B) {
	chunk := []byte("data: {\"id\":\"cmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" word\"},\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n")
	b.SetBytes(int64(len(chunk)))
	b.ReportAllocs()
	var s SSEUsageScanner
	for b.Loop() {
		s.Write(chunk)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/chunk")
}

func TestSSEUsageScannerKeepsACRLFSplitByAnEmptyWrite(t *testing.T) {
	t.Parallel()
	var s SSEUsageScanner
	// "\r" then nothing then "\n": one line end, not a line end and a blank
	// line, which would end the event before its second data line.
	for _, c := range []string{"data: {\"usage\":\r", "", "\ndata: {\"prompt_tokens\":4}}\r\n\r\n"} {
		s.Write([]byte(c))
	}
	if u, ok := s.Usage(); !ok || u.PromptTokens != 4 {
		t.Errorf("Usage = %+v, %v; want 4 prompt tokens", u, ok)
	}
}

func TestSSEUsageScannerReadsEventsWholeInAChunkWithoutCopyingThem(t *testing.T) {
	t.Parallel()
	var s SSEUsageScanner
	// One event per chunk, as a model server flushes them.
	for _, ev := range strings.SplitAfter(stream, "\n\n") {
		s.Write([]byte(ev))
		if cap(s.line) != 0 || cap(s.data) != 0 {
			t.Fatalf("after %q: holding %d and %d bytes; want none", ev, cap(s.line), cap(s.data))
		}
	}
	if u, ok := s.Usage(); !ok || u.PromptTokens != 40 || u.CachedTokens != 32 || !s.Done() {
		t.Errorf("Usage = %+v, %v, done %v; want the final usage and done", u, ok, s.Done())
	}
	// An event cut by a chunk boundary is held until its end arrives.
	s.Write([]byte("data: {\"usage\":{\"prompt_tokens\":7}}\n"))
	s.Write([]byte("\n"))
	if u, _ := s.Usage(); u.PromptTokens != 7 {
		t.Errorf("an event ended by the next chunk: Usage = %+v, want 7 prompt tokens", u)
	}
}
