package epp_test

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/pkg/epp"
)

// syncBuffer is a log sink safe for the EPP's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestUpstreamConfigurationSaysWhatIsSuperseded starts the EPP on an llm-d
// configuration and finds, at start-up, one info line for each part that
// kvroute does its own way.
func TestUpstreamConfigurationSaysWhatIsSuperseded(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("../scheduling/config/testdata/upstream/llmd-v0.8.0-epp-precise-prefix-cache-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	e, err := epp.New(epp.Options{
		Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ConfigText: string(text),
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, want := range []string{
		`level=INFO msg="scheduler configuration: plugin \"tokenizer\" (type tokenizer): kvroute tokenizes in process`,
		`level=INFO msg="scheduler configuration: plugin \"precise-prefix-cache-scorer\" (type precise-prefix-cache-scorer): kvroute's precise-prefix-cache-scorer reads its exact, tier-aware index`,
		`level=INFO msg="scheduler configuration: section dataLayer: kvroute scrapes each endpoint's metrics itself`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("start-up log lacks %s\nlog:\n%s", want, logs.String())
		}
	}
}
