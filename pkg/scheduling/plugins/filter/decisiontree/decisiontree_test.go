package decisiontree_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/decisiontree"
)

// keep is a filter keeping the named endpoints, recording that it ran.
type keep struct {
	name  string
	names []string
	ran   *[]string
}

func (k keep) TypedName() plugin.TypedName { return plugin.TypedName{Type: "keep", Name: k.name} }

func (k keep) Filter(_ context.Context, _ *framework.CycleState, _ *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	*k.ran = append(*k.ran, k.name)
	out := cands[:0] // reuses the slice, as filters may
	for _, c := range cands {
		if slices.Contains(k.names, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

// handle knows the plugins defined before the tree.
type handle map[string]plugin.Plugin

func (h handle) MetricsStaleness() time.Duration       { return time.Second }
func (h handle) Speculator() framework.Speculator      { return nil }
func (h handle) Registerer() prometheus.Registerer     { return nil }
func (h handle) Plugin(n string) (plugin.Plugin, bool) { p, ok := h[n]; return p, ok }

func TestTreeFollowsSuccessAndFailure(t *testing.T) {
	t.Parallel()
	var ran []string
	h := handle{
		"none": keep{"none", nil, &ran},
		"ab":   keep{"ab", []string{"a", "b"}, &ran},
		"b":    keep{"b", []string{"b"}, &ran},
		"c":    keep{"c", []string{"c"}, &ran},
	}
	tests := []struct {
		name    string
		params  string
		want    []string
		wantRan []string
	}{
		{"success goes on with what was kept", `{"current":{"pluginRef":"ab"},"nextOnSuccess":{"pluginRef":"b"},"nextOnFailure":{"pluginRef":"c"}}`,
			[]string{"b"}, []string{"ab", "b"}},
		{"failure goes on with what was given", `{"current":{"pluginRef":"none"},"nextOnSuccess":{"pluginRef":"b"},"nextOnFailure":{"pluginRef":"c"}}`,
			[]string{"c"}, []string{"none", "c"}},
		{"either outcome goes to nextOnSuccessOrFailure", `{"current":{"pluginRef":"none"},"nextOnSuccessOrFailure":{"pluginRef":"ab"}}`,
			[]string{"a", "b"}, []string{"none", "ab"}},
		{"without a next filter the current result stands", `{"current":{"pluginRef":"none"},"nextOnSuccess":{"pluginRef":"b"}}`,
			nil, []string{"none"}},
		{"trees nest", `{"current":{"pluginRef":"ab"},"nextOnSuccess":{"decisionTree":{"current":{"pluginRef":"c"},"nextOnFailure":{"pluginRef":"b"}}}}`,
			[]string{"b"}, []string{"ab", "c", "b"}},
	}
	for _, tt := range tests {
		ran = nil
		p, err := decisiontree.Factory("tree", json.RawMessage(tt.params), h)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		got := p.(framework.Filter).Filter(context.Background(), schedtest.Cycle(), &request.Request{}, schedtest.Cands(schedtest.C{Name: "a"}, schedtest.C{Name: "b"}, schedtest.C{Name: "c"}))
		if !slices.Equal(schedtest.Names(got), tt.want) && !(len(got) == 0 && len(tt.want) == 0) {
			t.Errorf("%s: kept %v, want %v", tt.name, schedtest.Names(got), tt.want)
		}
		if !slices.Equal(ran, tt.wantRan) {
			t.Errorf("%s: ran %v, want %v", tt.name, ran, tt.wantRan)
		}
	}
}

func TestFactoryRefusesBadTrees(t *testing.T) {
	t.Parallel()
	var ran []string
	h := handle{"ab": keep{"ab", nil, &ran}, "picker": notFilter{}}
	deep := `{"pluginRef":"ab"}`
	for range 40 {
		deep = `{"decisionTree":{"current":` + deep + `}}`
	}
	for params, want := range map[string]string{
		`{}`:                                 `invalid plugin parameters: plugin "tree" (type decision-tree-filter): a tree needs a current filter`,
		`{"current":{"pluginRef":"x"}}`:      `invalid plugin parameters: plugin "tree" (type decision-tree-filter): "x" is not a plugin defined before this tree`,
		`{"current":{"pluginRef":"picker"}}`: `invalid plugin parameters: plugin "tree" (type decision-tree-filter): "picker" (type picker) is not a filter`,
		`{"current":{}}`:                     `invalid plugin parameters: plugin "tree" (type decision-tree-filter): an entry names neither a pluginRef nor a decisionTree`,
		`{"current":{"pluginRef":"ab","decisionTree":{}}}`: `invalid plugin parameters: plugin "tree" (type decision-tree-filter): an entry names both a pluginRef and a decisionTree`,
		`{"current":` + deep + `}`:                         `invalid plugin parameters: plugin "tree" (type decision-tree-filter): trees nested more than 32 deep`,
		`{"current":{"pluginRef":"ab"},"next":{}}`:         `invalid plugin parameters: plugin "tree" (type decision-tree-filter): json: unknown field "next"`,
	} {
		if _, err := decisiontree.Factory("tree", json.RawMessage(params), h); err == nil || err.Error() != want {
			t.Errorf("%.60s: err = %v\nwant  %s", params, err, want)
		}
	}
}

type notFilter struct{}

func (notFilter) TypedName() plugin.TypedName {
	return plugin.TypedName{Type: "picker", Name: "picker"}
}
