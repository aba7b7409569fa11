package headertest_test

import (
	"context"
	"slices"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/filter/headertest"
)

func TestFilterKeepsTheEndpointsTheHeaderNames(t *testing.T) {
	t.Parallel()
	p, err := headertest.Factory("h", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	f := p.(framework.Filter)
	// schedtest's endpoints listen on <name>:8000.
	for _, tt := range []struct {
		header string
		want   []string
	}{
		{"", nil},
		{"b", []string{"b"}},
		{"c:8000, a", []string{"c", "a"}},
		{"a:9000", nil},
		{"a,a,b", []string{"a", "b"}},
		{"z", nil},
	} {
		req := &request.Request{Headers: map[string]string{}}
		if tt.header != "" {
			req.Headers[headertest.Header] = tt.header
		}
		got := schedtest.Names(f.Filter(context.Background(), schedtest.Cycle(), req, schedtest.Cands(schedtest.C{Name: "a"}, schedtest.C{Name: "b"}, schedtest.C{Name: "c"})))
		if !slices.Equal(got, tt.want) && len(got)+len(tt.want) > 0 {
			t.Errorf("header %q kept %v, want %v", tt.header, got, tt.want)
		}
	}
}
