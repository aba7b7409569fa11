package events

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvroute/kvroute/pkg/testkit"
)

func TestEnsureStream(t *testing.T) {
	t.Parallel()
	env := testkit.StartNATS(t, testkit.NATSOptions{JetStream: true, InProcess: true})
	js, err := jetstream.New(env.Connect(t, "admin"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testkit.WaitLimit)
	defer cancel()
	tests := []struct {
		name        string
		cfg         StreamConfig
		wantName    string
		wantAge     time.Duration
		wantBytes   int64
		wantStorage jetstream.StorageType
		wantErr     error
	}{
		{
			name:     "zero limits get bounded defaults",
			cfg:      StreamConfig{Namespace: "prod", Pool: "llama"},
			wantName: "KV_EVENTS_prod_llama", wantAge: DefaultStreamMaxAge, wantBytes: DefaultStreamMaxBytes,
		},
		{
			name:     "an existing stream is kept as it is",
			cfg:      StreamConfig{Namespace: "prod", Pool: "llama", MaxAge: time.Minute, MaxBytes: 1 << 20},
			wantName: "KV_EVENTS_prod_llama", wantAge: DefaultStreamMaxAge, wantBytes: DefaultStreamMaxBytes,
		},
		{
			name:     "a named memory stream",
			cfg:      StreamConfig{Name: "custom", Namespace: "a.b", Pool: "p", Storage: jetstream.MemoryStorage},
			wantName: "custom", wantAge: DefaultStreamMaxAge, wantBytes: DefaultStreamMaxBytes, wantStorage: jetstream.MemoryStorage,
		},
		{name: "a missing pool is refused", cfg: StreamConfig{Namespace: "n"}, wantErr: ErrStreamConfig},
	}
	for _, tt := range tests {
		// Sequential: the second case updates the first case's stream.
		t.Run(tt.name, func(t *testing.T) {
			s, err := EnsureStream(ctx, js, tt.cfg)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("EnsureStream = %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			c := info.Config
			if c.Name != tt.wantName || c.MaxAge != tt.wantAge || c.MaxBytes != tt.wantBytes || c.Storage != tt.wantStorage {
				t.Errorf("stream %s age %v bytes %d storage %v, want %s %v %d %v",
					c.Name, c.MaxAge, c.MaxBytes, c.Storage, tt.wantName, tt.wantAge, tt.wantBytes, tt.wantStorage)
			}
			if want := PoolSubject(tt.cfg.Namespace, tt.cfg.Pool); len(c.Subjects) != 1 || c.Subjects[0] != want {
				t.Errorf("subjects %v, want [%s]", c.Subjects, want)
			}
			if c.Discard != jetstream.DiscardOld {
				t.Errorf("discard policy %v, want old messages discarded first", c.Discard)
			}
			if c.MaxMsgsPerSubject != DefaultStreamMaxMsgsPerPod || c.MaxMsgSize != DefaultStreamMaxMsgSize {
				t.Errorf("per pod: %d batches of at most %d bytes, want %d of %d",
					c.MaxMsgsPerSubject, c.MaxMsgSize, DefaultStreamMaxMsgsPerPod, DefaultStreamMaxMsgSize)
			}
			if !c.DenyDelete || !c.DenyPurge {
				t.Errorf("deny delete %t, deny purge %t: anyone with the API could empty it", c.DenyDelete, c.DenyPurge)
			}
		})
	}
}
