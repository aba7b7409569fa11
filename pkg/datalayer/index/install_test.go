package index

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

func TestInstallSnapshot(t *testing.T) {
	t.Parallel()
	abc := ixReq{tokens: blockToks(1, 2, 3)}
	xy := ixReq{tokens: blockToks(7, 8)}
	snapshot := []*events.Batch{
		{Events: []events.Event{evStore([]uint64{11, 12}, blockToks(1, 2))}},
		{Events: []events.Event{evStoreChild(12, []uint64{13}, blockToks(3)), evPlaceholder(events.TierCPU, 11)}},
	}
	at := func(seq uint64) events.Origin {
		return events.Origin{Stream: events.Stream{Endpoint: ixTestAddr}, Model: ixTestModel, Instance: "i1", BlockSize: ixTestBS, Seq: seq}
	}
	tests := []struct {
		name string
		// before feeds the stream before the install.
		before  func(f *ixFeeder)
		chunks  []*events.Batch
		wantErr error
		want    map[*ixReq]Match
	}{
		{
			name:   "a snapshot replaces whatever the stream held",
			before: func(f *ixFeeder) { f.apply(evStore([]uint64{70, 80}, blockToks(7, 8))) },
			chunks: snapshot,
			want:   map[*ixReq]Match{&abc: gpuMatch(3), &xy: {}},
		},
		{
			name:   "a snapshot installs over an empty stream",
			before: func(*ixFeeder) {},
			chunks: snapshot,
			want:   map[*ixReq]Match{&abc: gpuMatch(3)},
		},
		{
			name:    "a run whose parent the snapshot never stored is reported incomplete",
			before:  func(*ixFeeder) {},
			chunks:  []*events.Batch{{Events: []events.Event{evStoreChild(99, []uint64{13}, blockToks(3))}}},
			wantErr: ErrIncompleteInstall,
			want:    map[*ixReq]Match{&abc: {}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ix := New(Options{}, nil)
			ix.AddEndpoint(ixTestAddr)
			tt.before(newIxFeeder(ix, ixTestAddr, 0))
			err := ix.InstallSnapshot(at(5), tt.chunks)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err = %v, want %v", err, tt.wantErr)
			}
			if s, _ := ix.State(ixTestAddr); s != datalayer.StreamRecovering {
				t.Errorf("state after install = %s, want recovering until marked exact", s)
			}
			for r, want := range tt.want {
				if got := ixLookupOne(ix, *r, ixTestAddr); got != want {
					t.Errorf("lookup %v = %+v, want %+v", r.tokens[:1], got, want)
				}
			}
			checkGaugesMatchContents(t, ix)
		})
	}
}

func TestInstalledSnapshotPositionsTheStream(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	ix.AddEndpoint(ixTestAddr)
	s := events.Stream{Endpoint: ixTestAddr}
	o := events.Origin{Stream: s, Model: ixTestModel, Instance: "i2", BlockSize: ixTestBS, Seq: 9}
	if err := ix.InstallSnapshot(o, []*events.Batch{{Events: []events.Event{evStore([]uint64{1}, blockToks(1))}}}); err != nil {
		t.Fatal(err)
	}
	if inst, seq, ok := ix.StreamPosition(s); !ok || inst != "i2" || seq != 9 {
		t.Fatalf("position = %q %d %v, want i2 9", inst, seq, ok)
	}
	// A live batch the snapshot includes is a duplicate; the next applies.
	late := o
	late.Seq = 9
	ix.Apply(late, &events.Batch{Events: []events.Event{evRemove(events.TierGPU, 1)}})
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != gpuMatch(1) {
		t.Fatalf("a batch the snapshot includes was applied again: %+v", got)
	}
	late.Seq = 10
	ix.Apply(late, &events.Batch{Events: []events.Event{evRemove(events.TierGPU, 1)}})
	if got := ixLookupOne(ix, ixReq{tokens: blockToks(1)}, ixTestAddr); got != (Match{}) {
		t.Fatalf("the batch after the snapshot was not applied: %+v", got)
	}
	ix.MarkStreamExact(s)
	if st, _ := ix.State(ixTestAddr); st != datalayer.StreamExact {
		t.Errorf("state = %s, want exact", st)
	}
}

func TestInstallSnapshotOfANonMemberFails(t *testing.T) {
	t.Parallel()
	ix := New(Options{}, nil)
	err := ix.InstallSnapshot(events.Origin{Stream: events.Stream{Endpoint: ixTestAddr}}, nil)
	if !errors.Is(err, ErrNotMember) {
		t.Fatalf("err = %v, want ErrNotMember", err)
	}
}
