package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunDispatchesByName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"no command prints the usage and fails", nil, 2, "", "Usage: kvctl"},
		{"help lists every command", []string{"help"}, 0, "decode", ""},
		{"help for a known command succeeds", []string{"help", "decode"}, 0, "", ""},
		{"help for an unknown command fails", []string{"help", "frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"an unknown command fails and lists the known ones", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"a failing command reports its error", []string{"decode", "--hex", "c1"}, 1, "", "kvctl decode: malformed kv event batch"},
		{"a bad flag fails as bad usage", []string{"decode", "--nope"}, 2, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(tc.args, &stdout, &stderr)
			if code != tc.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.wantStdout) {
				t.Errorf("stdout %q, want it to contain %q", stdout.String(), tc.wantStdout)
			}
			if !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("stderr %q, want it to contain %q", stderr.String(), tc.wantStderr)
			}
		})
	}
}

func TestEveryCommandHasASummary(t *testing.T) {
	t.Parallel()
	for name, c := range commands {
		if c.summary == "" || c.run == nil {
			t.Errorf("command %q is registered without a summary or a function", name)
		}
	}
}
