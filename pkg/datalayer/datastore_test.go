package datalayer

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/testkit"
)

func ep(name, addr string) *Endpoint {
	return &Endpoint{Name: name, Address: addr, Pod: name, Model: "m"}
}

func names(eps []*Endpoint) []string {
	out := make([]string, len(eps))
	for i, e := range eps {
		out[i] = e.Name
	}
	return out
}

// changeLog records OnChange calls as readable lines.
type changeLog struct {
	mu    sync.Mutex
	lines []string
}

func (c *changeLog) hook(added, removed []*Endpoint) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lines = append(c.lines, fmt.Sprintf("+%v -%v", names(added), names(removed)))
}

func (c *changeLog) get() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.lines)
}

func TestDatastoreMembership(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	ds := NewDatastore(reg)
	ds.Upsert(ep("b", "10.0.0.2:8000"))
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	ds.Upsert(ep("c", "10.0.0.3:8000"))
	if got := names(ds.List()); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("List() = %v, want sorted a b c", got)
	}
	ds.Remove("b")
	ds.Remove("nobody")
	if _, ok := ds.Get("b"); ok {
		t.Fatal("removed endpoint b is still there")
	}
	if e, ok := ds.Get("c"); !ok || e.Address != "10.0.0.3:8000" {
		t.Fatalf("Get(c) = %v, %v", e, ok)
	}
	if got := testutil.ToFloat64(ds.endpoints); got != 2 {
		t.Fatalf("kvroute_datastore_endpoints = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "kvroute_datastore_endpoints"); err != nil || n != 1 {
		t.Fatalf("gauge not registered: %d, %v", n, err)
	}
}

