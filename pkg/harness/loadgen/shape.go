package loadgen

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// bypass sends a share of the requests to another gateway, which routes
// round-robin over the engines and passes no EPP, and the rest as inner
// routes them.
type bypass struct {
	inner router
	url   string
	share float64
	mu    sync.Mutex
	rng   *rand.Rand
}

func newBypass(inner router, url string, share float64, seed uint64) *bypass {
	return &bypass{inner: inner, url: url, share: share, rng: rand.New(rand.NewPCG(seed, 0xb1a5))}
}

func (b *bypass) route(prompt string, tokens []uint32) (base, endpoint string) {
	b.mu.Lock()
	away := b.rng.Float64() < b.share
	b.mu.Unlock()
	if away {
		return b.url, ""
	}
	return b.inner.route(prompt, tokens)
}

// isBypass says whether base is r's bypass gateway.
func isBypass(r router, base string) bool {
	b, ok := r.(*bypass)
	return ok && base == b.url
}

// Restart is what an EPP restart in the middle of a run did to the hit
// rate.
//
// Steady state is defined before measuring: the token hit rate (cached
// over prompt tokens) of the requests served through an EPP that started
// in the second half of the time before the stop, when the caches are
// warm and every replica has long been up. The new replica is back at
// steady state from the first of its picks that opens a window of
// RecoveryWindow consecutive picks of its own whose hit rate is at least
// RecoveryShare of the steady state; Recovery runs from its readiness (the
// moment the gateway's health check first passed it) to that pick's
// start.
type Restart struct {
	// StopAt and ReadyAt are since the run's start: when the old replica
	// was stopped, and when the new one passed its first health check.
	StopAt, ReadyAt time.Duration
	Old, New        string
	Steady          float64
	// Recovered says whether the new replica's picks reached steady state
	// within the run; Recovery is then how long after readiness.
	Recovered bool
	Recovery  time.Duration
	// NewPicks counts the requests the new replica picked.
	NewPicks int
	// Timeline is the hit rate of the requests passed through an EPP, by
	// the second of the run they started in.
	Timeline []HitBucket
}

// HitBucket is the hit rate of the requests that started in one bucket
// of a run's time.
type HitBucket struct {
	From     time.Duration
	Requests int
	HitRate  float64
}

// Recovery's terms (see Restart).
const (
	RecoveryWindow = 10
	RecoveryShare  = 0.95
	timelineBucket = time.Second
)

// restartRun is a restart as it happens: when, and which replicas.
type restartRun struct {
	at              time.Duration
	stopAt, readyAt time.Duration
	old, new        string
	err             error
	done            chan struct{}
}

// restartDuring stops the first replica at rs.at into the run begun at
// start, takes its host out of the gateway's cluster, and starts a fresh
// one on the same configuration, which the gateway takes into rotation
// once its health check passes.
func (env *Env) restartDuring(ctx context.Context, w Workload, start time.Time, rs *restartRun) {
	defer close(rs.done)
	select {
	case <-ctx.Done():
		rs.err = ctx.Err()
		return
	case <-time.After(time.Until(start.Add(rs.at))):
	}
	env.mu.Lock()
	old := env.replicas[0]
	env.restarts++
	name := fmt.Sprintf("epp-0.%d", env.restarts)
	env.mu.Unlock()
	rs.old, rs.new = old.Host().Name, name
	rs.stopAt = time.Since(start)
	if err := old.Stop(); err != nil {
		rs.err = err
	}
	// The pod's endpoint leaves the ext_proc cluster, as the gateway's
	// service discovery removes a pod that went away; left in, an
	// unhealthy host would count against Envoy's panic threshold.
	if err := env.Gateway.RemoveHost(rs.old); err != nil {
		rs.err = err
	}
	r, err := env.startReplica(name)
	if err != nil {
		rs.err = err
		return
	}
	env.mu.Lock()
	env.replicas = slices.DeleteFunc(env.replicas, func(x Replica) bool { return x == old })
	if k, ok := r.(*kvroute); ok {
		env.EPP = k.e
	}
	env.mu.Unlock()
	if os, ok := r.(objectiveSetter); ok {
		os.setObjectives(w)
	}
	if err := env.waitReady(ctx, r); err != nil {
		rs.err = err
		return
	}
	if err := env.Gateway.AddHost(r.Host()); err != nil {
		rs.err = err
		return
	}
	for {
		healthy := false
		for _, h := range env.Gateway.Hosts() {
			healthy = healthy || (h.Name == name && h.Healthy)
		}
		if healthy {
			break
		}
		select {
		case <-ctx.Done():
			rs.err = ctx.Err()
			return
		case <-time.After(time.Millisecond):
		}
	}
	rs.readyAt = time.Since(start)
}

// measure reads the restart's effect from the run's samples.
func (rs *restartRun) measure(samples []Sample) *Restart {
	if rs.err != nil || rs.new == "" {
		return nil
	}
	out := &Restart{StopAt: rs.stopAt, ReadyAt: rs.readyAt, Old: rs.old, New: rs.new}
	sorted := slices.Clone(samples)
	slices.SortFunc(sorted, func(a, b Sample) int { return int(a.Start - b.Start) })
	var steady hits
	var mine []Sample
	buckets := map[int]*hits{}
	last := 0
	for _, s := range sorted {
		if s.Err != nil || s.Shed || s.Bypass || s.PromptTokens == 0 {
			continue
		}
		if s.Start >= rs.stopAt/2 && s.Start < rs.stopAt {
			steady.add(s)
		}
		if s.Replica == rs.new {
			mine = append(mine, s)
		}
		k := int(s.Start / timelineBucket)
		if buckets[k] == nil {
			buckets[k] = &hits{}
		}
		buckets[k].add(s)
		last = max(last, k)
	}
	out.Steady = steady.rate()
	out.NewPicks = len(mine)
	for k := 0; k <= last; k++ {
		b := HitBucket{From: time.Duration(k) * timelineBucket}
		if h := buckets[k]; h != nil {
			b.Requests, b.HitRate = h.n, h.rate()
		}
		out.Timeline = append(out.Timeline, b)
	}
	for i := 0; i+RecoveryWindow <= len(mine); i++ {
		var w hits
		for _, s := range mine[i : i+RecoveryWindow] {
			w.add(s)
		}
		if w.rate() >= RecoveryShare*out.Steady {
			out.Recovered = true
			out.Recovery = max(0, mine[i].Start-rs.readyAt)
			break
		}
	}
	return out
}

// hits sums prompt and cached tokens.
type hits struct{ n, prompt, cached int }

func (h *hits) add(s Sample) { h.n++; h.prompt += s.PromptTokens; h.cached += s.CachedTokens }

func (h *hits) rate() float64 {
	if h.prompt == 0 {
		return 0
	}
	return float64(h.cached) / float64(h.prompt)
}

// Verdict says in words how long the new replica took to reach steady
// state.
func (r *Restart) Verdict() string {
	if !r.Recovered {
		return fmt.Sprintf("its %d picks never reached %.0f%% of it", r.NewPicks, 100*RecoveryShare)
	}
	return fmt.Sprintf("its picks back at steady state %s after readiness", r.Recovery.Round(time.Millisecond))
}
