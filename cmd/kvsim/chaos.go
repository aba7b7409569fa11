package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/chaos"
)

// chaosCmd runs the fault matrix and writes its table to
// docs/results/chaos.md, or prints it with --out "".
func chaosCmd(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("kvsim chaos", flag.ContinueOnError)
	out := fs.String("out", "docs/results/chaos.md", "page to write; empty prints the table")
	limit := fs.Duration("timeout", 10*time.Minute, "bound on the whole run")
	verbose := fs.Bool("v", false, "log the components' warnings to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	start := time.Now()
	results, runErr := chaos.RunAll(ctx, *limit, logger)
	for _, r := range results {
		status := "settled"
		switch {
		case r.Err != nil:
			status = "error: " + r.Err.Error()
		case !r.Converged || !r.Agree:
			status = "did not settle: " + r.Detail
		}
		fmt.Fprintf(os.Stderr, "%-28s %s in %s; %d false, %d missing at the end; %d picks\n",
			r.Scenario.Name, status, r.Converge.Round(time.Millisecond), r.False, r.Missing, r.Picks.Total)
	}
	var table bytes.Buffer
	tableErr := chaos.WriteTable(&table, results, time.Since(start))
	if *out == "" {
		_, _ = os.Stdout.Write(table.Bytes())
	} else if err := chaos.WritePage(*out, table.Bytes()); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	return tableErr
}
