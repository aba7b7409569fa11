package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/request"
)

const tinyDir = "testdata/tiny"

func loadTiny(t testing.TB, opts Options) *Tokenizer {
	t.Helper()
	tok, err := Load(tinyDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestTinyTokenizerMatchesReferenceOnFlagsNormalizerAndTemplate(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("testdata/golden-tiny.json")
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	if err := json.Unmarshal(data, &g); err != nil {
		t.Fatal(err)
	}
	tok := loadTiny(t, Options{})
	for _, c := range g.Texts {
		t.Run(fmt.Sprintf("%q", c.Text), func(t *testing.T) {
			t.Parallel()
			for _, special := range []bool{false, true} {
				want := c.IDs
				if special {
					want = c.IDsSpecial
				}
				got, err := tok.Encode(c.Text, special)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Errorf("special=%v: got %v, want %v", special, got, want)
				}
			}
		})
	}
}

// corpus returns varied texts for equivalence checks: the golden texts of
// the real models when present, and random mixtures of the characters each
// branch of the pattern cares about.
func corpus(t *testing.T) []string {
	texts := []string{"", " ", "a", "'s", "'S'll", "x'", "  \n \r\n\t x", " \u00a0\u3000y", "1234567", "١٢٣٤", "$100", "e\u0301"}
	pieces := []string{" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u2009", "\u3000", "a", "Zz", "é", "日本", "ß",
		"1", "22", "333", "٣", "½", "'", "'s", "'LL", "'re", "'x", "!", "?!", "...", "😀", "\u0301", "_", "-", "\x1c", "\x00", "\u200b"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		var b strings.Builder
		for range 1 + r.IntN(12) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		texts = append(texts, b.String())
	}
	for _, model := range goldenModels {
		if _, err := os.Stat(filepath.Join("testdata", "golden-"+model+".json.gz")); err == nil {
			for _, c := range readGolden(t, model).Texts {
				texts = append(texts, c.Text)
			}
		}
	}
	return texts
}

func TestScannerSplitsExactlyAsTheBacktrackingRegexp(t *testing.T) {
	t.Parallel()
	texts := corpus(t)
	for _, tc := range []struct {
		name    string
		pattern string
	}{
		{"Llama 3's pattern with three-digit groups", patternDigits3},
		{"Qwen's pattern with single digits", patternDigits1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fast, err := newSplitter(tc.pattern)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := fast.(scanner); !ok {
				t.Fatalf("pattern got %T, want the hand-written scanner", fast)
			}
			slow := regexpSplitter{re: regexp2.MustCompile(tc.pattern, regexp2.None)}
			for _, text := range texts {
				got, _ := fast.split(text, nil)
				want, err := slow.split(text, nil)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("split of %q: scanner %v, regexp %v", text, got, want)
				}
			}
		})
	}
}

func TestHeapMergeAgreesWithSimpleMergeOnLongWords(t *testing.T) {
	t.Parallel()
	tok := realTokenizer(t, "qwen3")
	r := rand.New(rand.NewPCG(3, 4))
	alphabet := []string{"a", "b", "ab", "the", "ing", " ", "=", "-", "é", "中"}
	for range 300 {
		var b strings.Builder
		for b.Len() < simpleMergeLimit+1+r.IntN(200) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		word := b.String()
		syms := make([]symbol, 0, len(word))
		for i := 0; i < len(word); i++ {
			syms = append(syms, symbol{id: tok.model.byteID[word[i]], prev: int32(i) - 1, next: int32(i) + 1})
		}
		syms[len(syms)-1].next = -1
		simple := tok.model.mergeSimple(slices.Clone(syms))
		var h pairHeap
		heaped := tok.model.mergeHeap(slices.Clone(syms), &h)
		if !slices.Equal(ids(simple), ids(heaped)) {
			t.Fatalf("word %q: simple %v, heap %v", word, ids(simple), ids(heaped))
		}
	}
}

