package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/events"
)

// The array-form example from docs/kv-events.md: one BlockStored of hash
// 0x0102030405060708, tokens 1..4, block size 4, ts 1.5, rank 0.
const docExample = "93cb3ff80000000000009198ab426c6f636b53746f72656491cf0102030405060708c0940102030404c0a3475055c000"

func TestDecodePrintsTheBatchAsJSON(t *testing.T) {
	t.Parallel()
	raw, err := hex.DecodeString(docExample)
	if err != nil {
		t.Fatal(err)
	}
	wrapped := "0x" + docExample[:40] + "\n  " + docExample[40:] + "\n"
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
	}{
		{"raw msgpack on stdin", nil, string(raw)},
		{"hex in a flag", []string{"--hex", docExample}, ""},
		{"hex in a flag with a single dash", []string{"-hex", docExample}, ""},
		{"wrapped hex with a 0x prefix on stdin", []string{"--hex-stdin"}, wrapped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if err := decodeCmd(tc.args, strings.NewReader(tc.stdin), &stdout, &stderr); err != nil {
				t.Fatalf("decode: %v (stderr %q)", err, stderr.String())
			}
			var got events.Batch
			if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
				t.Fatalf("output is not a Batch in JSON: %v\n%s", err, stdout.String())
			}
			if got.TS != 1.5 || !got.HasDPRank || got.DPRank != 0 || len(got.Events) != 1 {
				t.Fatalf("decoded %+v, want one event at ts 1.5, rank 0", got)
			}
			e := got.Events[0]
			if e.Kind != events.KindBlockStored || len(e.BlockHashes) != 1 || e.BlockHashes[0] != 0x0102030405060708 ||
				len(e.TokenIDs) != 4 || e.BlockSize != 4 || e.HasParent || e.Medium != events.TierGPU {
				t.Errorf("decoded event %+v, want the documented BlockStored", e)
			}
			if !strings.Contains(stdout.String(), "\n  \"Events\"") {
				t.Errorf("output is not indented:\n%s", stdout.String())
			}
		})
	}
}

func TestDecodeReportsBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		args      []string
		stdin     string
		malformed bool   // the error wraps events.ErrMalformed
		want      string // in the error
	}{
		{"a malformed batch", nil, "\xc1", true, "malformed kv event batch"},
		{"empty stdin", nil, "", true, "envelope"},
		{"hex that is not hex", []string{"--hex", "zz"}, "", false, "--hex: encoding/hex: invalid byte"},
		{"an empty hex flag", []string{"--hex", ""}, "", false, "no hex given"},
		{"odd-length hex on stdin", []string{"--hex-stdin"}, "abc", false, "stdin: encoding/hex: odd length"},
		{"both hex sources", []string{"--hex", "00", "--hex-stdin"}, "", false, "cannot be used together"},
		{"a positional argument", []string{"batch.bin"}, "", false, `unexpected argument "batch.bin"`},
		{"truncated hex", []string{"--hex", docExample[:20]}, "", true, "ts"},
		{"an unknown flag", []string{"--nope"}, "", false, "flag provided but not defined: -nope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			err := decodeCmd(tc.args, strings.NewReader(tc.stdin), &stdout, &stderr)
			if err == nil {
				t.Fatalf("decode succeeded, printing %s", stdout.String())
			}
			if errors.Is(err, events.ErrMalformed) != tc.malformed {
				t.Errorf("errors.Is(%v, ErrMalformed) = %v, want %v", err, !tc.malformed, tc.malformed)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want it to mention %q", err, tc.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("a failed decode wrote to stdout: %q", stdout.String())
			}
		})
	}
}
