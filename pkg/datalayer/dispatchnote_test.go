package datalayer

import (
	"reflect"
	"sync"
	"testing"
	"time"
)

type notes struct {
	mu  sync.Mutex
	got []DispatchNote
	ids []uint64
}

func (n *notes) Note(id uint64, d DispatchNote) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.ids, n.got = append(n.ids, id), append(n.got, d)
}

func TestAnAnnouncedDispatchTellsItsListenerEachStep(t *testing.T) {
	t.Parallel()
	ds := NewDatastore(nil)
	ds.Upsert(ep("a", "10.0.0.1:8000"))
	var l notes
	ds.SetDispatchListener(&l)
	t0 := time.Unix(100, 0)
	d := ds.Dispatch("a", t0, 300, 1000, 11)
	d.ExpectPrefill(40 * time.Millisecond)
	d.ExpectDecode(10 * time.Millisecond)
	d.Announce()
	d.Announce() // once only
	d.FirstToken(t0.Add(50 * time.Millisecond))
	d.DoneAt(t0.Add(time.Second))
	e := ds.Dispatch("a", t0, 1, 2, 0)
	e.Announce()
	e.Fail()
	// Never announced: a peer's dispatch accounted here.
	quiet := ds.Dispatch("a", t0, 1, 2, 0)
	quiet.FirstToken(t0)
	quiet.Done()

	ns := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	want := []DispatchNote{
		{Kind: NoteSent, Endpoint: "a", At: ns(0), Prefill: 300, Prompt: 1000, Outputs: 11,
			PrefillFor: 40 * time.Millisecond, PerToken: 10 * time.Millisecond, End: ns(140 * time.Millisecond)},
		{Kind: NoteFirst, Endpoint: "a", At: ns(50 * time.Millisecond), End: ns(150 * time.Millisecond)},
		{Kind: NoteDone, Endpoint: "a", At: ns(time.Second)},
		{Kind: NoteSent, Endpoint: "a", At: ns(0), Prefill: 1, Prompt: 2},
		{Kind: NoteFailed, Endpoint: "a"},
	}
	if !reflect.DeepEqual(l.got, want) {
		t.Errorf("notes\n%+v\nwant\n%+v", l.got, want)
	}
	if !reflect.DeepEqual(l.ids, []uint64{1, 1, 1, 2, 2}) {
		t.Errorf("ids %v, want each dispatch's own", l.ids)
	}
}
