package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Retention defaults for EnsureStream. KV events are only worth replaying
// while the caches they describe may still hold the blocks, which is
// minutes, so the stream is kept short and bounded by both age and size.
const (
	DefaultStreamMaxAge   = 10 * time.Minute
	DefaultStreamMaxBytes = 1 << 30
)

// StreamConfig describes the JetStream stream holding one pool's events.
type StreamConfig struct {
	// Name is the stream's name (default StreamName(Namespace, Pool)).
	Name string
	// Namespace and Pool give the subjects the stream covers.
	Namespace, Pool string
	// MaxAge and MaxBytes bound retention; zero means the defaults above.
	// The oldest messages are discarded first.
	MaxAge   time.Duration
	MaxBytes int64
	// Storage is file (the zero value) or memory.
	Storage jetstream.StorageType
	// Replicas is the stream's replica count (default 1).
	Replicas int
}

// ErrStreamConfig: a StreamConfig that names no pool.
var ErrStreamConfig = errors.New("invalid stream configuration")

// StreamName returns the default stream name for a pool. Stream names may
// not hold '.', so the sanitised tokens are joined with '_'.
func StreamName(namespace, pool string) string {
	return "KV_EVENTS_" + sanitizeToken(namespace) + "_" + sanitizeToken(pool)
}

// EnsureStream creates the pool's stream, or updates it to cfg if it
// exists, with bounded retention. Publishing needs nothing more: the
// stream captures the contract's subjects as they are published.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if cfg.Namespace == "" || cfg.Pool == "" {
		return nil, fmt.Errorf("ensure stream: %w: namespace and pool are required", ErrStreamConfig)
	}
	if cfg.Name == "" {
		cfg.Name = StreamName(cfg.Namespace, cfg.Pool)
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = DefaultStreamMaxAge
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultStreamMaxBytes
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:      cfg.Name,
		Subjects:  []string{PoolSubject(cfg.Namespace, cfg.Pool)},
		Retention: jetstream.LimitsPolicy,
		Discard:   jetstream.DiscardOld,
		MaxAge:    cfg.MaxAge,
		MaxBytes:  cfg.MaxBytes,
		Storage:   cfg.Storage,
		Replicas:  cfg.Replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
