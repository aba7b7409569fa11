// Command importcheck holds the module to the import rules of
// docs/architecture.md: each group of packages imports only the groups
// upstream of it in the data flow, nothing a binary links imports the
// simulator or a test rig, and the operator's CLI does not link the EPP.
// `make lint` runs it; it prints every broken rule and exits 1.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

const module = "github.com/kvroute/kvroute/"

// pkg is what go list says of one package, module prefix removed.
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
	// Outside are its direct imports from outside the module, whole.
	Outside []string
}

// rule says what the packages under Path may import from the module
// (directly), and what none of their dependencies may be (transitively).
// Paths match themselves and everything below them; the longest match
// applies.
type rule struct {
	Path string
	// May lists the module paths a package may import; nil with AnyBut set
	// means anything but AnyBut.
	May    []string
	AnyBut []string
	// NeverLinks is checked over all dependencies.
	NeverLinks []string
	// Except are paths NeverLinks and AnyBut do not cover.
	Except []string
	// StdOnly: outside the module, only the standard library.
	StdOnly bool
}

// rules are the import rules; docs/architecture.md explains them.
var rules = []rule{
	{Path: "pkg/plugin", May: []string{"pkg/request"}},
	{Path: "pkg/request", May: []string{}},
	{Path: "pkg/events", May: []string{}},
	{Path: "pkg/jsonscan", May: []string{}},
	{Path: "pkg/tokenizer", May: []string{"pkg/request", "pkg/jsonscan"}},
	{Path: "pkg/transport", May: []string{}},
	{Path: "pkg/transport/natscallout", May: []string{"pkg/events"}},
	{Path: "pkg/enginesched", May: []string{}},
	{Path: "pkg/datalayer", May: []string{"pkg/datalayer", "pkg/enginesched", "pkg/events", "pkg/plugin", "pkg/request"}},
	{Path: "pkg/ingest/consumer", May: []string{"pkg/events"}},
	{Path: "pkg/ingest/relay", May: []string{"pkg/events", "pkg/transport"}},
	{Path: "pkg/ingest/recovery", May: []string{"pkg/datalayer", "pkg/events"}},
	{Path: "pkg/discovery", May: []string{"pkg/datalayer", "pkg/events"}},
	{Path: "pkg/predict", May: []string{"pkg/predict", "pkg/enginesched"}},
	{Path: "pkg/prepare", May: []string{"pkg/prepare", "pkg/predict", "pkg/enginesched", "pkg/datalayer", "pkg/events", "pkg/plugin", "pkg/request"}},
	{Path: "pkg/scheduling", May: []string{"pkg/scheduling", "pkg/prepare", "pkg/datalayer", "pkg/events", "pkg/plugin", "pkg/request"}},
	{Path: "pkg/requestpath", May: []string{"pkg/requestpath", "pkg/scheduling", "pkg/prepare", "pkg/datalayer", "pkg/events", "pkg/plugin", "pkg/request", "pkg/tokenizer", "pkg/jsonscan"}},
	{Path: "pkg/epp/prefixquery", May: []string{"pkg/datalayer"}},
	{Path: "pkg/epp", AnyBut: []string{"pkg/sim", "pkg/harness", "pkg/testkit", "cmd"}, NeverLinks: []string{"pkg/sim", "pkg/harness", "pkg/testkit"}},
	{Path: "pkg/sim", May: []string{"pkg/sim", "pkg/events"}},
	{Path: "pkg/harness", AnyBut: []string{"pkg/testkit", "cmd"}, NeverLinks: []string{"pkg/testkit"}},
	{Path: "pkg/testkit", AnyBut: []string{"cmd"}},
	{
		Path: "cmd/epp", May: []string{"pkg/epp", "pkg/discovery/k8s", "pkg/transport/natsauth"}, StdOnly: true,
		NeverLinks: []string{"pkg/sim", "pkg/harness", "pkg/testkit"},
	},
	{Path: "cmd/kv-relay", May: []string{"pkg/ingest/relay", "pkg/events", "pkg/transport"}},
	{Path: "cmd/kv-nats-auth", May: []string{"pkg/transport"}},
	{
		Path: "cmd/kvctl", AnyBut: []string{"pkg/epp", "pkg/sim", "pkg/harness", "pkg/testkit"},
		NeverLinks: []string{"pkg/epp", "pkg/sim", "pkg/harness", "pkg/testkit", "pkg/requestpath/director", "pkg/requestpath/extproc", "pkg/requestpath/proxy", "pkg/scheduling"},
		Except:     []string{"pkg/epp/prefixquery"},
	},
	{Path: "cmd/kvsim", AnyBut: []string{"pkg/testkit"}, NeverLinks: []string{"pkg/testkit"}},
	{Path: "deploy", May: []string{}},
	{Path: "scripts", May: []string{}},
	{Path: "scripts/treecheck", May: []string{}},
	{Path: "scripts/plugin-table", May: []string{"pkg/scheduling/config"}},
}

