package framework

import (
	"encoding/json"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/plugin"
)

// DefaultMetricsStaleness is how old scraped metrics may be before a plugin
// treats the endpoint's load as unknown, when the handle gives no value.
const DefaultMetricsStaleness = 2 * time.Second

// RequestBlockKeysKey is the key under which a PrepareData producer publishes
// the request's block keys (a []uint64, the same slice on every candidate),
// so that a post-pick hook can record speculative holdings for them.
const RequestBlockKeysKey = "RequestBlockKeysKey"

// ApproxHashesKey is the key under which a PrepareData producer publishes
// the request's approximate (routing-history) hashes, a []uint64, when its
// token ids are unknown and only the text could be hashed.
const ApproxHashesKey = "ApproxPrefixHashesKey"

// HistoryRecorder is implemented by a Speculator that also keeps a routing
// history: per endpoint, the hashes (block keys, or a text's hashes when the
// token ids are unknown) of the requests sent there, LRU-bounded, as
// upstream's approximate prefix index keeps them.
type HistoryRecorder interface {
	RecordHistory(addr string, hashes []uint64)
}

// Speculator records that an endpoint will soon hold blocks: after a pick,
// the picked endpoint is about to compute the request's prefix, so requests
// arriving before its KV events can already be sent there. keys are the
// request's block keys for the endpoint, of which the first held the
// endpoint already holds for real (an exact match): those need no record.
type Speculator interface {
	Speculate(addr string, keys []uint64, held int)
}

// Handle is what plugin factories get from the process at start-up.
type Handle interface {
	// MetricsStaleness is how old metrics may be before load is unknown.
	MetricsStaleness() time.Duration
	// Speculator is nil when the process records no speculative holdings.
	Speculator() Speculator
	// Registerer is where plugins register their Prometheus metrics; nil
	// means don't register.
	Registerer() prometheus.Registerer
	// Plugin returns an instance made earlier in the same configuration, for
	// plugins that build on another.
	Plugin(name string) (plugin.Plugin, bool)
}

// Factory makes a plugin instance named name from its raw JSON parameters
// (nil when the configuration gives none). It must reject unknown
// parameters; DecodeParams does that.
type Factory func(name string, params json.RawMessage, h Handle) (plugin.Plugin, error)

// StalenessOf returns h's metrics staleness, or DefaultMetricsStaleness when
// h is nil or gives no positive value.
func StalenessOf(h Handle) time.Duration {
	if h != nil {
		if d := h.MetricsStaleness(); d > 0 {
			return d
		}
	}
	return DefaultMetricsStaleness
}

// Resolver is a plugin that names other plugins of its configuration: the
// loader calls ResolveRefs once every plugin is made, so that a reference
// does not depend on the order the file lists the plugins in (upstream's
// files name a decider before or after the handler that uses it).
type Resolver interface {
	ResolveRefs(h Handle) error
}
