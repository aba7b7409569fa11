package sim

import (
	"errors"
	"strings"
	"testing"
)

func TestReadStreamReadsTokensAndUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		text    string
		cached  int
		wantErr error
	}{
		{"a completion stream with usage", "data: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: {\"choices\":[{\"text\":\" b\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n", " a b", 2, nil},
		{"a chat stream", "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" c\"}}]}\n\ndata: [DONE]\n\n", " c", 0, nil},
		{"an error chunk", "data: {\"error\":{\"message\":\"stopped\"}}\n\n", "", 0, ErrBadStream},
		{"a malformed chunk", "data: {\"choices\":[{\"text\":1}]}\n\n", "", 0, ErrBadStream},
		{"a stream cut before [DONE]", "data: {\"choices\":[{\"text\":\" a\"}]}\n\n", "", 0, ErrBadStream},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			firsts := 0
			res, err := ReadStream(strings.NewReader(tt.in), func() { firsts++ })
			if !errors.Is(err, tt.wantErr) || (err == nil) != (tt.wantErr == nil) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if err == nil && (res.Text != tt.text || res.CachedTokens != tt.cached || firsts != 1) {
				t.Errorf("got %+v after %d first-token calls, want text %q, %d cached, one call", res, firsts, tt.text, tt.cached)
			}
		})
	}
}

// FuzzReadStream feeds arbitrary bytes to the client's stream reader, which
// reads what a model server or a proxy sends: it returns a result or a
// clear error, never panics, and accepts nothing without [DONE].
func FuzzReadStream(f *testing.F) {
	for _, seed := range []string{
		"data: {\"choices\":[{\"text\":\" a\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":2}}}\n\ndata: [DONE]\n\n",
		"data: {\"choices\":[{\"delta\":{\"content\":\" b\"}}]}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"message\":\"stopped\",\"code\":503}}\n\n",
		"data: {\"usage\":{\"prompt_tokens\":-5}}\n\n",
		": comment\nevent: x\n\n",
		"data: [DONE]",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, in string) {
		res, err := ReadStream(strings.NewReader(in), nil)
		if err != nil && (res.Text != "" || !errors.Is(err, ErrBadStream)) {
			t.Errorf("error %v with result %+v", err, res)
		}
		if err == nil && !strings.Contains(in, "data: [DONE]") {
			t.Errorf("a stream without [DONE] was accepted")
		}
	})
}
