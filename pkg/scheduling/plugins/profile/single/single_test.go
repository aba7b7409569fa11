package single_test

import (
	"context"
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/single"
)

func TestHandlerRunsTheProfileOnce(t *testing.T) {
	t.Parallel()
	h := single.New("h")
	ctx, cs, req := context.Background(), schedtest.Cycle(), &request.Request{}
	profiles := []*framework.Profile{{Name: "default"}}
	if got := h.Pick(ctx, cs, req, profiles, map[string]*framework.ProfileResult{}); len(got) != 1 || got[0].Name != "default" {
		t.Fatalf("first Pick = %v, want the default profile", got)
	}
	results := map[string]*framework.ProfileResult{"default": {Picked: schedtest.Cands(schedtest.C{Name: "a"})}}
	if got := h.Pick(ctx, cs, req, profiles, results); len(got) != 0 {
		t.Fatalf("second Pick = %v, want none", got)
	}
	res, err := h.ProcessResults(ctx, cs, req, results)
	if err != nil || res.PrimaryProfile != "default" || res.Targets()[0].Name != "a" {
		t.Fatalf("ProcessResults = %+v, %v", res, err)
	}
}

func TestAnEmptyPickIsNoCandidates(t *testing.T) {
	t.Parallel()
	_, err := single.New("h").ProcessResults(context.Background(), schedtest.Cycle(), &request.Request{},
		map[string]*framework.ProfileResult{"default": {}})
	if !errors.Is(err, framework.ErrNoCandidates) {
		t.Fatalf("err = %v, want ErrNoCandidates", err)
	}
}