func ids(syms []symbol) []uint32 {
	out := make([]uint32, len(syms))
	for i, s := range syms {
		out[i] = s.id
	}
	return out
}

func TestDecodeGivesBackTheText(t *testing.T) {
	t.Parallel()
	for _, model := range goldenModels {
		t.Run(model, func(t *testing.T) {
			t.Parallel()
			tok := realTokenizer(t, model)
			for _, text := range corpus(t) {
				if tok.normalize != nil && text != tok.normalize(text) {
					continue // normalization changes the text by design
				}
				got, err := tok.Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				back, err := tok.Decode(got)
				if err != nil || string(back) != text {
					t.Fatalf("decode(encode(%q)) = %q, %v", text, back, err)
				}
			}
		})
	}
}

func TestBadInputHasADefinedOutcome(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	tok := loadTiny(t, Options{Name: "tiny", MaxInputBytes: 64, Registerer: reg})
	t.Run("invalid UTF-8 is tokenized as U+FFFD and counted", func(t *testing.T) {
		got, err := tok.Encode("he\xffllo\xc3", false)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := tok.Encode("he\uFFFDllo\uFFFD", false)
		if !slices.Equal(got, want) {
			t.Errorf("got %v, want %v", got, want)
		}
		if n := testutil.ToFloat64(tok.metrics().invalidUTF8.WithLabelValues("tiny")); n != 1 {
			t.Errorf("invalid UTF-8 counter %v, want 1", n)
		}
	})
	t.Run("an input over the limit is refused with ErrInputTooLarge", func(t *testing.T) {
		_, err := tok.Encode(strings.Repeat("x", 65), false)
		if !errors.Is(err, ErrInputTooLarge) {
			t.Fatalf("err %v, want ErrInputTooLarge", err)
		}
		if n := testutil.ToFloat64(tok.metrics().rejected.WithLabelValues("tiny", "too_large")); n != 1 {
			t.Errorf("rejected counter %v, want 1", n)
		}
	})
	t.Run("an unknown id fails to decode with ErrUnknownID", func(t *testing.T) {
		if _, err := tok.Decode([]uint32{104, 9999}); !errors.Is(err, ErrUnknownID) {
			t.Fatalf("err %v, want ErrUnknownID", err)
		}
	})
}

