package epp_test

import (
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// TestUpstreamConfigurationSaysWhatIsSuperseded starts the EPP on an llm-d
// configuration and finds, at start-up, one info line for each part that
// kvroute does its own way.
func TestUpstreamConfigurationSaysWhatIsSuperseded(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("../scheduling/config/testdata/upstream/llmd-v0.8.0-epp-precise-prefix-cache-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs testkit.LogBuffer
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

// An upstream configuration with the flowControl gate on starts an EPP
// with flow control, saying what of it kvroute does its own way.
func TestUpstreamFlowControlConfigurationStarts(t *testing.T) {
	t.Parallel()
	text, err := os.ReadFile("../scheduling/config/testdata/upstream/router-v0.10.0-soft-reflective-ceiling-epp-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var logs testkit.LogBuffer
	e, err := epp.New(epp.Options{
		Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ConfigText: string(text),
		Logger:     slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	fc := e.FlowControl()
	if fc == nil {
		t.Fatal("the flowControl gate left flow control off")
	}
	if b := fc.Config().DefaultBand; b.Ordering != flowcontrol.FCFS || b.Fairness != flowcontrol.GlobalStrict {
		t.Errorf("default band %+v, want upstream's FCFS and global-strict", b)
	}
	plain, err := epp.New(epp.Options{Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if plain.FlowControl() != nil {
		t.Error("flow control on without its gate or flag")
	}
	want := `scheduler configuration: flowControl.usageLimitPolicyPluginRef soft-reflective-ceiling-policy: kvroute releases a waiting request when some endpoint is predicted to serve it in time`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("start-up log lacks %s\nlog:\n%s", want, logs.String())
	}
}

// A band's TTFT target in the flowControl section is the one the EPP's
// controller holds requests without an SLO to; bands without one take the
// default band's.
func TestFlowControlBandTargetsLoadFromTheConfiguration(t *testing.T) {
	t.Parallel()
	e, err := epp.New(epp.Options{
		Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		ConfigText: `apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
featureGates: [flowControl]
plugins:
- type: queue-scorer
schedulingProfiles:
- name: default
  plugins: [{pluginRef: queue-scorer}]
flowControl:
  defaultPriorityBand: {ttftTarget: 2s}
  priorityBands:
  - {priority: 10, ttftTarget: 300ms}
  - {priority: -1}
`,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	fc := e.FlowControl()
	if fc == nil {
		t.Fatal("the flowControl gate left flow control off")
	}
	for _, c := range []struct {
		priority int
		want     time.Duration
	}{{10, 300 * time.Millisecond}, {-1, 0}, {0, 2 * time.Second}, {5, 2 * time.Second}} {
		if got := fc.Target(c.priority); got != c.want {
			t.Errorf("priority %d: target %v, want %v", c.priority, got, c.want)
		}
	}
}
