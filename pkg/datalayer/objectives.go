package datalayer

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Objective is what an InferenceObjective says of the requests that name
// it (x-gateway-inference-objective): their priority (below zero they may
// be shed) and the latency objectives they get when their headers set
// none.
type Objective struct {
	Name     string
	Priority int
	// TTFT and TPOT are the default SLOs; zero means none.
	TTFT, TPOT time.Duration
}

// Objectives holds the pool's objectives by name. Reads take no lock (an
// immutable map swapped on every change); one discovery source writes.
type Objectives struct {
	mu    sync.Mutex
	snap  atomic.Pointer[map[string]Objective]
	count prometheus.Gauge
}

// NewObjectives returns an empty set, its gauge registered with reg unless
// reg is nil.
func NewObjectives(reg prometheus.Registerer) *Objectives {
	o := &Objectives{count: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvroute_objectives",
		Help: "InferenceObjectives known to the EPP.",
	})}
	o.snap.Store(&map[string]Objective{})
	if reg != nil {
		reg.MustRegister(o.count)
	}
	return o
}

// Get returns the objective named name.
func (o *Objectives) Get(name string) (Objective, bool) {
	if o == nil {
		return Objective{}, false
	}
	obj, ok := (*o.snap.Load())[name]
	return obj, ok
}

// Len is the number of objectives; 0 for nil.
func (o *Objectives) Len() int {
	if o == nil {
		return 0
	}
	return len(*o.snap.Load())
}

// List returns every objective, by name.
func (o *Objectives) List() []Objective {
	m := *o.snap.Load()
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b Objective) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Set adds or replaces one objective.
func (o *Objectives) Set(obj Objective) {
	o.update(func(m map[string]Objective) { m[obj.Name] = obj })
}

// Delete removes the objective named name.
func (o *Objectives) Delete(name string) {
	o.update(func(m map[string]Objective) { delete(m, name) })
}

// Replace makes all the whole set, as a reloaded file does.
func (o *Objectives) Replace(all []Objective) {
	o.update(func(m map[string]Objective) {
		clear(m)
		for _, obj := range all {
			m[obj.Name] = obj
		}
	})
}

func (o *Objectives) update(f func(map[string]Objective)) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m := maps.Clone(*o.snap.Load())
	f(m)
	o.snap.Store(&m)
	o.count.Set(float64(len(m)))
}
