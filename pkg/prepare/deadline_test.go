package prepare

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestDeadlineContextEndsAsWithTimeoutWould(t *testing.T) {
	t.Parallel()
	waitDone := func(t *testing.T, c *deadlineCtx) {
		t.Helper()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Done was not closed")
		}
	}
	t.Run("before the deadline it has not ended, and says when it will", func(t *testing.T) {
		t.Parallel()
		c := newDeadlineCtx(context.Background(), time.Hour)
		defer c.release()
		if err := c.Err(); err != nil {
			t.Fatalf("Err = %v before the deadline", err)
		}
		if d, ok := c.Deadline(); !ok || d != c.deadline {
			t.Errorf("Deadline = %v, %v; want %v", d, ok, c.deadline)
		}
		parent, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		early := newDeadlineCtx(parent, time.Hour)
		if pd, _ := parent.Deadline(); func() bool { d, _ := early.Deadline(); return d != pd }() {
			t.Error("Deadline is not the caller's earlier one")
		}
	})
	t.Run("past the deadline Err and Done say so, with the deadline as the cause", func(t *testing.T) {
		t.Parallel()
		c := newDeadlineCtx(context.Background(), time.Millisecond)
		defer c.release()
		waitDone(t, c)
		if !errors.Is(c.Err(), context.DeadlineExceeded) || !errors.Is(c.cause(), context.DeadlineExceeded) {
			t.Errorf("Err = %v, cause = %v; want the deadline", c.Err(), c.cause())
		}
		// Asked for after the deadline, Done is closed already.
		late := newDeadlineCtx(context.Background(), -time.Second)
		waitDone(t, late)
	})
	t.Run("the caller's cancellation ends it, with the caller's cause", func(t *testing.T) {
		t.Parallel()
		why := errors.New("client went away")
		parent, cancel := context.WithCancelCause(context.Background())
		c := newDeadlineCtx(context.WithValue(parent, ctxKey{}, 1), time.Hour)
		defer c.release()
		done := c.Done()
		cancel(why)
		<-done
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(c.cause(), why) {
			t.Errorf("Err = %v, cause = %v; want canceled, %v", c.Err(), c.cause(), why)
		}
		if c.Value(ctxKey{}) != 1 {
			t.Error("the caller's values are not seen")
		}
	})
	t.Run("released, it is cancelled and what would close Done is stopped", func(t *testing.T) {
		t.Parallel()
		parent, cancel := context.WithCancel(context.Background())
		defer cancel()
		c := newDeadlineCtx(parent, time.Hour)
		done := c.Done()
		c.release()
		<-done
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("Err after release = %v, want canceled", c.Err())
		}
		if c.stopParent() {
			t.Error("the caller's context still had the context registered after release")
		}
	})
}

type ctxKey struct{}
