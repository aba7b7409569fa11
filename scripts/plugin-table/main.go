// Command plugin-table rewrites the table of upstream plugin types in
// docs/plugins.md from the loader's own classification (config.UpstreamTable),
// between its markers. Run it from the repository's root after changing
// pkg/scheduling/config/compat_types.go; a test fails until the docs agree.
package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/kvroute/kvroute/pkg/scheduling/config"
)

const doc = "docs/plugins.md"

func main() {
	text, err := os.ReadFile(doc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	before, rest, ok1 := strings.Cut(string(text), config.UpstreamTableBegin)
	_, after, ok2 := strings.Cut(rest, config.UpstreamTableEnd)
	if !ok1 || !ok2 {
		fmt.Fprintf(os.Stderr, "%s: the table's markers are missing\n", doc)
		os.Exit(1)
	}
	out := before + config.UpstreamTableBegin + "\n" + config.UpstreamTable() + config.UpstreamTableEnd + after
	if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
