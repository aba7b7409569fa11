package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/transport/natsauth"
)

// NATSOptions say how the relay reaches NATS. Zero values mean: the default
// URL, no authentication, no TLS beyond what the URL asks for, and the
// default backoff.
type NATSOptions struct {
	// URL is one or more comma-separated server URLs (default nats.DefaultURL).
	URL string
	// Name is the client name servers show in their connection lists.
	Name string
	// Auth is how the relay authenticates and verifies the server, as the
	// EPP does.
	Auth natsauth.Config
	// ReconnectWait is the first reconnect delay (default 250ms); it doubles
	// after each failed attempt up to MaxReconnectWait (default 5s).
	ReconnectWait, MaxReconnectWait time.Duration
	// Logger receives connection events (lost, back, async errors) instead
	// of the client's default prints to stderr; nil discards them.
	Logger *slog.Logger
}

// ErrNATSOptions is returned for options that cannot describe a connection.
var ErrNATSOptions = errors.New("invalid NATS options")

// DialNATS connects to NATS the way a sidecar must: it starts even when
// NATS is not up yet and reconnects forever with backoff. The client's own
// reconnect buffer is turned off, because the relay buffers in order and
// with bounds of its own (see Config.BufferBatches).
func DialNATS(o NATSOptions) (*nats.Conn, error) {
	opts, err := o.options()
	if err != nil {
		return nil, err
	}
	url := o.URL
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

func (o NATSOptions) options() ([]nats.Option, error) {
	base, most := o.ReconnectWait, o.MaxReconnectWait
	if base <= 0 {
		base = 250 * time.Millisecond
	}
	if most <= 0 {
		most = 5 * time.Second
	}
	most = max(most, base)
	opts := []nats.Option{
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.ReconnectBufSize(-1),
		nats.CustomReconnectDelay(func(attempts int) time.Duration { return backoff(attempts, base, most) }),
	}
	logger := o.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	logger = slog.New(throttled(logger.Handler()))
	opts = append(opts,
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			logger.Warn("NATS connection lost; buffering", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.Info("NATS connection back", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			logger.Warn("NATS error", "subject", subject, "err", err)
		}),
	)
	if o.Name != "" {
		opts = append(opts, nats.Name(o.Name))
	}
	auth, err := o.Auth.Options()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNATSOptions, err)
	}
	return append(opts, auth...), nil
}

// backoff doubles the delay per attempt up to most, with up to 20% jitter
// so that a pool's relays do not all knock at once when NATS comes back.
func backoff(attempts int, base, most time.Duration) time.Duration {
	d := base
	for i := 1; i < attempts && d < most; i++ {
		d *= 2
	}
	d = min(d, most)
	return d + time.Duration(rand.Int64N(int64(d)/5+1))
}
