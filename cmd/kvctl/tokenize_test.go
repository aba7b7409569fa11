package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

const tinyTokenizer = "../../pkg/tokenizer/testdata/tiny"

func TestTokenizePrintsTheIDsOfPromptsAndChats(t *testing.T) {
	t.Parallel()
	tok, err := tokenizer.Load(tinyTokenizer, tokenizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := tok.Encode("hello world!", false)
	withBOS, _ := tok.Encode("hello world!", true)
	messages := `[{"role":"user","content":"hello"}]`
	chatIDs, _ := tok.EncodeChat(&request.Chat{Messages: json.RawMessage(messages), AddGenerationPrompt: true})
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		want  []uint32
	}{
		{"a prompt in a flag", []string{"--prompt", "hello world!"}, "", plain},
		{"a prompt on stdin with special tokens", []string{"--add-special-tokens"}, "hello world!", withBOS},
		{"a messages array", []string{"--chat"}, messages, chatIDs},
		{"a chat request body", []string{"--chat"}, `{"model":"m","messages":` + messages + `}`, chatIDs},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			args := append([]string{"--tokenizer", tinyTokenizer}, tc.args...)
			if err := tokenizeCmd(args, strings.NewReader(tc.stdin), &stdout, &stderr); err != nil {
				t.Fatalf("tokenize: %v (stderr %q)", err, stderr.String())
			}
			var out struct {
				IDs   []uint32 `json:"ids"`
				Count int      `json:"count"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(out.IDs, tc.want) || out.Count != len(tc.want) {
				t.Errorf("got %v (count %d), want %v", out.IDs, out.Count, tc.want)
			}
		})
	}
}

func TestTokenizeReportsBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
	}{
		{"no tokenizer", nil, "x"},
		{"a missing tokenizer", []string{"--tokenizer", "/does/not/exist"}, "x"},
		{"chat input that is not JSON", []string{"--tokenizer", tinyTokenizer, "--chat"}, "{"},
		{"chat input without messages", []string{"--tokenizer", tinyTokenizer, "--chat"}, "{}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := tokenizeCmd(tc.args, strings.NewReader(tc.stdin), &stdout, &stderr)
			if err == nil {
				t.Fatal("no error")
			}
			if tc.args == nil && !errors.Is(err, errUsage) {
				t.Errorf("err %v, want a usage error", err)
			}
		})
	}
}
