package testkit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// echo answers "echo" with its argument and fails every other op.
func echo(op string, arg json.RawMessage) (any, error) {
	if op != "echo" {
		return nil, errors.New("no such op")
	}
	return arg, nil
}

// serve runs ServeChild over in and returns its greeting and answers.
func serve(t testing.TB, in string) (hello string, answers []childAnswer) {
	var out bytes.Buffer
	if err := ServeChild(strings.NewReader(in), &out, "hi", echo); err != nil {
		t.Fatalf("ServeChild over %q: %v", in, err)
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(nil, maxChildLine)
	for first := true; sc.Scan(); first = false {
		if first {
			hello = sc.Text()
			continue
		}
		var a childAnswer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("answer %q: %v", sc.Text(), err)
		}
		answers = append(answers, a)
	}
	return hello, answers
}

// A child greets, answers every line in order (its own stats, the
// handler's ops, and an error for what it cannot read), and ends with its
// input.
func TestAChildAnswersEveryLineInOrder(t *testing.T) {
	t.Parallel()
	hello, answers := serve(t, `{"op":"stats"}`+"\n"+`{"op":"echo","arg":[1,2]}`+"\n"+`{"op":"nope"}`+"\n"+`not json`+"\n")
	if hello != `"hi"` {
		t.Errorf("greeting %s, want \"hi\"", hello)
	}
	if len(answers) != 4 {
		t.Fatalf("%d answers to 4 requests: %+v", len(answers), answers)
	}
	var st ProcessStats
	if err := json.Unmarshal(answers[0].Value, &st); err != nil || st.CPU <= 0 || st.Allocs == 0 {
		t.Errorf("stats answered %s (%v), want this process's totals", answers[0].Value, err)
	}
	if string(answers[1].Value) != "[1,2]" || answers[1].Err != "" {
		t.Errorf("echo answered %+v, want [1,2]", answers[1])
	}
	if answers[2].Err == "" || answers[3].Err == "" {
		t.Errorf("an unknown op and a line that is not JSON answered %+v and %+v, want errors", answers[2], answers[3])
	}
}

// Whatever its parent writes, a child answers each line with JSON and
// never panics.
func FuzzServeChild(f *testing.F) {
	f.Add([]byte(`{"op":"echo","arg":{"a":1}}` + "\n" + `{"op":"stats"}`))
	f.Add([]byte("\n\n{\"op\":1}\n{"))
	f.Add([]byte(`{"op":"echo","arg":"\u0000"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		_, answers := serve(t, string(in))
		lines := 0
		sc := bufio.NewScanner(bytes.NewReader(in))
		sc.Buffer(nil, maxChildLine)
		for sc.Scan() {
			lines++
		}
		if len(answers) != lines {
			t.Errorf("%d answers to %d lines", len(answers), lines)
		}
	})
}
