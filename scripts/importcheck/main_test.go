package main

import (
	"slices"
	"testing"
)

func TestCheckFindsEveryKindOfBrokenRule(t *testing.T) {
	t.Parallel()
	pkgs := []pkg{
		{ImportPath: "pkg/events"},
		{ImportPath: "pkg/datalayer/index", Imports: []string{"pkg/events", "pkg/datalayer"}},
		{ImportPath: "pkg/ingest/consumer", Imports: []string{"pkg/events", "pkg/datalayer/index"}},
		{ImportPath: "cmd/epp", Imports: []string{"pkg/epp"}, Deps: []string{"pkg/epp", "pkg/sim/blockpool"}},
		{ImportPath: "cmd/kvctl", Imports: []string{"pkg/epp/prefixquery"}, Deps: []string{"pkg/epp/prefixquery", "pkg/datalayer"}},
		{ImportPath: "cmd/kvctl2", Imports: []string{"pkg/epp"}},
		{ImportPath: "pkg/epp", Imports: []string{"pkg/testkit"}, Deps: []string{"pkg/testkit"}},
		{ImportPath: "cmd/kv-relay", Imports: []string{"pkg/events"}, Outside: []string{"os", "net/http", "github.com/nats-io/nats.go"}},
		{ImportPath: "cmd/kv-nats-auth", Outside: []string{"os", "golang.org/x/crypto/bcrypt"}},
	}
	rs := []rule{
		{Path: "pkg/events", May: []string{}},
		{Path: "pkg/datalayer", May: []string{"pkg/datalayer", "pkg/events"}},
		{Path: "pkg/ingest/consumer", May: []string{"pkg/events"}},
		{Path: "pkg/epp", AnyBut: []string{"pkg/sim", "pkg/testkit"}, NeverLinks: []string{"pkg/sim", "pkg/testkit"}},
		{Path: "cmd/epp", AnyBut: []string{"pkg/sim"}, NeverLinks: []string{"pkg/sim"}},
		{Path: "cmd/kvctl", AnyBut: []string{"pkg/epp"}, NeverLinks: []string{"pkg/epp"}, Except: []string{"pkg/epp/prefixquery"}},
		{Path: "cmd/kv-relay", May: []string{"pkg/events"}, StdOnly: true},
		{Path: "cmd/kv-nats-auth", May: []string{}},
	}
	got := check(pkgs, rs)
	want := []string{
		"cmd/epp links pkg/sim/blockpool, which it must never link",
		"cmd/kv-relay imports github.com/nats-io/nats.go, which is neither the module nor the standard library",
		"cmd/kvctl2: no import rule covers this package; add one",
		"pkg/epp imports pkg/testkit, which its group may not",
		"pkg/epp links pkg/testkit, which it must never link",
		"pkg/ingest/consumer imports pkg/datalayer/index, which its group may not",
	}
	if !slices.Equal(got, want) {
		t.Errorf("check found\n%q\nwant\n%q", got, want)
	}
}

func TestTheModuleFollowsItsRules(t *testing.T) {
	t.Parallel()
	pkgs, err := list()
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 40 {
		t.Fatalf("go list found %d packages: not the module", len(pkgs))
	}
	for _, p := range check(pkgs, rules) {
		t.Error(p)
	}
}
