package testkit

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// fatalRecorder is a testing.TB whose Fatalf records its message and
// returns, so that a test can read what a failing wait would have said.
type fatalRecorder struct {
	testing.TB
	fatals []string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.fatals = append(r.fatals, fmt.Sprintf(format, args...))
}

func TestWaitForFailsWithTheLastStateItSaw(t *testing.T) {
	t.Parallel()
	rec := &fatalRecorder{}
	polls := 0
	waitFor(rec, "every batch applied", 30*time.Millisecond, func() error {
		polls++
		return fmt.Errorf("applied %d of 6 batches", polls)
	})
	if len(rec.fatals) != 1 {
		t.Fatalf("Fatalf called %d times, want once: %q", len(rec.fatals), rec.fatals)
	}
	msg := rec.fatals[0]
	for _, want := range []string{"every batch applied", fmt.Sprintf("applied %d of 6 batches", polls)} {
		if !strings.Contains(msg, want) {
			t.Errorf("failure %q does not say %q", msg, want)
		}
	}
	if polls < 2 {
		t.Errorf("cond polled %d times before the failure: the last state must be the last poll's, not the first's", polls)
	}
	if strings.Contains(msg, fmt.Sprintf("applied %d of", polls-1)) {
		t.Errorf("failure %q reports an earlier poll than the last (%d)", msg, polls)
	}
}

func TestWaitForReturnsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	rec := &fatalRecorder{}
	polls := 0
	WaitFor(rec, "the third poll", func() error {
		polls++
		if polls < 3 {
			return fmt.Errorf("poll %d", polls)
		}
		return nil
	})
	if len(rec.fatals) != 0 || polls != 3 {
		t.Errorf("after %d polls, failures %q; want 3 polls and none", polls, rec.fatals)
	}
}
