package events

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoldenVectorsMatchTheirGenerator re-runs the independent generator
// and requires the committed vectors to be exactly what it writes, so that
// neither drifts from the other. Vectors with a .hex payload are written
// by hand and are exempt.
func TestGoldenVectorsMatchTheirGenerator(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3"
	// make test installs the encoder's packages and sets KVROUTE_NO_SKIPS:
	// there, a missing one is a broken set-up, not a reason to skip.
	skip := t.Skipf
	if os.Getenv("KVROUTE_NO_SKIPS") != "" || os.Getenv("CI") != "" {
		skip = t.Fatalf
	}
	if _, err := os.Stat(python); err != nil {
		skip("%s not found; install it with: apt-get install -y python3 python3-msgpack", python)
	}
	if out, err := exec.Command(python, "-c", "import msgpack").CombinedOutput(); err != nil {
		skip("python3-msgpack is not importable (%v: %s); install it with: apt-get install -y python3-msgpack",
			err, bytes.TrimSpace(out))
	}
	script := filepath.Join("..", "..", "scripts", "gen-golden-events.py")
	dir := t.TempDir()
	if out, err := exec.Command(python, script, "--out", dir).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}

	generated, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	made := make(map[string]bool)
	for _, f := range generated {
		made[f.Name()] = true
		want, err := os.ReadFile(filepath.Join(dir, f.Name()))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("testdata", f.Name()))
		if err != nil {
			t.Errorf("testdata/%s is missing; run the generator", f.Name())
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("testdata/%s differs from what %s writes; run it", f.Name(), script)
		}
	}

	committed, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range committed {
		name := f.Name()
		base := strings.TrimSuffix(strings.TrimSuffix(name, ".json"), ".msgpack")
		if made[name] || strings.HasSuffix(name, ".hex") || f.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join("testdata", base+".hex")); err == nil {
			continue
		}
		t.Errorf("testdata/%s is not written by the generator: remove it or add it there", name)
	}
}
