package relay

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit"
)

func TestRelayLogLinesAreRateLimitedPerMessage(t *testing.T) {
	t.Parallel()
	var buf testkit.LogBuffer
	log := slog.New(throttled(slog.NewTextHandler(&buf, nil))).With("pod", "vllm-0")
	const floods = 10_000
	for i := range floods {
		log.Warn("batch does not decode; forwarded all the same", "seq", i)
		log.With("extra", 1).Warn("sequence gap not filled", "from", i)
	}
	log.Info("relay stopped")
	out := buf.String()
	for _, msg := range []string{"batch does not decode", "sequence gap not filled"} {
		if n := strings.Count(out, msg); n < 1 || n > throttleBurst+2 {
			t.Errorf("%q logged %d times for %d calls, want at most about %d", msg, n, floods, throttleBurst)
		}
	}
	if !strings.Contains(out, "relay stopped") {
		t.Error("another message was swallowed by the first ones' limits")
	}
}
