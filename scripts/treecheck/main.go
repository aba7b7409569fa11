// Command treecheck holds git to source and reference: it fails when a
// tracked file is an executable (ELF, Mach-O or PE, or a file with the
// executable bit that is not a script starting with "#!") or is larger
// than 1 MiB outside a testdata/ directory. Builds and generated bulk
// belong in .gitignore, not in history. `make lint` runs it; it prints
// every offending file and exits 1.
package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

// MaxSize is the largest file tracked outside testdata/. Golden files and
// fixtures may be larger; they sit under testdata/ so that the exception
// is visible in the path.
const MaxSize = 1 << 20

// entry is one tracked file: its path from the repository's root and its
// git mode (100644, 100755, 120000 for a symlink, 160000 for a submodule).
type entry struct {
	Path string
	Mode string
}

func main() {
	root, err := gitRoot(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "treecheck:", err)
		os.Exit(2)
	}
	entries, err := list(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "treecheck:", err)
		os.Exit(2)
	}
	problems, err := check(root, entries)
	if err != nil {
		fmt.Fprintln(os.Stderr, "treecheck:", err)
		os.Exit(2)
	}
	for _, p := range problems {
		fmt.Println("treecheck:", p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
	fmt.Printf("treecheck: %d tracked files, no executable, none over %d bytes outside testdata/\n", len(entries), MaxSize)
}

func gitRoot(dir string) (string, error) {
	out, err := git(dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// list is every file in git's index with its mode. The index, not the
// work tree's permissions, says what a clone gets.
func list(root string) ([]entry, error) {
	out, err := git(root, "ls-files", "-s", "-z")
	if err != nil {
		return nil, err
	}
	var entries []entry
	for _, rec := range bytes.Split(out, []byte{0}) {
		if len(rec) == 0 {
			continue
		}
		// "<mode> <object> <stage>\t<path>"
		meta, path, ok := bytes.Cut(rec, []byte{'\t'})
		mode, _, _ := bytes.Cut(meta, []byte{' '})
		if !ok || len(mode) == 0 {
			return nil, fmt.Errorf("git ls-files: unexpected record %q", rec)
		}
		entries = append(entries, entry{Path: string(path), Mode: string(mode)})
	}
	return entries, nil
}

func git(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("git %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return out.Bytes(), nil
}

// check reads each entry's file under root and returns every problem,
// sorted. A file in the index but gone from the work tree is not checked:
// its deletion is on its way to a commit.
func check(root string, entries []entry) ([]string, error) {
	var problems []string
	for _, e := range entries {
		if e.Mode == "120000" || e.Mode == "160000" {
			continue // symlinks and submodules carry no content of their own
		}
		f, err := os.Open(filepath.Join(root, filepath.FromSlash(e.Path)))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		info, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		head := make([]byte, 512)
		n, err := io.ReadFull(f, head)
		f.Close()
		if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
			return nil, fmt.Errorf("%s: %w", e.Path, err)
		}
		problems = append(problems, checkFile(e, info.Size(), head[:n])...)
	}
	sort.Strings(problems)
	return problems, nil
}

// checkFile judges one file from its mode, size and first bytes.
func checkFile(e entry, size int64, head []byte) []string {
	var problems []string
	if kind := binaryKind(head); kind != "" {
		problems = append(problems, fmt.Sprintf("%s is a%s %s executable; build it, do not track it", e.Path, article(kind), kind))
	} else if e.Mode == "100755" && !bytes.HasPrefix(head, []byte("#!")) {
		problems = append(problems, fmt.Sprintf("%s has the executable bit but no #! line; only scripts may be executable (git update-index --chmod=-x)", e.Path))
	}
	if size > MaxSize && !inTestdata(e.Path) {
		problems = append(problems, fmt.Sprintf("%s is %d bytes, over %d outside testdata/", e.Path, size, MaxSize))
	}
	return problems
}

func article(kind string) string {
	if strings.ContainsAny(kind[:1], "AEIOU") {
		return "n"
	}
	return ""
}

// binaryKind names the executable format head starts with, or "".
func binaryKind(head []byte) string {
	switch {
	case bytes.HasPrefix(head, []byte("\x7fELF")):
		return "ELF"
	case len(head) >= 4 && machO(binary.BigEndian.Uint32(head)):
		return "Mach-O"
	case pe(head):
		return "PE"
	}
	return ""
}

// machO reports the magic numbers of thin Mach-O files in either byte
// order and of universal (fat) ones. The fat magic is also a Java class
// file's, which is no more welcome.
func machO(magic uint32) bool {
	switch magic {
	case 0xfeedface, 0xfeedfacf, 0xcefaedfe, 0xcffaedfe, 0xcafebabe, 0xbebafeca:
		return true
	}
	return false
}

// pe reports a DOS header whose e_lfanew points at a "PE\0\0" signature
// within the bytes read: "MZ" alone starts too many text files.
func pe(head []byte) bool {
	if len(head) < 0x40 || !bytes.HasPrefix(head, []byte("MZ")) {
		return false
	}
	off := binary.LittleEndian.Uint32(head[0x3c:])
	return int64(off)+4 <= int64(len(head)) && bytes.Equal(head[off:off+4], []byte("PE\x00\x00"))
}

func inTestdata(path string) bool {
	for _, dir := range strings.Split(path, "/")[:strings.Count(path, "/")] {
		if dir == "testdata" {
			return true
		}
	}
	return false
}
