package gateway_test

import (
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/harness/gateway"
)

// A destination or subset hint from the network is split into clean,
// bounded lists whatever it holds.
func FuzzDestinationAndSubsetLists(f *testing.F) {
	for _, s := range []string{"", ",", "10.0.0.1:8000", " a:1 , ,b:2,", strings.Repeat("x:1,", 1000), "\x00,\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for name, got := range map[string][]string{"targets": gateway.Targets(s), "subset": gateway.SubsetHint(s)} {
			limit := gateway.MaxTargets
			if name == "subset" {
				limit = gateway.MaxSubset
			}
			if len(got) > limit {
				t.Fatalf("%s: %d entries, over %d", name, len(got), limit)
			}
			for _, e := range got {
				if e == "" || strings.Contains(e, ",") || strings.TrimSpace(e) != e {
					t.Fatalf("%s: entry %q of %q", name, e, s)
				}
			}
		}
		if gateway.SubsetHint(s) == nil {
			t.Fatal("a subset hint read as nil: it would allow every endpoint")
		}
	})
}
