// Command kvctl is the operator's tool for kvroute's KV-event streams:
// decoding vLLM batches, watching a pool's events on NATS, and asking the
// index what an endpoint holds.
//
// Each subcommand lives in its own file and registers itself in commands
// from an init function, so adding one touches nothing else.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

// command is one kvctl subcommand.
type command struct {
	// summary is the one line `kvctl help` shows.
	summary string
	// run gets the arguments after the subcommand's name. An error is
	// printed to stderr and exits 1, except those parseFlags returns, which
	// the flag package has already reported.
	run func(args []string) error
}

// errUsage marks bad command-line flags, already reported with the usage.
var errUsage = errors.New("bad usage")

// parseFlags parses a subcommand's flags. Its errors need no more printing:
// kvctl exits 0 for -h and 2 for anything else.
func parseFlags(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	return fmt.Errorf("%w: %w", errUsage, err)
}

// commands holds every subcommand by name; files add theirs in init.
var commands = map[string]command{}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run dispatches args to a subcommand and returns the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return 2
	}
	name := args[0]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			// `kvctl help decode` is `kvctl decode -h`.
			return run([]string{args[1], "-h"}, stdout, stderr)
		}
		usage(stdout)
		return 0
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "kvctl: unknown command %q\n\n", name)
		usage(stderr)
		return 2
	}
	if err := cmd.run(args[1:]); err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp):
			return 0
		case errors.Is(err, errUsage):
			return 2
		}
		fmt.Fprintf(stderr, "kvctl %s: %v\n", name, err)
		return 1
	}
	return 0
}

func usage(w io.Writer) {
	names := make([]string, 0, len(commands))
	width := 0
	for name := range commands {
		names = append(names, name)
		width = max(width, len(name))
	}
	slices.Sort(names)
	var b strings.Builder
	b.WriteString("Usage: kvctl <command> [flags]\n\nCommands:\n")
	for _, name := range names {
		fmt.Fprintf(&b, "  %-*s  %s\n", width, name, commands[name].summary)
	}
	fmt.Fprintf(&b, "  %-*s  %s\n", width, "help", "show this list, or `help <command>` for its flags")
	_, _ = io.WriteString(w, b.String())
}
