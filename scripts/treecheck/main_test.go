package main

import (
	"bytes"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type file struct {
	path string
	data []byte
	exec bool
}

// repo makes a git repository in a temporary directory with files staged,
// so that the test reads git's index as the command does, whatever state
// the real tree is in.
func repo(t *testing.T, files []file) string {
	t.Helper()
	dir := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("init", "-q")
	for _, f := range files {
		p := filepath.Join(dir, filepath.FromSlash(f.path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if f.exec {
			mode = 0o755
		}
		if err := os.WriteFile(p, f.data, mode); err != nil {
			t.Fatal(err)
		}
		add := []string{"add"}
		if f.exec {
			add = append(add, "--chmod=+x") // git may ignore the work tree's bit (core.fileMode)
		}
		run(append(add, "--", f.path)...)
	}
	return dir
}

func elf() []byte {
	return append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 120)...)
}

func machOFile() []byte {
	b := make([]byte, 64)
	binary.LittleEndian.PutUint32(b, 0xfeedfacf) // as a little-endian 64-bit Mach-O writes it
	return b
}

func peFile() []byte {
	b := make([]byte, 256)
	copy(b, "MZ")
	binary.LittleEndian.PutUint32(b[0x3c:], 0x80)
	copy(b[0x80:], "PE\x00\x00")
	return b
}

func TestTreecheck(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("x"), MaxSize+1)
	cases := []struct {
		name  string
		files []file
		want  []string // problems, each by the start of its message
	}{
		{
			name:  "source and docs pass",
			files: []file{{path: "main.go", data: []byte("package main\n")}, {path: "docs/a.md", data: []byte("# a\n")}},
		},
		{
			name:  "an ELF binary fails even without the executable bit",
			files: []file{{path: "kv-nats-auth", data: elf()}, {path: "main.go", data: []byte("package main\n")}},
			want:  []string{"kv-nats-auth is an ELF executable"},
		},
		{
			name:  "an executable ELF binary fails once, as an ELF",
			files: []file{{path: "cmd/epp/epp", data: elf(), exec: true}},
			want:  []string{"cmd/epp/epp is an ELF executable"},
		},
		{
			name:  "a Mach-O binary fails",
			files: []file{{path: "bin/kvctl", data: machOFile()}},
			want:  []string{"bin/kvctl is a Mach-O executable"},
		},
		{
			name:  "a PE binary fails",
			files: []file{{path: "kvsim.exe", data: peFile()}},
			want:  []string{"kvsim.exe is a PE executable"},
		},
		{
			name:  "text starting with MZ passes",
			files: []file{{path: "notes.txt", data: []byte("MZ is how a DOS header starts, but this is prose of some length, more than sixty-four bytes long.\n")}},
		},
		{
			name:  "a file over 1 MiB fails outside testdata",
			files: []file{{path: "docs/results/routing.json", data: big}},
			want:  []string{"docs/results/routing.json is 1048577 bytes"},
		},
		{
			name:  "a file of exactly 1 MiB passes",
			files: []file{{path: "docs/exact.json", data: big[:MaxSize]}},
		},
		{
			name:  "a file over 1 MiB passes under testdata",
			files: []file{{path: "pkg/x/testdata/golden.json", data: big}, {path: "testdata/top.bin", data: big}},
		},
		{
			name:  "a directory merely named like testdata does not count",
			files: []file{{path: "pkg/testdata-gen/big.json", data: big}},
			want:  []string{"pkg/testdata-gen/big.json is 1048577 bytes"},
		},
		{
			name:  "an executable script with a #! line passes",
			files: []file{{path: "scripts/test.sh", data: []byte("#!/usr/bin/env bash\necho ok\n"), exec: true}},
		},
		{
			name:  "an executable file without a #! line fails",
			files: []file{{path: "scripts/run.sh", data: []byte("echo ok\n"), exec: true}},
			want:  []string{"scripts/run.sh has the executable bit but no #! line"},
		},
		{
			name: "every problem is reported, sorted",
			files: []file{
				{path: "b", data: elf()},
				{path: "a/big.svg", data: big},
				{path: "scripts/ok.sh", data: []byte("#!/bin/sh\n"), exec: true},
			},
			want: []string{"a/big.svg is 1048577 bytes", "b is an ELF executable"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := repo(t, tc.files)
			entries, err := list(dir)
			if err != nil {
				t.Fatal(err)
			}
			if len(entries) != len(tc.files) {
				t.Fatalf("list found %d files, staged %d: %v", len(entries), len(tc.files), entries)
			}
			got, err := check(dir, entries)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("check found %q, want problems starting %q", got, tc.want)
			}
			for i := range got {
				if !strings.HasPrefix(got[i], tc.want[i]) {
					t.Errorf("problem %d is %q, want it to start %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestListReadsModesFromGitNotTheWorkTree(t *testing.T) {
	t.Parallel()
	dir := repo(t, []file{{path: "run", data: []byte("echo\n"), exec: true}, {path: "plain", data: []byte("x\n")}})
	// The work tree's bit may differ from the index's; the index is what a clone gets.
	if err := os.Chmod(filepath.Join(dir, "run"), 0o644); err != nil {
		t.Fatal(err)
	}
	entries, err := list(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []entry{{Path: "plain", Mode: "100644"}, {Path: "run", Mode: "100755"}}
	if !slices.Equal(entries, want) {
		t.Errorf("list = %v, want %v", entries, want)
	}
}

// FuzzCheckFile holds the header readers to never panic, whatever a
// tracked file starts with, and to call anything starting with ELF's
// magic an executable.
func FuzzCheckFile(f *testing.F) {
	f.Add(elf(), false, int64(128))
	f.Add(peFile(), true, int64(256))
	f.Add(machOFile(), false, int64(64))
	f.Add([]byte("#!/bin/sh\n"), true, int64(MaxSize+1))
	f.Add([]byte("MZ\xff\xff\xff\xff"), false, int64(6))
	f.Fuzz(func(t *testing.T, head []byte, exec bool, size int64) {
		mode := "100644"
		if exec {
			mode = "100755"
		}
		problems := checkFile(entry{Path: "f", Mode: mode}, size, head)
		if bytes.HasPrefix(head, []byte("\x7fELF")) && (len(problems) == 0 || !strings.Contains(problems[0], "ELF")) {
			t.Errorf("an ELF header passed: %q", problems)
		}
	})
}
