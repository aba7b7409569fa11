package jsonscan

import (
	"encoding/binary"
	"encoding/json"
	"strings"
	"testing"
)

func TestValidAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, tc := range []struct{ name, in string }{
		{"an empty input", ``},
		{"only whitespace", " \t\r\n"},
		{"a number with whitespace around it", " -12.5e+3 "},
		{"a leading zero", `012`},
		{"a lone minus", `-`},
		{"a fraction without digits", `1.`},
		{"an exponent without digits", `1e+`},
		{"a literal cut short", `nul`},
		{"a literal with more after it", `truex`},
		{"two values", `1 2`},
		{"a trailing comma", `[1,]`},
		{"an object key that is not a string", `{1:2}`},
		{"a member without a value", `{"a":}`},
		{"a control character in a string", "\"a\x01\""},
		{"a tab in a string", "\"a\tb\""},
		{"invalid UTF-8 in a string", "\"\xff\xfe\""},
		{"every escape", `"\"\\\/\b\f\n\r\t\u00e9\uD83D\uDE00"`},
		{"an unknown escape", `"\x"`},
		{"a short unicode escape", `"\u12"`},
		{"a unicode escape with a letter past f", `"\u12g4"`},
		{"a string without its closing quote", `"abc`},
		{"an escaped closing quote", `"abc\"`},
		{"long plain text, read eight bytes at a time", `"` + strings.Repeat("plain text ", 100) + `"`},
		{"long text with a quote past the eighth byte", `"` + strings.Repeat("x", 37) + `"` + strings.Repeat("y", 20) + `"`},
		{"nesting at encoding/json's limit", nest(MaxDepth)},
		{"nesting one past encoding/json's limit", nest(MaxDepth + 1)},
		{"objects nested at the limit", strings.Repeat(`{"a":`, MaxDepth) + "1" + strings.Repeat("}", MaxDepth)},
		{"objects nested one past the limit", strings.Repeat(`{"a":`, MaxDepth+1) + "1" + strings.Repeat("}", MaxDepth+1)},
	} {
		if got, want := Valid([]byte(tc.in)), json.Valid([]byte(tc.in)); got != want {
			t.Errorf("%s: Valid = %v, encoding/json says %v", tc.name, got, want)
		}
	}
}

func TestPlain8FindsEveryByteThatEndsOrEscapesAString(t *testing.T) {
	t.Parallel()
	// Every byte value in every position, beside neighbours that borrow
	// the most (0x00) and the least (0xFF), and plain text.
	for _, fill := range []byte{0x00, 0x20, 'a', 0x7F, 0x80, 0xFF} {
		for pos := range 8 {
			for c := range 256 {
				var buf [8]byte
				for i := range buf {
					buf[i] = fill
				}
				buf[pos] = byte(c)
				want := true
				for _, b := range buf {
					if b < 0x20 || b == '"' || b == '\\' {
						want = false
					}
				}
				if got := plain8(binary.LittleEndian.Uint64(buf[:])); got != want {
					t.Fatalf("%q: plain %v, want %v", buf, got, want)
				}
			}
		}
	}
}

func TestReadersFindTheEndsOfValues(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		at   int
		end  int
	}{
		{"a number before a comma", `[12,3]`, 1, 3},
		{"a literal before a closing bracket", `[true]`, 1, 5},
		{"a string with an escaped quote", `"a\"b" `, 0, 6},
		{"a string ending in an escaped backslash", `"a\\" `, 0, 5},
		{"a string of three backslashes and a quote", `"\\\"" `, 0, 6},
		{"an array holding brackets in strings", `[1,"]",{"}":"\\"}] x`, 0, 18},
		{"a value at the end of the input", `7`, 0, 1},
		{"past the end of the input", `7`, 1, 1},
	} {
		if got := SkipValue([]byte(tc.in), tc.at); got != tc.end {
			t.Errorf("%s: SkipValue(%q, %d) = %d, want %d", tc.name, tc.in, tc.at, got, tc.end)
		}
	}
}

func TestSplitObjectKeepsTheLastOfRepeatedKeysAndDecodesThem(t *testing.T) {
	t.Parallel()
	got, err := SplitObject([]byte(` {"k":1, "\u006b" : [2, 3] ,"n":null} `))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || string(got["k"]) != "[2, 3]" || string(got["n"]) != "null" {
		t.Fatalf("members %q, want k=[2, 3] and n=null", got)
	}
	elems := SplitArray(got["k"])
	if len(elems) != 2 || string(elems[0]) != "2" || string(elems[1]) != "3" {
		t.Fatalf("elements %q, want 2 and 3", elems)
	}
}

func TestReadersReturnOnInputThatIsNotValid(t *testing.T) {
	t.Parallel()
	// Each once looped for ever, or cut a slice past its end, in a reader
	// that trusted its input.
	for _, in := range []string{`[:`, `[}`, `[,`, `[1:`, `{"a"`, `{"a":`, `{"a":1:2}`, `{"a":]`, `{"a":}`, `{`, `[`, `"`, `{"\`} {
		_ = SplitArray([]byte(in))
		_, _ = SplitObject([]byte(in))
		_, _ = DecodeString([]byte(in))
	}
}

func TestDecodeStringAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in string }{
		{"plain text", `"plain"`},
		{"every escape", `"a\nb\"c\\d\/e\b\f\r\t"`},
		{"a surrogate pair", `"\ud83d\ude00"`},
		{"a lone high surrogate", `"\ud83d"`},
		{"a high surrogate before a letter", `"\ud83d\u0041"`},
		{"a low surrogate before a high one", `"\ude00\ud83d"`},
		{"invalid UTF-8 without escapes", "\"\xff\xfe ok \xc3\""},
		{"invalid UTF-8 beside an escape", "\"\xff\\n\xc3\""},
		{"an empty string", `""`},
	} {
		var want string
		if err := json.Unmarshal([]byte(tc.in), &want); err != nil {
			t.Fatalf("%s: encoding/json: %v", tc.name, err)
		}
		if got, err := DecodeString([]byte(tc.in)); err != nil || got != want {
			t.Errorf("%s: DecodeString(%q) = %q, %v; want %q", tc.name, tc.in, got, err, want)
		}
	}
	for _, in := range []string{``, `"`, `abc`, `"abc\"`, `"\u12"`, `"\q"`, `1`} {
		if got, err := DecodeString([]byte(in)); err == nil {
			t.Errorf("DecodeString(%q) = %q with no error", in, got)
		}
	}
}
