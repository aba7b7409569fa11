package config_test

import (
	"os"
	"strings"
	"testing"
)

// TestDocumentedExampleLoads keeps docs/plugins.md honest: its example
// configuration must load as written.
func TestDocumentedExampleLoads(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/plugins.md")
	if err != nil {
		t.Fatalf("read the docs: %v", err)
	}
	_, rest, ok := strings.Cut(string(doc), "```yaml\n")
	if !ok {
		t.Fatal("docs/plugins.md has no yaml example")
	}
	example, _, _ := strings.Cut(rest, "```")
	l, err := registryWithProducer(t).Load([]byte(example), nil)
	if err != nil {
		t.Fatalf("documented example: %v", err)
	}
	if got := l.Detector.TypedName().Name; got != "admission" {
		t.Errorf("detector = %s, want admission", got)
	}
	if len(l.Profiles) != 1 || len(l.Profiles[0].Filters) != 1 || len(l.Profiles[0].Scorers) != 2 {
		t.Errorf("profile = %+v", l.Profiles)
	}
}
