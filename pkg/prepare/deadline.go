package prepare

import (
	"context"
	"sync"
	"time"
)

// deadlineCtx is the caller's context with the PrepareData deadline, for
// a Run whose producers all run on the caller's goroutine. Such producers
// ask Err between steps and rarely wait on Done, and context.WithTimeout
// cost more per request than either: a timer started and stopped, a
// registration with the caller's context, four allocations. This context
// reads the clock when asked for Err, and makes its Done channel (and what
// closes it) only for a producer that asks for one.
type deadlineCtx struct {
	context.Context
	// deadline is start plus timeout; Err reads the clock as time.Since
	// does, the monotonic clock alone, which costs less than time.Now.
	start, deadline time.Time
	timeout         time.Duration

	mu   sync.Mutex
	err  error
	done chan struct{}
	// stops release what closes done, once it is made.
	stopTimer  *time.Timer
	stopParent func() bool
}

func newDeadlineCtx(parent context.Context, timeout time.Duration) *deadlineCtx {
	start := time.Now()
	return &deadlineCtx{Context: parent, start: start, deadline: start.Add(timeout), timeout: timeout}
}

// Deadline implements context.Context: the earlier of the caller's and
// the PrepareData deadline.
func (c *deadlineCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

// Err implements context.Context.
func (c *deadlineCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.errLocked()
}

// errLocked settles err once the caller's context has ended or the
// deadline has passed; c.mu is held.
func (c *deadlineCtx) errLocked() error {
	if c.err == nil {
		if err := c.Context.Err(); err != nil {
			c.endLocked(err)
		} else if time.Since(c.start) >= c.timeout {
			c.endLocked(context.DeadlineExceeded)
		}
	}
	return c.err
}

// endLocked ends c with err, unless it has ended; c.mu is held.
func (c *deadlineCtx) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
}

func (c *deadlineCtx) end(err error) {
	c.mu.Lock()
	c.endLocked(err)
	c.mu.Unlock()
}

// Done implements context.Context.
func (c *deadlineCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.errLocked() // settled before there is a channel to close
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return c.done
	}
	c.stopTimer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
	parent := c.Context
	c.stopParent = context.AfterFunc(parent, func() { c.end(parent.Err()) })
	return c.done
}

// cause is context.Cause for c: the caller's cause when the caller's
// context has ended, else why c ended (context.Cause cannot tell, as c is
// not one of the context package's own).
func (c *deadlineCtx) cause() error {
	if c.Context.Err() != nil {
		return context.Cause(c.Context)
	}
	return c.Err()
}

// release stops what closes done, if it was made; c is not used after.
func (c *deadlineCtx) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopTimer != nil {
		c.stopTimer.Stop()
		c.stopParent()
	}
	c.endLocked(context.Canceled)
}
