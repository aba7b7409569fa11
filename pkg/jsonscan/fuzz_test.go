package jsonscan

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var seeds = []string{
	`[{"role":"user","content":"hi\n\"there\"","n":-1.5e3,"b":[true,false,null],"e":{}}]`,
	`{"model":"m","messages":[{"role":"system","content":"You are helpful."},{"role":"user","content":"Hi"}],"stream":true}`,
	`{"a\"b":"x\\\"y","a\u0062":[1,"]",{"}":"\\"}],"e":-1.5e3,"t":true , "n" : null }`,
	`{"k":"v","k":"w"}`,
	`{"model":"a","mod\u0065l":"b","\u006dodel":1,"Model":"c","model\u0000":"d","max_tokens":7}`,
	`{"prompt":[1 , 2 ,3] , "x":[1e5,-0,0.5E+2,"\u00e9\ud83d"]}`,
	`{"prompt":[1,2,],"a":[tru]}`, "{\"a\":\"\x01\"}", `[:`, `[}`, `{"a":}`, `{"a" 1}`, `{"a":1:2}`,
	`"\ud83d\ude00"`, `"\ud83d"`, `"\ud83d\u0041"`, `"\udc00\ud800"`, "\"\xff\xfe\"", `"a\/b\\"`,
	`01`, `-`, `1.`, `1e`, `-0.5E+7`, `[1,]`, ` [ ] `, `tru`, `nulls`, "\"\t\"", `"\x"`, `"\u12g4"`, `"abc\"`,
	strings.Repeat("[", 70) + strings.Repeat("]", 70),
}

// FuzzReader holds the validator and the readers to encoding/json: the
// same verdict on validity, the same end of each value, the same members
// and elements, the same decoded strings. On input that is not valid the
// readers must still return, within the input.
func FuzzReader(f *testing.F) {
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		valid := Valid(data)
		if want := json.Valid(data); valid != want {
			t.Fatalf("Valid(%q) = %v, encoding/json says %v", data, valid, want)
		}
		start := SkipSpace(data, 0)
		end := SkipValue(data, start)
		if end < start || end > len(data) {
			t.Fatalf("SkipValue(%q, %d) = %d, outside the input", data, start, end)
		}
		if !valid {
			// Not valid: the readers only have to return.
			_ = SplitArray(data)
			_, _ = SplitObject(data)
			_, _ = DecodeString(data)
			return
		}
		if SkipSpace(data, end) != len(data) {
			t.Fatalf("SkipValue(%q) stops at %d", data, end)
		}
		switch data[start] {
		case '"':
			got, err := DecodeString(data[start:end])
			var want string
			if werr := json.Unmarshal(data, &want); err != nil || werr != nil || got != want {
				t.Fatalf("DecodeString(%q) = %q, %v; encoding/json gives %q, %v", data, got, err, want, werr)
			}
		case '[':
			sameElements(t, "the document", data, SplitArray(data))
		case '{':
			var want map[string]json.RawMessage
			if err := json.Unmarshal(data, &want); err != nil {
				t.Fatal(err)
			}
			got, err := SplitObject(data)
			if err != nil {
				t.Fatalf("SplitObject: %v", err)
			}
			if len(got) != len(want) {
				t.Fatalf("%d members, encoding/json finds %d", len(got), len(want))
			}
			for k, v := range want {
				if !bytes.Equal(got[k], bytes.TrimSpace(v)) {
					t.Fatalf("member %q = %q, encoding/json reads %q", k, got[k], v)
				}
				if v[0] == '[' {
					sameElements(t, k, v, SplitArray(got[k]))
				}
			}
		}
	})
}

// sameElements checks that split are array's elements as encoding/json
// reads them.
func sameElements(t *testing.T, name string, array []byte, split []json.RawMessage) {
	t.Helper()
	var elems []json.RawMessage
	if err := json.Unmarshal(array, &elems); err != nil {
		t.Fatal(err)
	}
	if len(split) != len(elems) {
		t.Fatalf("%s has %d elements, encoding/json finds %d", name, len(split), len(elems))
	}
	for i := range elems {
		if !bytes.Equal(split[i], bytes.TrimSpace(elems[i])) {
			t.Fatalf("element %d of %s = %q, encoding/json reads %q", i, name, split[i], elems[i])
		}
	}
}

// FuzzDecodeString holds the string decoder to encoding/json on every
// valid string literal: escapes, surrogates (paired, lone, broken) and
// invalid UTF-8 all decode alike. Any other input must not panic it.
func FuzzDecodeString(f *testing.F) {
	for _, s := range []string{`"plain"`, `"a\nb\"c\\d\/e\b\f\r\t"`, `"\u00e9\ud83d\ude00"`, `"\ud83d"`, `"\ud83d\u0041"`,
		`"\ude00\ud83d"`, "\"\xff\xfe ok \xc3\"", `"\uD83D\uDE00x"`, `""`, `"\\"`, `"\"`, `"\u00"`, `"\q"`, `"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got, err := DecodeString(raw)
		if end, ok := ValidString(raw, 0); !ok || end != len(raw) || raw[0] != '"' {
			return
		}
		var want string
		if werr := json.Unmarshal(raw, &want); werr != nil {
			t.Fatalf("ValidString accepts %q; encoding/json: %v", raw, werr)
		}
		if err != nil || got != want {
			t.Fatalf("DecodeString(%q) = %q, %v; encoding/json says %q", raw, got, err, want)
		}
	})
}
