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
//
// Each pod publishes on a subject of its own, and the stream bounds every
// subject by itself: a pod that floods discards its own oldest batches,
// not another pod's. JetStream has no byte limit per subject, so a pod's
// bytes are bounded by DefaultStreamMaxMsgsPerPod × DefaultStreamMaxMsgSize
// (64 MiB); the stream-wide DefaultStreamMaxBytes is a backstop that holds
// 16 such pods before it, too, discards the oldest of anyone's.
const (
	DefaultStreamMaxAge        = 10 * time.Minute
	DefaultStreamMaxBytes      = 1 << 30
	DefaultStreamMaxMsgsPerPod = 256
	DefaultStreamMaxMsgSize    = 256 << 10
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
	// MaxMsgsPerPod bounds the batches kept of each pod's subject, and
	// MaxMsgSize every batch the stream stores (a larger one is not
	// stored: the EPP sees a gap and resynchronises that pod). Zero means
	// the defaults above.
	MaxMsgsPerPod int64
	MaxMsgSize    int32
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

// EnsureStream creates the pool's stream with bounded retention, or, if it
// exists, returns it as it is: a client may create the stream but not
// change it, so that no client (the EPP's credential included) can shrink
// or purge every pod's history. Changing an existing stream's limits is
// an operator's job (nats stream edit). Publishing needs nothing more: the
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
	if cfg.MaxMsgsPerPod <= 0 {
		cfg.MaxMsgsPerPod = DefaultStreamMaxMsgsPerPod
	}
	if cfg.MaxMsgSize <= 0 {
		cfg.MaxMsgSize = DefaultStreamMaxMsgSize
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:              cfg.Name,
		Subjects:          []string{PoolSubject(cfg.Namespace, cfg.Pool)},
		Retention:         jetstream.LimitsPolicy,
		Discard:           jetstream.DiscardOld,
		MaxAge:            cfg.MaxAge,
		MaxBytes:          cfg.MaxBytes,
		MaxMsgsPerSubject: cfg.MaxMsgsPerPod,
		MaxMsgSize:        cfg.MaxMsgSize,
		Storage:           cfg.Storage,
		Replicas:          cfg.Replicas,
		// Limits still age and trim it; nobody deletes or purges by hand.
		DenyDelete: true,
		DenyPurge:  true,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		// There, with other limits: use it as the operator left it.
		s, err = js.Stream(ctx, cfg.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
	}
	return s, nil
}