func main() {
	pkgs, err := list()
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	problems := check(pkgs, rules)
	for _, p := range problems {
		fmt.Println("importcheck:", p)
	}
	if len(problems) > 0 {
		os.Exit(1)
	}
	fmt.Printf("importcheck: %d packages follow the import rules\n", len(pkgs))
}

func list() ([]pkg, error) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", module+"...")
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %w", err)
		}
		p.ImportPath = local(p.ImportPath)
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module) {
				p.Outside = append(p.Outside, imp)
			}
		}
		p.Imports = locals(p.Imports)
		p.Deps = locals(p.Deps)
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

// locals keeps the module's own paths, without the module prefix.
func locals(paths []string) []string {
	var out []string
	for _, p := range paths {
		if strings.HasPrefix(p, module) {
			out = append(out, local(p))
		}
	}
	return out
}

// standard reports whether an import path outside the module is the
// standard library's: as the go command decides, by whether its first
// element lacks a dot.
func standard(p string) bool {
	first, _, _ := strings.Cut(p, "/")
	return !strings.Contains(first, ".")
}

func local(p string) string { return strings.TrimPrefix(p, module) }

// under reports whether p is path or below it.
func under(p, path string) bool { return p == path || strings.HasPrefix(p, path+"/") }

func underAny(p string, paths []string) bool {
	for _, x := range paths {
		if under(p, x) {
			return true
		}
	}
	return false
}

// ruleFor is the rule with the longest path matching p.
func ruleFor(p string, rs []rule) (rule, bool) {
	var best rule
	found := false
	for _, r := range rs {
		if under(p, r.Path) && (!found || len(r.Path) > len(best.Path)) {
			best, found = r, true
		}
	}
	return best, found
}

// check returns every broken rule, sorted.
func check(pkgs []pkg, rs []rule) []string {
	var problems []string
	for _, p := range pkgs {
		r, ok := ruleFor(p.ImportPath, rs)
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: no import rule covers this package; add one", p.ImportPath))
			continue
		}
		for _, imp := range p.Imports {
			allowed := underAny(imp, r.May)
			if r.May == nil {
				allowed = !underAny(imp, r.AnyBut) || underAny(imp, r.Except)
			}
			if !allowed {
				problems = append(problems, fmt.Sprintf("%s imports %s, which its group may not", p.ImportPath, imp))
			}
		}
		for _, imp := range p.Outside {
			if r.StdOnly && !standard(imp) {
				problems = append(problems, fmt.Sprintf("%s imports %s, which is neither the module nor the standard library", p.ImportPath, imp))
			}
		}
		for _, dep := range p.Deps {
			if underAny(dep, r.NeverLinks) && !underAny(dep, r.Except) {
				problems = append(problems, fmt.Sprintf("%s links %s, which it must never link", p.ImportPath, dep))
			}
		}
	}
	sort.Strings(problems)
	return problems
}
