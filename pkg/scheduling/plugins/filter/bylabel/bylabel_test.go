package bylabel_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/bylabel"
)

// pool has a pod of every role and one without the label.
var pool = []schedtest.C{
	{Name: "decode", Labels: map[string]string{bylabel.RoleLabel: bylabel.RoleDecode}},
	{Name: "prefill", Labels: map[string]string{bylabel.RoleLabel: bylabel.RolePrefill}},
	{Name: "encode", Labels: map[string]string{bylabel.RoleLabel: bylabel.RoleEncode}},
	{Name: "pd", Labels: map[string]string{bylabel.RoleLabel: bylabel.RolePrefillDecode}},
	{Name: "both", Labels: map[string]string{bylabel.RoleLabel: bylabel.RoleBoth}},
	{Name: "ep", Labels: map[string]string{bylabel.RoleLabel: bylabel.RoleEncodePrefill}},
	{Name: "epd", Labels: map[string]string{bylabel.RoleLabel: bylabel.RoleEncodePrefillDecode}},
	{Name: "unlabelled"},
	{Name: "other", Labels: map[string]string{bylabel.RoleLabel: "router"}},
}

func run(t *testing.T, f framework.Factory, raw string) []string {
	t.Helper()
	return schedtest.RunFilter(t, f, raw, pool...)
}

func TestRoleFiltersKeepThePodsServingTheirStage(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		f    framework.Factory
		want []string
	}{
		// A pod without a role serves every stage: decode keeps it, as a
		// pool that does not disaggregate has no labels at all.
		{"decode-filter", bylabel.DecodeFactory, []string{"decode", "pd", "both", "epd", "unlabelled"}},
		{"prefill-filter", bylabel.PrefillFactory, []string{"prefill", "pd", "both", "ep", "epd"}},
		{"encode-filter", bylabel.EncodeFactory, []string{"encode", "ep", "epd"}},
	} {
		if got := run(t, tt.f, ""); !slices.Equal(got, tt.want) {
			t.Errorf("%s kept %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestByLabelKeepsTheValidValues(t *testing.T) {
	t.Parallel()
	if got, want := run(t, bylabel.Factory, `{"label":"llm-d.ai/role","validValues":["decode","both"]}`), []string{"decode", "both"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
	if got, want := run(t, bylabel.Factory, `{"label":"llm-d.ai/role","validValues":["encode"],"allowsNoLabel":true}`), []string{"encode", "unlabelled"}; !slices.Equal(got, want) {
		t.Errorf("with allowsNoLabel kept %v, want %v", got, want)
	}
}

func TestSelectorKeepsWhatTheSelectorMatches(t *testing.T) {
	t.Parallel()
	got := run(t, bylabel.SelectorFactory, `{"matchExpressions":[{"key":"llm-d.ai/role","operator":"In","values":["prefill","encode"]}]}`)
	if want := []string{"prefill", "encode"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
	got = run(t, bylabel.SelectorFactory, `{"matchLabels":{"llm-d.ai/role":"both"}}`)
	if want := []string{"both"}; !slices.Equal(got, want) {
		t.Errorf("kept %v, want %v", got, want)
	}
}

func TestFactoriesRefuseBadParameters(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		f    framework.Factory
		raw  string
		want string
	}{
		{bylabel.Factory, `{"validValues":["a"]}`, `invalid plugin parameters: plugin "f" (type by-label): label must be given`},
		{bylabel.Factory, `{"label":"x"}`, `invalid plugin parameters: plugin "f" (type by-label): validValues is empty and allowsNoLabel false: the filter would keep nothing`},
		{bylabel.DecodeFactory, `{"label":"x"}`, `invalid plugin parameters: plugin "f" (type decode-filter): json: unknown field "label"`},
		{bylabel.SelectorFactory, `{"matchExpressions":[{"key":"k","operator":"Near"}]}`, `invalid plugin parameters: plugin "f" (type label-selector-filter): "Near" is not a valid label selector operator`},
		{bylabel.SelectorFactory, `{"matchLabel":{}}`, `invalid plugin parameters: plugin "f" (type label-selector-filter): json: unknown field "matchLabel"`},
	} {
		var p plugin.Plugin
		p, err := tt.f("f", json.RawMessage(tt.raw), nil)
		if err == nil || err.Error() != tt.want {
			t.Errorf("%s: err = %v (plugin %v)\nwant  %s", tt.raw, err, p, tt.want)
		}
	}
}
