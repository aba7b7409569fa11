package consumer

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// tailRecorder is a sinkRecorder that also hears heartbeats ahead of it.
type tailRecorder struct{ sinkRecorder }

func (r *tailRecorder) Tail(o events.Origin) {
	r.add(call{op: "tail", stream: o.Stream, origin: o})
}

func TestHeartbeatsRevealLostTails(t *testing.T) {
	t.Parallel()
	type step struct {
		inst string
		seq  uint64
		hb   bool // a heartbeat rather than a batch
	}
	tests := []struct {
		name  string
		steps []step
		// want is the plain sink's calls; wantTail the TailSink's.
		want, wantTail []string
		lost           float64
	}{
		{
			name:     "a heartbeat at the last batch says nothing",
			steps:    []step{{"a", 0, false}, {"a", 1, false}, {"a", 1, true}, {"a", 2, false}},
			want:     []string{"apply a/0", "apply a/1", "apply a/2"},
			wantTail: []string{"apply a/0", "apply a/1", "apply a/2"},
		},
		{
			name:     "a heartbeat past the last batch is a lost tail, and the next batch follows on",
			steps:    []step{{"a", 0, false}, {"a", 3, true}, {"a", 4, false}},
			want:     []string{"apply a/0", "uncertain lost_tail", "apply a/4"},
			wantTail: []string{"apply a/0", "tail a/3", "apply a/4"},
			lost:     1,
		},
		{
			name:     "a heartbeat of a new instance is a restart whose batches were all lost",
			steps:    []step{{"a", 0, false}, {"b", 2, true}, {"b", 3, false}},
			want:     []string{"apply a/0", "restart", "uncertain late_join", "apply b/3"},
			wantTail: []string{"apply a/0", "tail b/2", "apply b/3"},
			lost:     1,
		},
		{
			name:     "a heartbeat from a stream never heard from is a late join",
			steps:    []step{{"a", 7, true}, {"a", 8, false}},
			want:     []string{"uncertain late_join", "apply a/8"},
			wantTail: []string{"tail a/7", "apply a/8"},
			lost:     1,
		},
	}
	env := newNATSEnv(t, false, true)
	for i, tt := range tests {
		for _, tail := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s (tail sink %t)", tt.name, tail), func(t *testing.T) {
				t.Parallel()
				pool := fmt.Sprintf("hb-%d-%t", i, tail)
				var rec *sinkRecorder
				var sink events.Sink
				want := tt.want
				if tail {
					tr := &tailRecorder{}
					rec, sink, want = &tr.sinkRecorder, tr, tt.wantTail
				} else {
					rec = &sinkRecorder{}
					sink = rec
				}
				c := newTestConsumer(t, env.connect(t, "consumer"), Options{Namespace: "ns", Pool: pool}, sink)
				runConsumer(t, c)
				pub := events.NewPublisher(env.connect(t, "publisher"), "ns", pool)
				for _, st := range tt.steps {
					o := testOrigin(1, st.seq, st.inst)
					var err error
					if st.hb {
						err = pub.PublishHeartbeat(o)
					} else {
						err = pub.Publish(o, encodeBatch(t, testBatch(1, st.seq, 2, 4)))
					}
					if err != nil {
						t.Fatal(err)
					}
				}
				s := testOrigin(1, 0, "").Stream
				describe := func() []string {
					var out []string
					for _, c := range rec.of(s) {
						switch c.op {
						case "apply", "tail":
							out = append(out, fmt.Sprintf("%s %s/%d", c.op, c.origin.Instance, c.origin.Seq))
						case "uncertain":
							out = append(out, "uncertain "+c.reason.String())
						default:
							out = append(out, c.op)
						}
					}
					return out
				}
				testkit.WaitFor(t, "the last batch", func() error {
					if seen := len(describe()); seen < len(want) {
						return fmt.Errorf("len(describe()) is %v, want >= %v", seen, len(want))
					}
					return nil
				})
				if got := describe(); !slices.Equal(got, want) {
					t.Errorf("sink saw\n  %q\nwant\n  %q", got, want)
				}
				if got := testutil.ToFloat64(c.m.lostTails); got != tt.lost {
					t.Errorf("lost tails = %v, want %v", got, tt.lost)
				}
			})
		}
	}
}