func TestDatastoreOnChange(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		do   func(ds *Datastore)
		want []string
	}{
		{
			name: "a late subscriber first hears of the endpoints already present",
			do:   func(ds *Datastore) {},
			want: []string{"+[a] -[]"},
		},
		{
			name: "adding and removing endpoints is reported in order",
			do: func(ds *Datastore) {
				ds.Upsert(ep("b", "10.0.0.2:8000"))
				ds.Remove("a")
			},
			want: []string{"+[a] -[]", "+[b] -[]", "+[] -[a]"},
		},
		{
			name: "an identical upsert is not a change",
			do:   func(ds *Datastore) { ds.Upsert(ep("a", "10.0.0.1:8000")) },
			want: []string{"+[a] -[]"},
		},
		{
			name: "a new address is the old endpoint removed and the new one added",
			do:   func(ds *Datastore) { ds.Upsert(ep("a", "10.0.0.9:8000")) },
			want: []string{"+[a] -[]", "+[a] -[a]"},
		},
		{
			name: "new labels at the same address are reported as added only",
			do: func(ds *Datastore) {
				e := ep("a", "10.0.0.1:8000")
				e.Labels = map[string]string{"zone": "b"}
				ds.Upsert(e)
			},
			want: []string{"+[a] -[]", "+[a] -[]"},
		},
		{
			name: "removing an unknown endpoint is not a change",
			do:   func(ds *Datastore) { ds.Remove("zzz") },
			want: []string{"+[a] -[]"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ds := NewDatastore(nil)
			ds.Upsert(ep("a", "10.0.0.1:8000"))
			var log changeLog
			ds.OnChange(log.hook)
			tt.do(ds)
			if got := log.get(); !slices.Equal(got, tt.want) {
				t.Fatalf("changes = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDatastoreUnsubscribeStopsNotifications(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	var log changeLog
	unsubscribe := ds.OnChange(log.hook)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	unsubscribe()
	ds.Upsert(ep("b", "10.0.0.2:8000"))
	if got := log.get(); !slices.Equal(got, []string{"+[a] -[]"}) {
		t.Fatalf("changes = %q, want only a's addition", got)
	}
}

func TestDatastoreMetrics(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name    string
		after   func(ds *Datastore)
		want    int
		present bool
	}{
		{name: "stored metrics are read back", after: func(*Datastore) {}, want: 7, present: true},
		{
			name:    "metrics survive an upsert at the same address",
			after:   func(ds *Datastore) { ds.Upsert(&Endpoint{Name: "a", Address: "10.0.0.1:8000", Model: "other"}) },
			want:    7,
			present: true,
		},
		{
			name:    "metrics are forgotten when the address changes",
			after:   func(ds *Datastore) { ds.Upsert(ep("a", "10.0.0.5:8000")) },
			want:    0,
			present: true,
		},
		{
			name:  "metrics of a removed endpoint are gone and later ones dropped",
			after: func(ds *Datastore) { ds.Remove("a"); ds.SetMetrics("a", Metrics{WaitingQueueSize: 9}) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ds := NewDatastore(nil)
			ds.Upsert(ep("a", "10.0.0.1:8000"))
			ds.SetMetrics("a", Metrics{WaitingQueueSize: 7, UpdateTime: now})
			tt.after(ds)
			m, ok := ds.Metrics("a")
			if ok != tt.present || m.WaitingQueueSize != tt.want {
				t.Fatalf("Metrics(a) = %d, %v; want %d, %v", m.WaitingQueueSize, ok, tt.want, tt.present)
			}
		})
	}
}

// mapStreams is a StreamStates backed by a map, standing in for the index.
type mapStreams map[string]StreamState

func (m mapStreams) State(addr string) (StreamState, time.Time) { return m[addr], time.Time{} }

func TestDatastoreCandidates(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	ds.Upsert(&Endpoint{Name: "b", Address: "10.0.0.2:8000", Model: "other"})
	ds.Upsert(ep("c", "10.0.0.3:8000"))
	ds.SetMetrics("c", Metrics{RunningRequests: 3})

	all := ds.Candidates(nil)
	if len(all) != 3 || all[0].Stream != StreamNone {
		t.Fatalf("without stream states: %d candidates, first in state %v; want 3, none", len(all), all[0].Stream)
	}

	ds.SetStreamStates(mapStreams{"10.0.0.3:8000": StreamExact, "10.0.0.1:8000": StreamUncertain})
	cands := ds.Candidates(func(e *Endpoint) bool { return e.Model == "m" })
	if got := len(cands); got != 2 {
		t.Fatalf("filtered candidates = %d, want 2", got)
	}
	a, c := cands[0], cands[1]
	if a.Name != "a" || a.Stream != StreamUncertain || c.Name != "c" || c.Stream != StreamExact {
		t.Fatalf("candidates = %s/%v %s/%v", a.Name, a.Stream, c.Name, c.Stream)
	}
	if c.Metrics.RunningRequests != 3 {
		t.Fatalf("c's metrics snapshot = %+v", c.Metrics)
	}
	// The snapshot is the request's: later scrapes do not change it.
	ds.SetMetrics("c", Metrics{RunningRequests: 50})
	if c.Metrics.RunningRequests != 3 {
		t.Fatal("a candidate's metrics changed after it was taken")
	}
}

func TestCandidatesMadeInReusedMemoryCarryNothingOfTheEarlierRequest(t *testing.T) {
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	ds.Upsert(ep("b", "10.0.0.2:8000"))
	ds.SetMetrics("b", Metrics{RunningRequests: 2, ActiveLoRAs: []string{"x"}})
	var set CandidateSet
	first := ds.CandidatesInto(&set, nil)
	if len(first) != 2 {
		t.Fatalf("%d candidates, want 2", len(first))
	}
	for _, c := range first {
		c.Put("k", c.Name)
	}
	// A third endpoint: the set grows. Then the same memory again, with a
	// filter that drops one.
	ds.Upsert(ep("c", "10.0.0.3:8000"))
	second := ds.CandidatesInto(&set, nil)
	third := ds.CandidatesInto(&set, func(e *Endpoint) bool { return e.Name != "a" })
	if len(second) != 3 || len(third) != 2 {
		t.Fatalf("%d and %d candidates, want 3 and 2", len(second), len(third))
	}
	if third[0] != second[0] {
		t.Error("the third request's candidates are not in the memory the second's were")
	}
	for _, c := range third {
		if v, ok := c.Get("k"); ok {
			t.Errorf("%s still carries an earlier request's %v", c.Name, v)
		}
	}
	if b := third[0]; b.Name != "b" || b.Metrics.RunningRequests != 2 || b.Stream != StreamNone {
		t.Errorf("reused memory made %s with %+v, %v", b.Name, b.Metrics, b.Stream)
	}
	if c := third[1]; c.Name != "c" || c.Metrics.RunningRequests != 0 {
		t.Errorf("reused memory made %s with %+v", c.Name, c.Metrics)
	}
	if allocs := testing.AllocsPerRun(20, func() { ds.CandidatesInto(&set, nil) }); allocs != 0 {
		t.Errorf("making candidates in memory large enough allocated %v times", allocs)
	}
}

func TestRequestMemoryIsTheCandidateSetsAndComesBackZeroedToItsOwner(t *testing.T) {
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	ds.Upsert(ep("b", "10.0.0.2:8000"))
	var set CandidateSet
	ownerA, ownerB := new(int), new(int)
	cands := ds.CandidatesInto(&set, nil)
	a := RequestMemory[int](cands, ownerA, 2)
	b := RequestMemory[int](cands, ownerB, 2)
	s := RequestMemory[string](cands, ownerA, 1)
	a[0], a[1], b[0], s[0] = 1, 2, 3, "x"
	if &a[0] == &b[0] {
		t.Fatal("two owners were given the same memory")
	}

	// The set's next request: each owner is given its memory again, zeroed.
	next := ds.CandidatesInto(&set, nil)
	a2 := RequestMemory[int](next, ownerA, 2)
	if &a2[0] != &a[0] || a2[0] != 0 || a2[1] != 0 {
		t.Errorf("owner A's memory again: %v at %p, want zeroes at %p", a2, &a2[0], &a[0])
	}
	if s2 := RequestMemory[string](next, ownerA, 1); s2[0] != "" {
		t.Errorf("owner A's strings again: %q, want empty", s2[0])
	}
	if big := RequestMemory[int](next, ownerB, 3); len(big) != 3 || big[0] != 0 {
		t.Errorf("owner B's memory grown: %v", big)
	}
	if allocs := testing.AllocsPerRun(20, func() { RequestMemory[int](next, ownerA, 2) }); allocs != 0 {
		t.Errorf("memory given again allocated %v times", allocs)
	}

	// A staging view's memory is its candidate's; candidates made outside
	// a set get memory of their own each time.
	var view Candidate
	next[0].StageInto(&view)
	if v := RequestMemory[int]([]*Candidate{&view}, ownerA, 2); &v[0] != &a[0] {
		t.Error("a staging view was not given its candidate's memory")
	}
	free := ds.Candidates(nil)
	if f1, f2 := RequestMemory[int](free, ownerA, 1), RequestMemory[int](free, ownerA, 1); &f1[0] == &f2[0] {
		t.Error("candidates outside a set were given shared memory")
	}
}

func TestRequestMemoryOverwrittenIsTheSameMemoryLeftAsItWas(t *testing.T) {
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	var set CandidateSet
	owner := new(int)
	a := RequestMemoryOverwritten[int](ds.CandidatesInto(&set, nil), owner, 2)
	a[0], a[1] = 1, 2
	next := ds.CandidatesInto(&set, nil)
	a2 := RequestMemoryOverwritten[int](next, owner, 2)
	if &a2[0] != &a[0] || a2[0] != 1 || a2[1] != 2 {
		t.Errorf("the owner's memory again: %v at %p, want [1 2] at %p (not cleared)", a2, &a2[0], &a[0])
	}
	// The zeroing form, asked by the same owner for the same type, is given
	// the same memory, cleared.
	if z := RequestMemory[int](next, owner, 2); &z[0] != &a[0] || z[0] != 0 || z[1] != 0 {
		t.Errorf("RequestMemory after RequestMemoryOverwritten: %v at %p, want zeroes at %p", z, &z[0], &a[0])
	}
}

func TestDatastoreConcurrentReadersAndWriters(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	// Hooks run in the order of the changes, so replaying them must give
	// the final membership.
	members := map[string]bool{}
	ds.OnChange(func(added, removed []*Endpoint) {
		for _, e := range removed {
			delete(members, e.Name)
		}
		for _, e := range added {
			members[e.Name] = true
		}
	})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprintf("w%d-%d", w, i%10)
				ds.Upsert(ep(name, fmt.Sprintf("10.%d.%d.%d:8000", w, i%7, i%10)))
				ds.SetMetrics(name, Metrics{WaitingQueueSize: i})
				if i%3 == 0 {
					ds.Remove(name)
				}
			}
		})
		wg.Go(func() {
			for range 200 {
				for _, c := range ds.Candidates(nil) {
					_ = c.Metrics.WaitingQueueSize
				}
				_ = ds.List()
			}
		})
	}
	wg.Wait()
	got := slices.Sorted(maps.Keys(members))
	if want := names(ds.List()); !slices.Equal(got, want) {
		t.Fatalf("replayed membership %v, datastore %v", got, want)
	}
}

