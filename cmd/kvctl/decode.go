package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/kvroute/kvroute/pkg/events"
)

func init() {
	commands["decode"] = command{
		summary: "decode one vLLM KV-event batch (raw msgpack or hex) and print it as JSON",
		run: func(args []string) error {
			return decodeCmd(args, os.Stdin, os.Stdout, os.Stderr)
		},
	}
}

// maxBatchBytes bounds what decode reads from stdin: far above any real
// batch (NATS refuses payloads over 64 MiB), and it keeps a mistaken pipe
// from filling memory.
const maxBatchBytes = 64 << 20

// decodeCmd reads one batch from stdin, or from --hex, and writes the
// decoded events.Batch to stdout as indented JSON.
func decodeCmd(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("decode", flag.ContinueOnError)
	fs.SetOutput(stderr)
	hexArg := fs.String("hex", "", "decode this hex `string` instead of reading stdin")
	hexStdin := fs.Bool("hex-stdin", false, "stdin holds hex (whitespace ignored) rather than raw msgpack")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kvctl decode [--hex STRING | --hex-stdin] < batch\n\n"+
			"Decodes one KV-event batch as vLLM publishes it and prints it as JSON.\n"+
			"Without flags, stdin holds the raw msgpack bytes.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (the batch comes from stdin or --hex)", fs.Arg(0))
	}
	hexSet := false
	fs.Visit(func(f *flag.Flag) { hexSet = hexSet || f.Name == "hex" })
	if hexSet && *hexStdin {
		return errors.New("--hex and --hex-stdin cannot be used together")
	}

	var data []byte
	switch {
	case hexSet:
		var err error
		if data, err = decodeHex(*hexArg); err != nil {
			return fmt.Errorf("--hex: %w", err)
		}
	default:
		raw, err := io.ReadAll(io.LimitReader(stdin, maxBatchBytes+1))
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		if len(raw) > maxBatchBytes {
			return fmt.Errorf("stdin holds more than %d bytes; a batch is never that large", maxBatchBytes)
		}
		data = raw
		if *hexStdin {
			if data, err = decodeHex(string(raw)); err != nil {
				return fmt.Errorf("stdin: %w", err)
			}
		}
	}

	b, err := events.Decode(data)
	if err != nil {
		return err
	}
	out, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	out = append(out, '\n')
	_, err = stdout.Write(out)
	return err
}

// decodeHex accepts hex as people paste it: spaced, wrapped, or with 0x.
func decodeHex(s string) ([]byte, error) {
	s = strings.Join(strings.Fields(s), "")
	s = strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if s == "" {
		return nil, errors.New("no hex given")
	}
	return hex.DecodeString(s)
}
