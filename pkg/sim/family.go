package sim

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Family is an engine family: how an engine schedules and prices its
// steps, and how it reports what it holds. Every family serves the same
// vLLM HTTP API, /metrics and KV events; they differ where a router or a
// latency predictor tuned on one engine would be wrong about another.
// The zero value is FamilyVLLM with vLLM's own usage metric.
type Family struct {
	// Name is one of FamilyNames.
	Name string
	// Usage is what vllm:kv_cache_usage_perc counts.
	Usage UsageMode
	// Silence is how long after start the engine publishes no KV events
	// (they are lost, as a ZeroMQ PUB socket loses what it sends before
	// anyone listens); with SilentMetrics its /metrics also answers 503.
	Silence       time.Duration
	SilentMetrics bool
}

// The families by name.
const (
	// FamilyVLLM is vLLM's scheduler with chunked prefill, the one the
	// EPP's predictor replays.
	FamilyVLLM = "vllm"
	// FamilyNoChunk prefills prompts whole in steps of their own: while
	// any waiting prompt can be admitted, running sequences decode nothing.
	FamilyNoChunk = "no-chunk"
	// FamilyFIFO runs at most MaxSeqs requests at once, admitted in arrival
	// order when a slot is free, each prefilled whole in its first step
	// (beside the others' decodes) and then decoded: no token budget.
	FamilyFIFO = "fifo"
	// FamilyDrawn is vLLM's scheduler whose prefill cost per token and
	// overhead per request are drawn per engine and per run from ranges.
	FamilyDrawn = "drawn"
)

// FamilyNames are the families ParseFamily knows, in the order reports
// list them.
var FamilyNames = []string{FamilyVLLM, FamilyNoChunk, FamilyFIFO, FamilyDrawn}

// The ranges FamilyDrawn draws from: prefill per token from half to twice
// the base timing's, overhead per request from none to DrawnMaxOverhead.
const (
	drawnMinPrefill  = 0.5
	drawnMaxPrefill  = 2.0
	DrawnMaxOverhead = 30 * time.Millisecond
)

// UsageMode is what an engine's KV usage metric counts.
type UsageMode int

const (
	// UsageRunning counts the GPU blocks running requests hold: cached
	// blocks no request uses count as free, as vLLM reports it.
	UsageRunning UsageMode = iota
	// UsageResident also counts cached blocks no request uses: once warm
	// the cache reads nearly full whatever the load.
	UsageResident
)

// ErrUnknownFamily is a family specification ParseFamily cannot read.
var ErrUnknownFamily = errors.New("sim: unknown engine family")

// ParseFamily reads a family specification: a name, then traits after
// commas: "usage=running" or "usage=resident", "silent=<duration>" (no KV
// events for that long after start), "silent-metrics" (nor metrics). An
// empty specification is FamilyVLLM.
func ParseFamily(spec string) (Family, error) {
	parts := strings.Split(strings.TrimSpace(spec), ",")
	f := Family{Name: strings.TrimSpace(parts[0])}
	if f.Name == "" {
		f.Name = FamilyVLLM
	}
	if !slices.Contains(FamilyNames, f.Name) {
		return Family{}, fmt.Errorf("%w %q (known: %s)", ErrUnknownFamily, f.Name, strings.Join(FamilyNames, ", "))
	}
	for _, p := range parts[1:] {
		k, v, _ := strings.Cut(strings.TrimSpace(p), "=")
		switch k {
		case "usage":
			switch v {
			case "running":
				f.Usage = UsageRunning
			case "resident":
				f.Usage = UsageResident
			default:
				return Family{}, fmt.Errorf("%w: usage %q (running or resident)", ErrUnknownFamily, v)
			}
		case "silent":
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return Family{}, fmt.Errorf("%w: silent %q: not a duration of 0 or more", ErrUnknownFamily, v)
			}
			f.Silence = d
		case "silent-metrics":
			f.SilentMetrics = true
		default:
			return Family{}, fmt.Errorf("%w: trait %q", ErrUnknownFamily, p)
		}
	}
	if f.SilentMetrics && f.Silence == 0 {
		return Family{}, fmt.Errorf("%w: silent-metrics needs silent=<duration>", ErrUnknownFamily)
	}
	return f, nil
}

// String is the family's specification, as ParseFamily reads it.
func (f Family) String() string {
	name := f.Name
	if name == "" {
		name = FamilyVLLM
	}
	if f.Usage == UsageResident {
		name += ",usage=resident"
	}
	if f.Silence > 0 {
		name += ",silent=" + f.Silence.String()
	}
	if f.SilentMetrics {
		name += ",silent-metrics"
	}
	return name
}

// Describe is the family's one-line description, traits included.
func (f Family) Describe() string {
	var d string
	switch f.Name {
	case FamilyNoChunk:
		d = "no chunked prefill: prompts are prefilled whole in steps of their own, and running sequences decode nothing while a waiting prompt can be admitted"
	case FamilyFIFO:
		d = "a fixed concurrency limit with FIFO admission: a request starts when one of max_num_seqs slots is free, in arrival order, and is prefilled whole in its first step, then decoded; no token budget"
	case FamilyDrawn:
		d = "vLLM's scheduler with prefill cost per token drawn per engine and run from " + strconv.FormatFloat(drawnMinPrefill, 'g', -1, 64) + "× to " + strconv.FormatFloat(drawnMaxPrefill, 'g', -1, 64) + "× the base, and a fixed overhead per request drawn from 0 to " + DrawnMaxOverhead.String()
	default:
		d = "vLLM's scheduler: a token budget per step shared by decodes and chunked prefills (what kvroute's predictor replays)"
	}
	if f.Usage == UsageResident {
		d += "; KV usage counts cached blocks no request uses"
	}
	if f.Silence > 0 {
		d += "; no KV events for the first " + f.Silence.String()
		if f.SilentMetrics {
			d += ", nor metrics"
		}
	}
	return d
}

// Timing is the timing of engine i of a fleet whose pools are seeded with
// seed, for this family on base: a drawn family draws from (seed, i), so
// that every run has other costs and each engine its own, fixed for the run.
func (f Family) Timing(base Timing, seed uint64, i int) Timing {
	switch f.Name {
	case FamilyNoChunk:
		base.Scheduler, base.MaxBatchedTokens = SchedPrefillFirst, 0
	case FamilyFIFO:
		base.Scheduler, base.MaxBatchedTokens = SchedChunked, 0
	case FamilyDrawn:
		r := rand.New(rand.NewPCG(seed, 0xd7a3<<32|uint64(i)))
		scale := drawnMinPrefill + r.Float64()*(drawnMaxPrefill-drawnMinPrefill)
		base.PrefillPerToken = time.Duration(float64(base.PrefillPerToken) * scale)
		base.RequestOverhead = time.Duration(r.Int64N(int64(DrawnMaxOverhead) + 1))
	}
	return base
}
