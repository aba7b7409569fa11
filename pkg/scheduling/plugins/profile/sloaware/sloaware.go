// Package sloaware is the slo-aware-profile-handler (the name of the
// Gateway API Inference Extension's experimental SLO work): a request whose
// x-prediction-based-scheduling header is true is scheduled by the profile
// named "slo", every other request by the one named "default".
package sloaware

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "slo-aware-profile-handler"

// The profile names and the header, as upstream fixes them.
const (
	DefaultProfile = "default"
	SLOProfile     = "slo"
	Header         = "x-prediction-based-scheduling"
)

// Handler is the slo-aware-profile-handler.
type Handler struct{ name plugin.TypedName }

var _ framework.ProfileHandler = (*Handler)(nil)

// Factory makes the handler; it takes no parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return &Handler{name: plugin.TypedName{Type: Type, Name: name}}, nil
}

// TypedName implements plugin.Plugin.
func (h *Handler) TypedName() plugin.TypedName { return h.name }

// profileFor names the request's profile; a header that is not a boolean
// is an error, as upstream.
func profileFor(req *request.Request) (string, error) {
	v, ok := req.Headers[Header]
	if !ok {
		return DefaultProfile, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return "", fmt.Errorf("header %s = %q: want true or false", Header, v)
	}
	if on {
		return SLOProfile, nil
	}
	return DefaultProfile, nil
}

// Pick implements framework.ProfileHandler: the request's one profile.
// Upstream runs both and keeps one's pick; running only the one kept
// gives the same answer for half the work.
func (h *Handler) Pick(_ context.Context, _ *framework.CycleState, req *request.Request, profiles []*framework.Profile, results map[string]*framework.ProfileResult) []*framework.Profile {
	if len(results) > 0 {
		return nil
	}
	name, err := profileFor(req)
	if err != nil {
		return nil
	}
	for _, p := range profiles {
		if p.Name == name {
			return []*framework.Profile{p}
		}
	}
	return nil
}

// ProcessResults implements framework.ProfileHandler.
func (h *Handler) ProcessResults(_ context.Context, _ *framework.CycleState, req *request.Request, results map[string]*framework.ProfileResult) (*framework.Result, error) {
	name, err := profileFor(req)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", h.name, err)
	}
	r, ok := results[name]
	if !ok {
		return nil, fmt.Errorf("%s: no scheduling profile named %q", h.name, name)
	}
	if r == nil || len(r.Picked) == 0 {
		return nil, fmt.Errorf("profile %q picked nothing: %w", name, framework.ErrNoCandidates)
	}
	return &framework.Result{PrimaryProfile: name, Profiles: results}, nil
}
