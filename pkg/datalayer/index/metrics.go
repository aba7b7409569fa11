package index

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// Why an event (or some of its blocks) was not applied; the label values of
// kvroute_index_events_dropped_total.
const (
	dropUnknownEndpoint = iota
	dropUnknownParent
	dropUnknownHandle
	dropUnknownKind
	dropMalformed
	dropPartialBlock
	dropOtherGroup
	dropDuplicateBatch
	dropCapacity
	dropRefOverflow
	dropNoEndpointID
	dropEndpointCapacity
	numDropReasons
)

var dropReasonNames = [numDropReasons]string{
	dropUnknownEndpoint: "unknown_endpoint",
	dropUnknownParent:   "unknown_parent",
	dropUnknownHandle:   "unknown_handle",
	dropUnknownKind:     "unknown_kind",
	dropMalformed:       "malformed",
	dropPartialBlock:    "partial_block",
	dropOtherGroup:      "other_group",
	dropDuplicateBatch:  "duplicate_batch",
	dropCapacity:        "capacity",
	dropRefOverflow:     "ref_overflow",
	dropNoEndpointID:    "no_endpoint_id",
	// endpoint_capacity: the endpoint's own bound (MaxHoldingsPerEndpoint).
	dropEndpointCapacity: "endpoint_capacity",
}

// Why holdings were evicted rather than removed by an event.
const (
	evictMaxAge = iota
	evictSpeculative
	numEvictReasons
)

var evictReasonNames = [numEvictReasons]string{
	evictMaxAge:      "max_age",
	evictSpeculative: "speculative_ttl",
}

// indexStats are plain atomics updated in bulk (per batch) and read by the
// collector at scrape time, so Apply pays no per-block metric cost.
type indexStats struct {
	holdings  [events.NumTiers]atomic.Int64
	blocks    atomic.Int64
	spec      atomic.Int64
	applied   [events.KindAllBlocksCleared + 1]atomic.Int64
	dropped   [numDropReasons]atomic.Int64
	evictions [numEvictReasons]atomic.Int64
	uncertain [events.NumReasons]atomic.Int64
	restarts  atomic.Int64
	ignored   [events.NumIgnored]atomic.Int64
}

func (s *indexStats) add(d *delta) {
	for t, n := range d.holdings {
		if n != 0 {
			s.holdings[t].Add(n)
		}
	}
	if d.blocks != 0 {
		s.blocks.Add(d.blocks)
	}
	if d.spec != 0 {
		s.spec.Add(d.spec)
	}
}

var (
	descHoldings = prometheus.NewDesc("kvroute_index_holdings",
		"(block, endpoint) holdings in the exact prefix index, by cache tier.", []string{"tier"}, nil)
	descBlocks = prometheus.NewDesc("kvroute_index_blocks",
		"Distinct block keys held by at least one endpoint.", nil, nil)
	descEndpoints = prometheus.NewDesc("kvroute_index_endpoints",
		"Endpoints whose events the index applies.", nil, nil)
	descSpec = prometheus.NewDesc("kvroute_index_speculative_holdings",
		"Holdings recorded from picks, not yet confirmed by events or expired.", nil, nil)
	descApplied = prometheus.NewDesc("kvroute_index_events_applied_total",
		"KV events applied, by kind.", []string{"kind"}, nil)
	descDropped = prometheus.NewDesc("kvroute_index_events_dropped_total",
		"Events or blocks not applied, by reason.", []string{"reason"}, nil)
	descEvictions = prometheus.NewDesc("kvroute_index_evictions_total",
		"Holdings evicted by the index itself, by reason.", []string{"reason"}, nil)
	descUncertain = prometheus.NewDesc("kvroute_index_uncertain_total",
		"Times a stream was marked uncertain, by reason.", []string{"reason"}, nil)
	descRestarts = prometheus.NewDesc("kvroute_index_restarts_total",
		"Engine restarts that cleared a stream.", nil, nil)
	descStates = prometheus.NewDesc("kvroute_index_endpoint_states",
		"Endpoints by the trust state of their event streams (none, exact, partial, recovering, uncertain).", []string{"state"}, nil)
	descIgnored = prometheus.NewDesc("kvroute_index_event_fields_ignored_total",
		"Event fields decoded but not acted on, by field (unknown: fields no known publisher sends).", []string{"field"}, nil)
)

type indexCollector struct{ ix *Index }

func (c *indexCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descHoldings, descBlocks, descEndpoints, descSpec,
		descApplied, descDropped, descEvictions, descUncertain, descRestarts, descStates, descIgnored} {
		ch <- d
	}
}

func (c *indexCollector) Collect(ch chan<- prometheus.Metric) {
	s := &c.ix.stats
	for t := events.Tier(0); t < events.NumTiers; t++ {
		ch <- prometheus.MustNewConstMetric(descHoldings, prometheus.GaugeValue, float64(s.holdings[t].Load()), t.String())
	}
	ch <- prometheus.MustNewConstMetric(descBlocks, prometheus.GaugeValue, float64(s.blocks.Load()))
	ch <- prometheus.MustNewConstMetric(descEndpoints, prometheus.GaugeValue, float64(len(*c.ix.members.Load())))
	ch <- prometheus.MustNewConstMetric(descSpec, prometheus.GaugeValue, float64(s.spec.Load()))
	for k := events.KindBlockStored; k <= events.KindAllBlocksCleared; k++ {
		ch <- prometheus.MustNewConstMetric(descApplied, prometheus.CounterValue, float64(s.applied[k].Load()), k.String())
	}
	for r, name := range dropReasonNames {
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.dropped[r].Load()), name)
	}
	for r, name := range evictReasonNames {
		ch <- prometheus.MustNewConstMetric(descEvictions, prometheus.CounterValue, float64(s.evictions[r].Load()), name)
	}
	for r := events.ReasonGap; r < events.NumReasons; r++ {
		ch <- prometheus.MustNewConstMetric(descUncertain, prometheus.CounterValue, float64(s.uncertain[r].Load()), r.String())
	}
	ch <- prometheus.MustNewConstMetric(descRestarts, prometheus.CounterValue, float64(s.restarts.Load()))
	var states [datalayer.NumStreamStates]int
	for _, ep := range *c.ix.members.Load() {
		if st := datalayer.StreamState(ep.state.Load()); st < datalayer.NumStreamStates {
			states[st]++
		}
	}
	for _, st := range datalayer.AllStreamStates {
		ch <- prometheus.MustNewConstMetric(descStates, prometheus.GaugeValue, float64(states[st]), st.String())
	}
	for f := events.Ignored(0); f < events.NumIgnored; f++ {
		ch <- prometheus.MustNewConstMetric(descIgnored, prometheus.CounterValue, float64(s.ignored[f].Load()), f.String())
	}
}
