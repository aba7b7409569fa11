package flowcontrol

import (
	"fmt"
	"time"
)

// Policy type names, as upstream's flow-control plugins name them.
const (
	FCFSOrderingPolicyType         = "fcfs-ordering-policy"
	EDFOrderingPolicyType          = "edf-ordering-policy"
	RoundRobinFairnessPolicyType   = "round-robin-fairness-policy"
	GlobalStrictFairnessPolicyType = "global-strict-fairness-policy"
)

// DefaultFlowID is the flow of a request that names none, as upstream.
const DefaultFlowID = "default-flow"

// HeaderFairnessID names a request's flow.
const HeaderFairnessID = "x-gateway-inference-fairness-id"

// Upstream's per-band defaults.
const (
	DefaultBandMaxBytes    = 1_000_000_000
	DefaultBandMaxRequests = 5000
)

// Ordering is how a flow's queue orders its requests.
type Ordering int

const (
	// FCFS serves a flow's requests by arrival.
	FCFS Ordering = iota
	// EDF serves the earliest deadline first: arrival plus the TTFT SLO,
	// else plus the TTL; requests with neither come last, by arrival.
	EDF
)

// Fairness is how a band chooses the flow it serves next.
type Fairness int

const (
	// GlobalStrict serves the band's best request by its ordering, across
	// all flows (upstream's default).
	GlobalStrict Fairness = iota
	// RoundRobin serves the band's flows in turn, one request each.
	RoundRobin
)

// ParseOrdering reads an ordering policy's type name.
func ParseOrdering(s string) (Ordering, error) {
	switch s {
	case "", FCFSOrderingPolicyType:
		return FCFS, nil
	case EDFOrderingPolicyType:
		return EDF, nil
	}
	return 0, fmt.Errorf("ordering policy %q: want %s or %s", s, FCFSOrderingPolicyType, EDFOrderingPolicyType)
}

// ParseFairness reads a fairness policy's type name.
func ParseFairness(s string) (Fairness, error) {
	switch s {
	case "", GlobalStrictFairnessPolicyType:
		return GlobalStrict, nil
	case RoundRobinFairnessPolicyType:
		return RoundRobin, nil
	}
	return 0, fmt.Errorf("fairness policy %q: want %s or %s", s, GlobalStrictFairnessPolicyType, RoundRobinFairnessPolicyType)
}

func (o Ordering) String() string {
	if o == EDF {
		return EDFOrderingPolicyType
	}
	return FCFSOrderingPolicyType
}

func (f Fairness) String() string {
	if f == RoundRobin {
		return RoundRobinFairnessPolicyType
	}
	return GlobalStrictFairnessPolicyType
}

// Band configures one priority band. Zero limits take upstream's
// defaults (1 GB, 5000 requests).
type Band struct {
	Priority    int
	MaxBytes    int64
	MaxRequests int
	Ordering    Ordering
	Fairness    Fairness
	// TTFTTarget, when set, releases a request without a TTFT SLO once
	// some endpoint's predicted TTFT for it is at most this; zero leaves
	// such requests to the saturation test.
	TTFTTarget time.Duration
}

// Config is the flow controller's configuration, upstream's flowControl
// section. Zero global limits mean none.
type Config struct {
	MaxBytes    int64
	MaxRequests int
	// DefaultTTL bounds a request's wait when it brings no TTL of its
	// own; zero: only the client's going away ends it.
	DefaultTTL time.Duration
	// DefaultBand is the template of bands for priorities Bands does not name.
	DefaultBand Band
	Bands       []Band
	// MaxFlowLabels caps the fairness_id label's values: the first this
	// many flows seen have their own, the rest share "other" (default 16).
	MaxFlowLabels int
	// Recheck bounds how long a held request waits for an event before
	// its release is evaluated again (default 100ms).
	Recheck time.Duration
	// FairShare serves flows by their share of what was released across
	// every band, not band by band: the next request is the waiting flow's
	// that has had the least work released lately (share.go), its highest
	// priority first; priority decides between flows only at equal usage. A flow that floods the
	// pool so waits behind others' requests of any priority, and within
	// a flow interactive work still goes before batch. Upstream has no
	// such policy (its bands are strict); kvroute's default, when no
	// flowControl section configures the bands.
	FairShare bool
}

// Validate checks the configuration's values.
func (c *Config) Validate() error {
	if c.MaxBytes < 0 || c.MaxRequests < 0 || c.DefaultTTL < 0 {
		return fmt.Errorf("flow control: negative limit or TTL")
	}
	seen := map[int]bool{}
	for _, b := range append([]Band{c.DefaultBand}, c.Bands...) {
		if b.MaxBytes < 0 || b.MaxRequests < 0 || b.TTFTTarget < 0 {
			return fmt.Errorf("flow control: band %d: negative limit or target", b.Priority)
		}
	}
	for _, b := range c.Bands {
		if seen[b.Priority] {
			return fmt.Errorf("flow control: priority band %d configured twice", b.Priority)
		}
		seen[b.Priority] = true
	}
	return nil
}

func (b Band) withDefaults() Band {
	if b.MaxBytes == 0 {
		b.MaxBytes = DefaultBandMaxBytes
	}
	if b.MaxRequests == 0 {
		b.MaxRequests = DefaultBandMaxRequests
	}
	return b
}
