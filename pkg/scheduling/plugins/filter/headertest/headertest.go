// Package headertest is the header-based-testing-filter the Gateway API
// Inference Extension's conformance suite configures: it keeps the
// endpoints a request's test-epp-endpoint-selection header names (IPs, or
// IP:port pairs, comma-separated), in the header's order, and none when the
// header is missing.
package headertest

import (
	"context"
	"encoding/json"
	"net"
	"strings"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Type is the plugin's registered type name.
const Type = "header-based-testing-filter"

// Header is the request header naming the endpoints to keep.
const Header = "test-epp-endpoint-selection"

// Filter is the testing filter.
type Filter struct{ name plugin.TypedName }

var _ framework.Filter = (*Filter)(nil)

// Factory makes the filter; it takes no parameters.
func Factory(name string, raw json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
	var p struct{}
	if err := framework.DecodeParams(Type, name, raw, &p); err != nil {
		return nil, err
	}
	return &Filter{name: plugin.TypedName{Type: Type, Name: name}}, nil
}

// TypedName implements plugin.Plugin.
func (f *Filter) TypedName() plugin.TypedName { return f.name }

// Filter implements framework.Filter.
func (f *Filter) Filter(_ context.Context, _ *framework.CycleState, req *request.Request, cands []*datalayer.Candidate) []*datalayer.Candidate {
	out := cands[:0:0]
	hv := strings.TrimSpace(req.Headers[Header])
	if hv == "" {
		return out
	}
	seen := map[*datalayer.Candidate]bool{}
	for _, item := range strings.Split(hv, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		host, port, err := net.SplitHostPort(item)
		if err != nil {
			host, port = strings.Trim(item, "[]"), ""
		}
		for _, c := range cands {
			ch, cp, err := net.SplitHostPort(c.Address)
			if err != nil || seen[c] || ch != host || (port != "" && cp != port) {
				continue
			}
			seen[c] = true
			out = append(out, c)
			break
		}
	}
	return out
}
