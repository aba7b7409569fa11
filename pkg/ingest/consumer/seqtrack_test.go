package consumer

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	at := func(inst string, last uint64) *seqState { return &seqState{instance: inst, last: last} }
	tests := []struct {
		name string
		st   *seqState
		inst string
		seq  uint64
		want verdict
	}{
		{"a stream never seen is first", nil, "a", 5, verdictFirst},
		{"the next seq is next", at("a", 4), "a", 5, verdictNext},
		{"a seq past the next is a gap", at("a", 4), "a", 9, verdictGap},
		{"the same seq again is a duplicate", at("a", 4), "a", 4, verdictDuplicate},
		{"an older seq within the window is a duplicate", at("a", 500), "a", 3, verdictDuplicate},
		{"seq back to 0 in the same instance is a restart", at("a", 4), "a", 0, verdictRestart},
		{"seq 0 repeated right after seq 0 is a duplicate", at("a", 0), "a", 0, verdictDuplicate},
		{"seq falling back beyond the window is a restart", at("a", 5000), "a", 7, verdictRestart},
		{"seq falling back exactly the window is a duplicate", at("a", 1025), "a", 1, verdictDuplicate},
		{"a new instance is a restart even if seq continues", at("a", 4), "b", 5, verdictRestart},
		{"a new instance is a restart even if seq is old", at("a", 4), "b", 2, verdictRestart},
		{"an instance appearing where there was none is a restart", at("", 4), "b", 5, verdictRestart},
		{"a stream without instances follows seq alone", at("", 4), "", 5, verdictNext},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o := events.Origin{Instance: tt.inst, Seq: tt.seq}
			if got := classify(tt.st, o); got != tt.want {
				t.Errorf("classify = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestCommitThenClassifyFollowsTheStream(t *testing.T) {
	t.Parallel()
	var st seqState
	st.commit(events.Origin{Instance: "a", Seq: 10}, time.Now())
	if v := classify(&st, events.Origin{Instance: "a", Seq: 11}); v != verdictNext {
		t.Fatalf("after commit of 10, 11 is %d, want next", v)
	}
	if n := missed(&st, events.Origin{Instance: "a", Seq: 14}); n != 3 {
		t.Fatalf("10 to 14 missed %d batches, want 3", n)
	}
}
