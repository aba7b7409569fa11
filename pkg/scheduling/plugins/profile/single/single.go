// Package single is the single-profile-handler: it runs the one configured
// profile once and takes its pick as the answer.
package single

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "single-profile-handler"

// Handler runs the first profile it is given, once.
type Handler struct{ name plugin.TypedName }

var _ framework.ProfileHandler = (*Handler)(nil)

// New makes the handler.
func New(name string) *Handler { return &Handler{name: plugin.TypedName{Type: Type, Name: name}} }

// Factory makes the handler; it takes no parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return New(name), nil
}

// TypedName implements plugin.Plugin.
func (h *Handler) TypedName() plugin.TypedName { return h.name }

// Pick implements framework.ProfileHandler.
func (h *Handler) Pick(_ context.Context, _ *framework.CycleState, _ *request.Request, profiles []*framework.Profile, results map[string]*framework.ProfileResult) []*framework.Profile {
	if len(results) > 0 || len(profiles) == 0 {
		return nil
	}
	return profiles[:1]
}

// ProcessResults implements framework.ProfileHandler. An empty pick is
// ErrNoCandidates: the filters left nothing to send the request to.
func (h *Handler) ProcessResults(_ context.Context, _ *framework.CycleState, _ *request.Request, results map[string]*framework.ProfileResult) (*framework.Result, error) {
	if len(results) == 1 {
		for name, r := range results {
			if r == nil || len(r.Picked) == 0 {
				return nil, fmt.Errorf("profile %q picked nothing: %w", name, framework.ErrNoCandidates)
			}
			return &framework.Result{PrimaryProfile: name, Profiles: results}, nil
		}
	}
	return nil, fmt.Errorf("%s: want exactly one profile result, have %d", h.name, len(results))
}
