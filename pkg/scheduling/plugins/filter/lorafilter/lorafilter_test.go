package lorafilter_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/lorafilter"
)

func TestFilterPrefersEndpointsWithTheAdapter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		lora  string
		cands []schedtest.C
		want  []string
	}{
		{"a base-model request passes every endpoint", "",
			[]schedtest.C{{Name: "a", Active: []string{"x"}}, {Name: "b"}}, []string{"a", "b"}},
		{"endpoints with the adapter active are kept", "x",
			[]schedtest.C{{Name: "a", Active: []string{"y", "x"}, MaxLoRAs: 2}, {Name: "b", MaxLoRAs: 4}}, []string{"a"}},
		{"an adapter waiting to load counts as present", "x",
			[]schedtest.C{{Name: "a", Waiting: []string{"x"}}, {Name: "b", Active: []string{"x"}}, {Name: "c", MaxLoRAs: 4}}, []string{"a", "b"}},
		{"without the adapter anywhere, endpoints with room are kept", "x",
			[]schedtest.C{{Name: "full", Active: []string{"y", "z"}, MaxLoRAs: 2}, {Name: "room", Active: []string{"y"}, MaxLoRAs: 2}}, []string{"room"}},
		{"an unknown adapter capacity is not room", "x",
			[]schedtest.C{{Name: "unknown"}, {Name: "room", MaxLoRAs: 1}}, []string{"room"}},
		{"with no adapter and no room, all endpoints are kept", "x",
			[]schedtest.C{{Name: "a", Active: []string{"y"}, MaxLoRAs: 1}, {Name: "b"}}, []string{"a", "b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := lorafilter.New("l").Filter(context.Background(), schedtest.Cycle(), &request.Request{LoRA: tt.lora}, schedtest.Cands(tt.cands...))
			if !slices.Equal(schedtest.Names(got), tt.want) {
				t.Errorf("kept %v, want %v", schedtest.Names(got), tt.want)
			}
		})
	}
}
