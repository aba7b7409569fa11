package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
)

func init() {
	commands["lookup"] = command{
		summary: "ask a running EPP which endpoints hold a prompt's prefix, and in which tier",
		run: func(args []string) error {
			return lookupCmd(args, os.Stdin, os.Stdout, os.Stderr)
		},
	}
}

// lookupCmd posts a prefix query to an EPP's /debug/prefix and prints the
// answer, as a table or as the EPP's JSON.
func lookupCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lookup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "http://127.0.0.1:9091", "the EPP's --debug-addr `URL` (port-forward it: it is never on a Service)")
	var q prefixquery.Query
	fs.StringVar(&q.Model, "model", "", "only endpoints serving this model (default: all)")
	fs.StringVar(&q.LoRA, "lora", "", "the request's LoRA adapter")
	fs.StringVar(&q.CacheSalt, "cache-salt", "", "the request's cache_salt")
	tokens := fs.String("tokens", "", "comma-separated token `ids`; '-' reads a JSON array from stdin")
	asJSON := fs.Bool("json", false, "print the EPP's JSON answer")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kvctl lookup --tokens 1,2,3 [--model M] [--addr URL]\n\n"+
			"Asks a running EPP who holds this prompt: every endpoint's matched blocks,\n"+
			"their tiers, and whether the answer is exact.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	switch *tokens {
	case "":
		return errors.New("--tokens is required")
	case "-":
		if err := json.NewDecoder(io.LimitReader(stdin, 64<<20)).Decode(&q.TokenIDs); err != nil {
			return fmt.Errorf("token ids on stdin: want a JSON array of non-negative integers: %w", err)
		}
	default:
		ids, err := prefixquery.ParseTokenList(*tokens)
		if err != nil {
			return fmt.Errorf("--tokens: %w", err)
		}
		q.TokenIDs = ids
	}

	body, _ := json.Marshal(q)
	client := &http.Client{Timeout: *timeout}
	resp, err := client.Post(strings.TrimSuffix(*addr, "/")+"/debug/prefix", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(raw)))
	}
	if *asJSON {
		_, err := stdout.Write(raw)
		return err
	}
	var ans prefixquery.Answer
	if err := json.Unmarshal(raw, &ans); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	printLookup(stdout, &ans)
	return nil
}

func printLookup(w io.Writer, ans *prefixquery.Answer) {
	fmt.Fprintf(w, "%d tokens; %d endpoints\n", ans.Tokens, len(ans.Endpoints))
	fmt.Fprintf(w, "%-24s %-22s %-10s %11s %7s %6s %6s %8s %5s\n",
		"ENDPOINT", "ADDRESS", "STREAM", "MATCH/TOTAL", "TOKENS", "GPU", "CPU", "STORAGE", "SPEC")
	for _, a := range ans.Endpoints {
		p := a.Prefix
		mark := ""
		switch {
		case p.State == datalayer.StreamPartial:
			mark = " >="
		case !p.Exact:
			mark = " ~"
		}
		fmt.Fprintf(w, "%-24s %-22s %-10s %11s %7d %6d %6d %8d %5d%s\n", a.Name, a.Address, a.Stream,
			fmt.Sprintf("%d/%d", p.MatchBlocks, p.TotalBlocks), p.MatchTokens,
			p.BlocksByTier[0], p.BlocksByTier[1], p.BlocksByTier[2], p.SpeculativeBlocks, mark)
	}
	fmt.Fprintln(w, "(stream: exact, partial (>= marks a lower bound: blocks from before the EPP's first sight may be missing),")
	fmt.Fprintln(w, " recovering (resynchronising after a break), uncertain or none; ~ marks an approximate answer)")
}
