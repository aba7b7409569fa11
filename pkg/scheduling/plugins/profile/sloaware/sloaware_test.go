package sloaware_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/plugins/profile/sloaware"
)

func TestTheHeaderChoosesTheProfile(t *testing.T) {
	t.Parallel()
	p, err := sloaware.Factory("h", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := p.(framework.ProfileHandler)
	profiles := []*framework.Profile{{Name: "default"}, {Name: "slo"}}
	picked := map[string]*framework.ProfileResult{"x": {Picked: []*datalayer.Candidate{{}}}}
	tests := []struct {
		name    string
		headers map[string]string
		want    string // "" for an error
	}{
		{"no header runs the default profile", nil, "default"},
		{"true runs the slo profile", map[string]string{sloaware.Header: "true"}, "slo"},
		{"false runs the default profile", map[string]string{sloaware.Header: "false"}, "default"},
		{"a header that is not a boolean is an error", map[string]string{sloaware.Header: "maybe"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := &request.Request{Headers: tt.headers}
			run := h.Pick(context.Background(), nil, req, profiles, nil)
			results := map[string]*framework.ProfileResult{}
			for _, prof := range run {
				results[prof.Name] = picked["x"]
			}
			res, err := h.ProcessResults(context.Background(), nil, req, results)
			if tt.want == "" {
				if err == nil {
					t.Fatalf("ran %v without an error", run)
				}
				return
			}
			if err != nil || len(run) != 1 || run[0].Name != tt.want || res.PrimaryProfile != tt.want {
				t.Fatalf("ran %v, result %+v, err %v; want %s alone", run, res, err, tt.want)
			}
			if next := h.Pick(context.Background(), nil, req, profiles, results); len(next) != 0 {
				t.Fatalf("a second round ran %v", next)
			}
		})
	}
}
