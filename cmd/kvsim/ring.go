package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvroute/kvroute/pkg/harness/loadgen"
)

// ringReport regenerates the ring's results in the routing benchmark's
// document from the runs scripts/ring-bench.sh left, so that the document
// says only what those runs measured.
func ringReport(args []string) error {
	fs := flag.NewFlagSet("kvsim ring-report", flag.ContinueOnError)
	dir := fs.String("dir", filepath.Join("docs", "results", "routing-ring"), "folder of the ring's runs, one folder each")
	doc := fs.String("doc", filepath.Join("docs", "routing-benchmark.md"), "document whose ring results are replaced")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runs, err := loadgen.ReadRingRuns(*dir)
	if err != nil {
		return err
	}
	if len(runs) == 0 {
		return fmt.Errorf("no finished ring run under %s (scripts/ring-bench.sh)", *dir)
	}
	old, err := os.ReadFile(*doc)
	if err != nil {
		return err
	}
	var body strings.Builder
	loadgen.WriteRingResults(&body, runs)
	out, err := loadgen.SpliceRing(string(old), body.String())
	if err != nil {
		return fmt.Errorf("%s: %w", *doc, err)
	}
	if err := os.WriteFile(*doc, []byte(out), 0o644); err != nil {
		return err
	}
	printChecks(loadgen.RingChecks(runs))
	fmt.Printf("wrote %s from %d runs\n", *doc, len(runs))
	return nil
}
