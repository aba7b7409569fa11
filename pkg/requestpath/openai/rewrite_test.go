package openai

import (
	"encoding/json"
	"errors"
	"maps"
	"testing"
)

func TestReplaceModelChangesTheModelAndNothingElse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, body, model, want string
	}{
		{"a compact body", `{"model":"a","prompt":"x"}`, "b", `{"model":"b","prompt":"x"}`},
		{"spacing and order are kept", `{ "max_tokens" : 100 ,  "model" : "sql-lora" , "prompt":"t" }`, "sql-lora-1fdg2",
			`{ "max_tokens" : 100 ,  "model" : "sql-lora-1fdg2" , "prompt":"t" }`},
		{"a nested model is left alone", `{"meta":{"model":"x"},"model":"a"}`, "b", `{"meta":{"model":"x"},"model":"b"}`},
		{"an escaped key is still the model", `{"mod\u0065l":"a"}`, "b", `{"mod\u0065l":"b"}`},
		{"every model given twice is replaced, as the last one wins", `{"model":"a","x":1,"model":"c"}`, "b", `{"model":"b","x":1,"model":"b"}`},
		{"a model that is not a string becomes one", `{"model":7}`, "b", `{"model":"b"}`},
		{"the new name is escaped", `{"model":"a"}`, `q"\`, `{"model":"q\"\\"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ReplaceModel([]byte(tt.body), tt.model)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("got %s\nwant %s", got, tt.want)
			}
		})
	}
	for _, bad := range []string{``, `[]`, `{"prompt":"x"}`, `{"model":"a"`, `{"model" "a"}`, `"model"`} {
		if _, err := ReplaceModel([]byte(bad), "b"); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := ReplaceModel([]byte(`{"prompt":"x"}`), "b"); !errors.Is(err, ErrNoModelMember) {
		t.Errorf("a body without a model: err = %v, want ErrNoModelMember", err)
	}
}

// FuzzReplaceModel: whatever the body, ReplaceModel never panics; when it
// answers, the answer is valid JSON naming the new model, with every
// other top-level member as it was.
func FuzzReplaceModel(f *testing.F) {
	for _, s := range requestSeeds {
		f.Add([]byte(s.body), "target")
	}
	f.Add([]byte(`{"model":"a","model":{"x":[1,"}"]}}`), `"`)
	f.Add([]byte(`{"mo\"del":"a","model":"b"}`), "c")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		out, err := ReplaceModel(body, model)
		if err != nil {
			return
		}
		var before, after map[string]json.RawMessage
		if json.Unmarshal(body, &before) != nil {
			t.Fatalf("rewrote %q, which is not a JSON object", body)
		}
		if err := json.Unmarshal(out, &after); err != nil {
			t.Fatalf("rewrote %q into %q, which is not a JSON object: %v", body, out, err)
		}
		var got string
		if err := json.Unmarshal(after["model"], &got); err != nil {
			t.Fatalf("model %s: %v", after["model"], err)
		}
		var want string
		wb, _ := json.Marshal(model)
		_ = json.Unmarshal(wb, &want)
		if got != want {
			t.Fatalf("model %q, want %q", got, want)
		}
		delete(before, "model")
		delete(after, "model")
		if !maps.EqualFunc(before, after, func(a, b json.RawMessage) bool { return string(a) == string(b) }) {
			t.Fatalf("other members changed: %q → %q", body, out)
		}
	})
}
