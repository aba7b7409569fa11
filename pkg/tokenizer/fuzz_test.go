package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
	"github.com/dlclark/regexp2/v2"

	"github.com/kvroute/kvroute/pkg/request"
)

var fuzzSeeds = []string{
	"", " ", "hello world", "I'll go", "  \n\r\n\t x", "1234567", "<|im_start|>user\nhi<|im_end|>",
	"<|begin_of_text|><|eot_id|>", "e\u0301 😀 日本語", "\xff\xfe", "a\u00a0\u3000b", "'S'LL'x", "$$$\n\n",
}

// FuzzEncode checks that any input tokenizes without a panic and that the
// ids decode to the input bytes (the model without a normalizer is used, so
// the text is kept as it is; invalid UTF-8 comes back as U+FFFD).
func FuzzEncode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	tok := realTokenizer(f, "llama3")
	f.Fuzz(func(t *testing.T, text string) {
		ids, err := tok.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		back, err := tok.Decode(ids)
		if err != nil {
			t.Fatal(err)
		}
		want := text
		if !utf8.ValidString(text) {
			want = replaceInvalid(text)
		}
		if string(back) != want {
			t.Fatalf("decode(encode(%q)) = %q", text, back)
		}
	})
}

// FuzzScanner checks the hand-written pre-tokenizer against the
// backtracking regexp it replaces.
func FuzzScanner(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	slow3 := regexpSplitter{re: regexp2.MustCompile(patternDigits3, regexp2.None)}
	slow1 := regexpSplitter{re: regexp2.MustCompile(patternDigits1, regexp2.None)}
	f.Fuzz(func(t *testing.T, text string) {
		if !utf8.ValidString(text) {
			return // the tokenizer replaces invalid bytes before splitting
		}
		for _, c := range []struct {
			fast scanner
			slow regexpSplitter
		}{{scanner{maxDigits: 3}, slow3}, {scanner{maxDigits: 1}, slow1}} {
			got, _ := c.fast.split(text, nil)
			want, err := c.slow.split(text, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("split of %q (digits %d): scanner %v, regexp %v", text, c.fast.maxDigits, got, want)
			}
		}
	})
}

// FuzzRenderChat checks that any messages JSON renders or fails with an
// error, never a panic, through a real model's template.
func FuzzRenderChat(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":"hi"}]`,
		`[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"<think>\nr\n</think>\n\na"}]`,
		`[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{\"a\":1}"}}]}]`,
		`[{"role":"user","content":[{"type":"text","text":"a"}]}]`, `[1]`, `{}`, `[{"content":{}}]`, `[[[[`,
	} {
		f.Add(s, true)
	}
	tok := realTokenizer(f, "qwen3")
	f.Fuzz(func(t *testing.T, messages string, addGen bool) {
		_, _ = tok.EncodeChat(&request.Chat{Messages: json.RawMessage(messages), AddGenerationPrompt: addGen})
	})
}

// FuzzParse checks that any tokenizer file loads or fails with an error.
func FuzzParse(f *testing.F) {
	tiny, err := os.ReadFile(filepath.Join(tinyDir, TokenizerFile))
	if err != nil {
		f.Fatal(err)
	}
	config, err := os.ReadFile(filepath.Join(tinyDir, ConfigFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(tiny, config)
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[["a","a"]]}}`), []byte(`{"chat_template":"{{"}`))
	f.Add([]byte(`{"added_tokens":[{"id":4294967295,"content":"x"}]}`), []byte(`null`))
	f.Fuzz(func(t *testing.T, file, config []byte) {
		tok, err := Parse(file, config, Options{})
		if err != nil {
			return
		}
		_, _ = tok.Encode("hello <s> world", true)
	})
}

// FuzzDecodeJSONValue holds the decoder of chat JSON to encoding/json's
// token stream, which it replaced: the same values, keys in the same
// order, and an error for the same inputs.
func FuzzDecodeJSONValue(f *testing.F) {
	for _, s := range []string{
		`[{"role":"user","content":"hi\n\"there\"","n":-1.5e3,"b":[true,false,null],"e":{}}]`,
		`{"b":1,"a":2,"b":3}`, `[]`, ` [ 1 , 2 ] `, `"\ud83d\ude00"`, `[1,]`, `{"a"}`, `[1] [2]`, "[\"\xff\"]",
		strings.Repeat("[", 70) + strings.Repeat("]", 70),
	} {
		f.Add([]byte(s))
	}
	var dump func(v jinja.Value) string
	dump = func(v jinja.Value) string {
		switch {
		case v.IsDict():
			var b strings.Builder
			b.WriteString("{")
			for _, k := range v.AsDict().Keys {
				e, _ := v.AsDict().Get(k)
				fmt.Fprintf(&b, "%q:%s,", k, dump(e))
			}
			return b.String() + "}"
		case v.IsList():
			var b strings.Builder
			b.WriteString("[")
			for _, e := range v.AsList().Items {
				b.WriteString(dump(e) + ",")
			}
			return b.String() + "]"
		case v.IsString():
			return fmt.Sprintf("%q", v.AsString())
		}
		return fmt.Sprintf("%T:%v", v, v.String())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := decodeJSONValue(data)
		want, werr := decodeJSONStream(data)
		if (err == nil) != (werr == nil) {
			t.Fatalf("decodeJSONValue(%q): error %v; the token stream's %v", data, err, werr)
		}
		if err == nil && dump(got) != dump(want) {
			t.Fatalf("decodeJSONValue(%q) = %s; the token stream gives %s", data, dump(got), dump(want))
		}
	})
}
