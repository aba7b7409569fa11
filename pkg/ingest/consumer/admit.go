package consumer

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
)

// Membership says which endpoints discovery assigns to which pod: what the
// consumer holds each batch's identity to. The EPP's datastore is one.
type Membership interface {
	// PodOf returns the pod discovery assigns the endpoint at addr to; ok
	// is false when addr is no endpoint of the pool.
	PodOf(addr string) (pod string, ok bool)
}

// MembershipFunc makes a function a Membership.
type MembershipFunc func(addr string) (pod string, ok bool)

// PodOf calls f.
func (f MembershipFunc) PodOf(addr string) (string, bool) { return f(addr) }

// DefaultMaxRanksPerEndpoint is Options.MaxRanksPerEndpoint when zero:
// more data-parallel engines than any one API server fronts.
const DefaultMaxRanksPerEndpoint = 32

// rejection is why a message whose headers parsed was refused all the same:
// the identity it claims does not hold. A rejected message changes nothing
// and leaves no state behind.
type rejection uint8

const (
	admitted rejection = iota
	// rejectBadSubject: the subject is not kv.events.<ns>.<pool>.<pod>.
	rejectBadSubject
	// rejectPodMismatch: Kv-Pod names another pod than the subject.
	rejectPodMismatch
	// rejectUnknownEndpoint: Kv-Endpoint is no endpoint of the pool.
	rejectUnknownEndpoint
	// rejectOtherPod: Kv-Endpoint is an endpoint discovery assigns to
	// another pod than the subject's.
	rejectOtherPod
	// rejectRankLimit: the endpoint already has MaxRanksPerEndpoint
	// data-parallel streams and this batch names another.
	rejectRankLimit
	numRejections
)

var rejectionNames = [numRejections]string{
	rejectBadSubject:      "bad_subject",
	rejectPodMismatch:     "pod_mismatch",
	rejectUnknownEndpoint: "unknown_endpoint",
	rejectOtherPod:        "endpoint_of_other_pod",
	rejectRankLimit:       "rank_limit",
}

// admitter binds each batch to the pod its subject names. The subject is
// the one part of a message the NATS server vouches for: with per-pod
// publish permissions (docs/security.md) only the pod's own relay can
// publish on it. So the pod is the subject's, and the headers may only
// agree with it: Kv-Pod, when sent, must be the same pod, and Kv-Endpoint
// must be an endpoint discovery gives that pod.
type admitter struct {
	members  Membership
	maxRanks int
	idle     time.Duration

	rejected [numRejections]prometheus.Counter
	vec      *prometheus.CounterVec

	// mu guards ranks: the data-parallel ranks seen per endpoint, which is
	// what bounds the streams (and so the state downstream) per endpoint.
	mu    sync.Mutex
	ranks map[string]*rankSet
	// sweepAt is the size of ranks at which it is next swept.
	sweepAt int
}

type rankSet struct {
	ranks []int
	seen  time.Time
}

func newAdmitter(members Membership, maxRanks int, idle time.Duration) *admitter {
	a := &admitter{
		members: members, maxRanks: maxRanks, idle: idle,
		ranks:   make(map[string]*rankSet),
		sweepAt: 64,
		vec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_events_rejected_total",
			Help: "KV-event messages refused because the identity they claim does not hold (subject, Kv-Pod, Kv-Endpoint, rank count), by reason; they change nothing.",
		}, []string{"reason"}),
	}
	for r := rejectBadSubject; r < numRejections; r++ {
		a.rejected[r] = a.vec.WithLabelValues(rejectionNames[r])
	}
	return a
}

// admit checks o, read from the headers of a message on subject, and
// fills in o.Pod from discovery when the headers left it out.
func (a *admitter) admit(subject string, o *events.Origin, now time.Time) rejection {
	_, _, pod, ok := events.ParseSubject(subject)
	if !ok {
		return rejectBadSubject
	}
	if o.Pod != "" && events.SubjectToken(o.Pod) != pod {
		return rejectPodMismatch
	}
	if a.members != nil {
		owner, ok := a.members.PodOf(o.Endpoint)
		if !ok {
			return rejectUnknownEndpoint
		}
		if events.SubjectToken(owner) != pod {
			return rejectOtherPod
		}
		if o.Pod == "" {
			o.Pod = owner
		}
	}
	return a.rank(o.Stream, now)
}

// rank admits the stream's rank if the endpoint already has it or has
// room for one more.
func (a *admitter) rank(s events.Stream, now time.Time) rejection {
	a.mu.Lock()
	defer a.mu.Unlock()
	rs := a.ranks[s.Endpoint]
	if rs == nil {
		if len(a.ranks) >= a.sweepAt {
			a.sweep(now)
		}
		rs = &rankSet{}
		a.ranks[s.Endpoint] = rs
	}
	rs.seen = now
	if slices.Contains(rs.ranks, s.DPRank) {
		return admitted
	}
	if len(rs.ranks) >= a.maxRanks {
		return rejectRankLimit
	}
	rs.ranks = append(rs.ranks, s.DPRank)
	return admitted
}

// sweep forgets the ranks of endpoints that left the pool or fell quiet
// for IdleTimeout, and sets the size of the next sweep to twice what is
// left, so that sweeping costs O(1) per endpoint added. Called with mu held.
func (a *admitter) sweep(now time.Time) {
	for ep, rs := range a.ranks {
		gone := now.Sub(rs.seen) > a.idle
		if !gone && a.members != nil {
			_, member := a.members.PodOf(ep)
			gone = !member
		}
		if gone {
			delete(a.ranks, ep)
		}
	}
	a.sweepAt = max(64, 2*len(a.ranks))
}