func TestParseRefusesWhatItCannotReproduce(t *testing.T) {
	t.Parallel()
	base, err := os.ReadFile(filepath.Join(tinyDir, TokenizerFile))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		out, _ := json.Marshal(m)
		return out
	}
	model := func(m map[string]any) map[string]any { return m["model"].(map[string]any) }
	for _, tc := range []struct {
		name string
		file []byte
		want error
	}{
		{"a file that is not JSON", []byte("{"), ErrBadFile},
		{"a WordPiece model", edit(func(m map[string]any) { model(m)["type"] = "WordPiece" }), ErrUnsupported},
		{"byte fallback", edit(func(m map[string]any) { model(m)["byte_fallback"] = true }), ErrUnsupported},
		{"an unknown normalizer", edit(func(m map[string]any) { m["normalizer"] = map[string]any{"type": "Replace"} }), ErrUnsupported},
		{"no pre-tokenizer", edit(func(m map[string]any) { m["pre_tokenizer"] = nil }), ErrUnsupported},
		{"a merge outside the vocabulary", edit(func(m map[string]any) { model(m)["merges"] = []any{"q zz"} }), ErrBadFile},
		{"an invalid split pattern", edit(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Sequence", "pretokenizers": []any{
				map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "(("}, "behavior": "Isolated", "invert": false},
				map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}}}
		}), ErrUnsupported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Parse(tc.file, nil, Options{}); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestSegmentCacheAnswersRepeatedSegmentsWithTheSameIDs(t *testing.T) {
	t.Parallel()
	tok := realTokenizer(t, "qwen3")
	reg := prometheus.NewRegistry()
	cached, err := Load(modelDir("qwen3"), Options{Name: "q", Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	system := strings.Repeat("You are a careful assistant; answer in 日本語 when asked. ", 40)
	for turn := range 3 {
		text := "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\nquestion " + fmt.Sprint(turn) + "<|im_end|>\n"
		got, err := cached.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := tok.Encode(text, false)
		if !slices.Equal(got, want) {
			t.Fatalf("turn %d: cached ids differ from fresh ones", turn)
		}
	}
	if hits := testutil.ToFloat64(cached.metrics().segmentLookups.WithLabelValues("q", "hit")); hits != 2 {
		t.Errorf("segment cache hits %v, want 2", hits)
	}
}

func TestSegmentCacheStaysWithinItsMemoryBound(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	tok := loadTiny(t, Options{Name: "tiny", SegmentCacheBytes: 64 << 10, Registerer: reg})
	for i := range 2000 {
		if _, err := tok.Encode(fmt.Sprintf("%d %s", i, strings.Repeat("hello world ", 30)), false); err != nil {
			t.Fatal(err)
		}
	}
	held := testutil.ToFloat64(tok.metrics().segmentBytes.WithLabelValues("tiny"))
	if held <= 0 || held > 64<<10 {
		t.Errorf("cache holds %v bytes, want within (0, %d]", held, 64<<10)
	}
	if testutil.ToFloat64(tok.metrics().segmentEvicted.WithLabelValues("tiny")) == 0 {
		t.Error("no evictions counted")
	}
}

func TestRenderChatHasDefinedErrors(t *testing.T) {
	t.Parallel()
	tok := loadTiny(t, Options{})
	for _, tc := range []struct {
		name string
		chat *request.Chat
		want error
	}{
		{"messages that are not JSON", &request.Chat{Messages: json.RawMessage(`[{`)}, ErrTemplate},
		{"messages that are not a list", &request.Chat{Messages: json.RawMessage(`{"role":"user"}`)}, ErrTemplate},
		{"an empty message list", &request.Chat{Messages: json.RawMessage(`[]`)}, ErrTemplate},
		{"a template given by the request", &request.Chat{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), ChatTemplate: "{{ x }}"}, ErrUnsupported},
		{"an image part", &request.Chat{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]`)}, ErrUnsupported},
		{"both continuation flags", &request.Chat{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), AddGenerationPrompt: true, ContinueFinalMessage: true}, ErrTemplate},
		{"JSON nested beyond the limit", &request.Chat{Messages: json.RawMessage(strings.Repeat("[", 100) + strings.Repeat("]", 100))}, ErrTemplate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := tok.EncodeChat(tc.chat); !errors.Is(err, tc.want) {
				t.Fatalf("err %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRenderChatUsesTheDefaultNamedTemplateAndSpecialTokens(t *testing.T) {
	t.Parallel()
	tok := loadTiny(t, Options{})
	got, err := tok.RenderChat(&request.Chat{
		Messages:            json.RawMessage(`[{"role":"user","content":[{"type":"text","text":" hi "},{"type":"text","text":"there"}]}]`),
		AddGenerationPrompt: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "<s>user: hi \nthere<|sep|>assistant:"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if !utf8.ValidString(got) {
		t.Error("invalid UTF-8")
	}
}

func TestLoadModelsRejectsBadSpecs(t *testing.T) {
	t.Parallel()
	for _, specs := range [][]string{{"noequals"}, {"=dir"}, {"m="}, {"m=" + tinyDir, "m=" + tinyDir}, {"m=/does/not/exist"}} {
		if _, err := LoadModels(specs, Options{}); err == nil {
			t.Errorf("LoadModels(%q) succeeded", specs)
		}
	}
	got, err := LoadModels([]string{"a=" + tinyDir, "b=" + tinyDir + "/" + TokenizerFile}, Options{})
	if err != nil || len(got) != 2 || !got["b"].HasChatTemplate() {
		t.Fatalf("LoadModels = %v, %v", got, err)
	}
}
