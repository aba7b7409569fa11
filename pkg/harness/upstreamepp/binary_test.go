package upstreamepp

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBinaryRefusesAnythingButThePinnedBuild points KVROUTE_UPSTREAM_EPP
// at what is not the pinned upstream EPP: nothing, a file that is no Go
// binary (a half-written build), and a Go binary of another module (this
// test's own).
func TestBinaryRefusesAnythingButThePinnedBuild(t *testing.T) {
	junk := filepath.Join(t.TempDir(), "epp")
	if err := os.WriteFile(junk, []byte("#!/bin/sh\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, says string }{
		{"a missing file", filepath.Join(t.TempDir(), "none"), "run scripts/upstream-epp.sh"},
		{"a file that is no Go binary", junk, "no Go build information"},
		{"a Go binary of another module", self, "want " + Version},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(BinaryEnv, tc.path)
			_, err := Binary()
			if !errors.Is(err, ErrNoBinary) || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Binary() = %v; want ErrNoBinary saying %q", err, tc.says)
			}
		})
	}
}
