package config_test

import (
	"os"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/scheduling/config"
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

// TestUpstreamTableIsCurrent keeps docs/plugins.md's table of upstream
// types in step with the loader's classification.
func TestUpstreamTableIsCurrent(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../../docs/plugins.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), config.UpstreamTableBegin+"\n")
	table, _, ok2 := strings.Cut(rest, config.UpstreamTableEnd)
	if !ok || !ok2 {
		t.Fatal("docs/plugins.md lacks the upstream table's markers")
	}
	if table != config.UpstreamTable() {
		t.Error("docs/plugins.md's upstream table is out of date: run `go run ./scripts/plugin-table`")
	}
}