func BenchmarkDatastoreCandidates(b *testing.B) {
	ds := NewDatastore(nil)
	ds.SetStreamStates(mapStreams{})
	for i := range 64 {
		name := fmt.Sprintf("e%02d", i)
		ds.Upsert(ep(name, fmt.Sprintf("10.0.0.%d:8000", i)))
		ds.SetMetrics(name, Metrics{WaitingQueueSize: i, ActiveLoRAs: []string{"a"}})
	}
	cpu := testkit.CPUTime()
	for b.Loop() {
		if len(ds.Candidates(nil)) != 64 {
			b.Fatal("lost endpoints")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/request")
	b.ReportMetric(float64((testkit.CPUTime()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/request")
}

func TestDatastoreAllYieldsWhatListReturnsAndStopsWhenTold(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	for _, n := range []string{"c", "a", "b"} {
		ds.Upsert(ep(n, "10.0.0."+n+":8000"))
	}
	var all []*Endpoint
	for e := range ds.All() {
		all = append(all, e)
	}
	if !slices.Equal(all, ds.List()) {
		t.Errorf("All yielded %v, List returns %v", all, ds.List())
	}
	var first []string
	for e := range ds.All() {
		first = append(first, e.Name)
		if len(first) == 2 {
			break
		}
	}
	if !slices.Equal(first, []string{"a", "b"}) {
		t.Errorf("stopping after two yielded %v, want [a b]", first)
	}
}

func TestDatastoreEndpointsAreListsEndpointsAndOutliveAChangeUnchanged(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	if got := ds.Endpoints(); len(got) != 0 {
		t.Fatalf("an empty datastore has endpoints %v", names(got))
	}
	for _, n := range []string{"c", "a", "b"} {
		ds.Upsert(ep(n, "10.0.0."+n+":8000"))
	}
	before := ds.Endpoints()
	if !slices.Equal(before, ds.List()) {
		t.Errorf("Endpoints returned %v, List returns %v", names(before), names(ds.List()))
	}
	ds.Remove("a")
	ds.Upsert(ep("d", "10.0.0.d:8000"))
	if got := names(before); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("a slice had before the change reads %v now, want [a b c]", got)
	}
	if got := names(ds.Endpoints()); !slices.Equal(got, []string{"b", "c", "d"}) {
		t.Errorf("after the change Endpoints returned %v, want [b c d]", got)
	}
}

func TestReadyPodsCountsPodsNotEndpoints(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	if n := ds.ReadyPods(); n != 0 {
		t.Fatalf("an empty datastore has %d ready pods", n)
	}
	for _, ep := range []*Endpoint{
		{Name: "a-8000", Address: "10.0.0.1:8000", Pod: "a", Namespace: "ns"},
		{Name: "a-8001", Address: "10.0.0.1:8001", Pod: "a", Namespace: "ns"},
		{Name: "a-other", Address: "10.0.0.9:8000", Pod: "a", Namespace: "other"},
		{Name: "static-1", Address: "10.0.0.2:8000"},
		{Name: "static-2", Address: "10.0.0.3:8000"},
	} {
		ds.Upsert(ep)
	}
	// a's two ports are one pod; a pod of the same name in another
	// namespace is another; endpoints without a pod count alone.
	if n := ds.ReadyPods(); n != 4 {
		t.Errorf("ready pods = %d, want 4", n)
	}
	ds.Remove("a-8000")
	if n := ds.ReadyPods(); n != 4 {
		t.Errorf("after one of a's ports left: %d, want 4", n)
	}
	ds.Remove("a-8001")
	if n := ds.ReadyPods(); n != 3 {
		t.Errorf("after a left: %d, want 3", n)
	}
}
