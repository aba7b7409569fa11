package relay

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// throttled wraps a log handler so that each message (the constant text a
// log call site writes) passes at most a few times a second: what the
// relay logs is mostly caused by what it is sent, over ZeroMQ and NATS, and
// no sender may flood its log. The messages are the code's own literals,
// so the limiter map stays small.
func throttled(h slog.Handler) slog.Handler {
	if _, ok := h.(*throttleHandler); ok {
		return h
	}
	return &throttleHandler{next: h, lim: &throttleLimits{m: map[string]*rate.Limiter{}}}
}

type throttleHandler struct {
	next slog.Handler
	lim  *throttleLimits
}

type throttleLimits struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// throttleEvery and throttleBurst: one line a second per message, after a
// burst of five.
const (
	throttleEvery = time.Second
	throttleBurst = 5
)

func (h *throttleHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.next.Enabled(ctx, l)
}

func (h *throttleHandler) Handle(ctx context.Context, r slog.Record) error {
	h.lim.mu.Lock()
	l := h.lim.m[r.Message]
	if l == nil {
		l = rate.NewLimiter(rate.Every(throttleEvery), throttleBurst)
		h.lim.m[r.Message] = l
	}
	h.lim.mu.Unlock()
	if !l.Allow() {
		return nil
	}
	return h.next.Handle(ctx, r)
}

func (h *throttleHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &throttleHandler{next: h.next.WithAttrs(as), lim: h.lim}
}

func (h *throttleHandler) WithGroup(name string) slog.Handler {
	return &throttleHandler{next: h.next.WithGroup(name), lim: h.lim}
}
