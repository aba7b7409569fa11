package predictedlatency

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/enginesched"
)

func TestThePrefillsAheadDrainByTheTimeSinceTheReplay(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(100, 0).UnixNano()
	ms := int64(time.Millisecond)
	replayed := enginesched.Ahead{Steps: 2, PrefillTokens: 1000, PrefillContext: 4e6}
	f := datalayer.InFlight{ReplayedAt: t0, PrefillDoneBy: t0 + 100*ms}
	for _, tt := range []struct {
		name    string
		f       datalayer.InFlight
		arrival int64
		want    int
	}{
		{"arriving as replayed: all of it ahead", f, t0, 1000},
		{"a quarter of the queue's time gone: three quarters ahead", f, t0 + 25*ms, 750},
		{"past the queue's expected end: none ahead", f, t0 + 1000*ms, 0},
		{"no expected end known: the replay's count", datalayer.InFlight{ReplayedAt: t0}, t0 + 50*ms, 1000},
		{"an end expected before the replay: the replay's count", datalayer.InFlight{ReplayedAt: t0, PrefillDoneBy: t0 - ms}, t0 + 50*ms, 1000},
	} {
		a := replayed
		drainAhead(&a, &tt.f, tt.arrival)
		if a.PrefillTokens != tt.want || a.PrefillContext != int64(tt.want)*4000 || a.Steps != 2 {
			t.Errorf("%s: %+v, want %d prefill tokens ahead", tt.name, a, tt.want)
		}
	}
}
