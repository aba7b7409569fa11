// Package plugin holds what every kvroute plugin is, whatever extension point
// it serves: a typed name, and the data keys it produces and consumes, from
// which the data-dependency graph is built and checked at start-up.
package plugin

import (
	"context"
	"fmt"

	"github.com/kvroute/kvroute/pkg/request"
)

// TypedName names a plugin instance: Type is its registered kebab-case type
// ("precise-prefix-cache-scorer"), Name the instance name from the config
// (the type when the config gives none).
type TypedName struct {
	Type string
	Name string
}

func (t TypedName) String() string { return fmt.Sprintf("%s/%s", t.Name, t.Type) }

// Plugin is the one thing every plugin does.
type Plugin interface {
	TypedName() TypedName
}

// Producer is a plugin that publishes per-endpoint data under keys. The map
// gives, for each key, an exemplar value of the type it publishes; types are
// compared with reflect, never with ==.
type Producer interface {
	Plugin
	Produces() map[string]any
}

// Consumer is a plugin that reads per-endpoint data under keys, each with an
// exemplar of the type it expects.
type Consumer interface {
	Plugin
	Consumes() map[string]any
}

// ResponseObserver is a plugin that learns from what endpoints answer (the
// latency predictor trains on it). The request path calls it once per
// routed request, after the response has ended, off the pick's path; it
// must not block.
type ResponseObserver interface {
	Plugin
	ObserveResponse(ctx context.Context, req *request.Request, resp *request.Response)
}
