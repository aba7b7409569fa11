package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/scale"
)

// scaleCmd runs the fleet-scale sizes and writes docs/results/scale.md, or prints
// it with --out "".
func scaleCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvsim scale", flag.ContinueOnError)
	out := fs.String("out", "docs/results/scale.md", "page to write; empty prints it")
	engines := fs.Int("engines", 0, "run one size of this many engines instead of 1k and 10k")
	pools := fs.Int("pools", 4, "pools of the one size --engines gives")
	limit := fs.Duration("timeout", 15*time.Minute, "bound on the whole run")
	if err := fs.Parse(args); err != nil {
		return err
	}
	sizes := scale.Sizes(1)
	if *engines != 0 {
		if *engines < 0 || *pools <= 0 {
			return fmt.Errorf("--engines and --pools must be positive")
		}
		sizes = []scale.Options{{Engines: *engines, Pools: *pools, Seed: 1}}
	}
	ctx, cancel := context.WithTimeout(ctx, *limit)
	defer cancel()
	var reps []scale.Report
	for _, o := range sizes {
		r, err := scale.Run(ctx, o)
		if err != nil {
			return fmt.Errorf("%d engines: %w", o.Engines, err)
		}
		fmt.Fprintf(os.Stderr, "%d engines: %d picks, %d batches in %s; ingest %.0f events/s per core; %.0f B per holding; hit rate %.3f\n",
			o.Engines, r.Fleet.Routes, r.Fleet.Batches, r.Wall.Round(time.Second), r.Ingest.EventsPerCoreSecond(), r.Ingest.BytesPerHolding(), r.Fleet.HitRate)
		reps = append(reps, r)
	}
	var page bytes.Buffer
	if err := scale.WriteReport(&page, reps, "make scale"); err != nil {
		return err
	}
	if *out == "" {
		_, err := os.Stdout.Write(page.Bytes())
		return err
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*out, page.Bytes(), 0o644)
}
