package epp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// TestDebugPrefixRunsTheProducerThePickUsed configures the prefix producer
// differently through the EPP's options and through each way the
// scheduling configuration can name it, and checks that /debug/prefix
// answers with the block size and the holdings PrepareData gave the pick:
// an operator asking "why was this picked" must be shown what the pick saw.
func TestDebugPrefixRunsTheProducerThePickUsed(t *testing.T) {
	t.Parallel()
	const profile = `
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: %s
`
	tests := []struct {
		name   string
		config string
		// wantBlockSize is what an endpoint with no events or metrics is
		// assumed to use.
		wantBlockSize int
	}{
		{name: "the default configuration takes the options' defaults", wantBlockSize: 8},
		{
			name: "kvroute's producer, configured, overrides the options",
			config: `plugins:
- type: precise-prefix-cache-producer
  parameters: {defaultBlockSizeTokens: 32}
- type: prefix-cache-scorer` + fmt.Sprintf(profile, "prefix-cache-scorer"),
			wantBlockSize: 32,
		},
		{
			name: "upstream's approximate producer, mapped onto kvroute's, keeps the options' block size",
			config: `plugins:
- type: approx-prefix-cache-producer
  parameters: {blockSizeTokens: 64, maxPrefixBlocksToMatch: 100}
- type: prefix-cache-scorer` + fmt.Sprintf(profile, "prefix-cache-scorer"),
			wantBlockSize: 8,
		},
		{
			name:          "a scorer alone gets the default producer, with the options' defaults",
			config:        `plugins:` + "\n- type: precise-prefix-cache-scorer" + fmt.Sprintf(profile, "precise-prefix-cache-scorer"),
			wantBlockSize: 8,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e, err := epp.New(epp.Options{
				Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0",
				ConfigText: tt.config,
				Prefix:     prefixmatch.Params{DefaultBlockSizeTokens: 8},
			})
			if err != nil {
				t.Fatal(err)
			}
			runEPP(t, e)
			nc, err := nats.Connect(e.NATSURL())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			pub := events.NewPublisher(nc, e.Namespace(), e.Pool())
			// pod-0 publishes events with 4-token blocks; pod-1 is silent,
			// so its block size is the producer's default.
			engine := sim.NewEngine(sim.EngineConfig{
				Pod: "pod-0", Address: "127.0.0.1:8000", Model: "m",
				Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64, Seed: 1},
			}, pub)
			for i, addr := range []string{"127.0.0.1:8000", "127.0.0.1:8001"} {
				name := fmt.Sprintf("pod-%d", i)
				e.Datastore().Upsert(&datalayer.Endpoint{Name: name, Address: addr, Pod: name, Model: "m"})
			}
			// Core NATS keeps nothing for a subscriber that is not there yet.
			testkit.WaitFor(t, "the EPP to consume", func() error {
				if !e.Ready() {
					return errors.New("e.Ready() is false")
				}
				return nil
			})
			prompt := make([]uint32, 128)
			for i := range prompt {
				prompt[i] = uint32(1000 + i)
			}
			if _, err := engine.Serve(blockpool.Request{Tokens: prompt[:96]}); err != nil {
				t.Fatal(err)
			}
			testkit.WaitFor(t, "the index to hold pod-0's blocks", func() error {
				ans, err := e.Lookup(context.Background(), prefixquery.Query{Model: "m", TokenIDs: prompt})
				if err != nil {
					return err
				}
				if seen := ans.Endpoints[0].Prefix.MatchBlocks; seen != 24 {
					return fmt.Errorf("ans.Endpoints[0].Prefix.MatchBlocks is %v, want %v", seen, 24)
				}
				return nil
			})

			// Asked before the pick: the default configuration's recorder makes
			// the pick's own blocks speculatively held afterwards.
			q := url.Values{"model": {"m"}, "token_ids": {joinTokens(prompt)}}
			resp, err := http.Get("http://" + e.DebugAddr() + "/debug/prefix?" + q.Encode())
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var ans prefixquery.Answer
			if err := json.NewDecoder(resp.Body).Decode(&ans); err != nil {
				t.Fatal(err)
			}
			body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})
			pick, err := e.Director().HandleRequest(context.Background(), &director.Input{
				Path: "/v1/completions", Headers: map[string]string{}, Body: body,
			})
			if err != nil {
				t.Fatal(err)
			}
			picked := map[string]datalayer.PrefixCacheInfo{}
			for _, c := range pick.Candidates {
				v, _ := c.Get(datalayer.PrefixCacheMatchInfoKey)
				picked[c.Address], _ = v.(datalayer.PrefixCacheInfo)
			}

			if len(ans.Endpoints) != 2 {
				t.Fatalf("/debug/prefix answered for %d endpoints, want 2", len(ans.Endpoints))
			}
			for _, a := range ans.Endpoints {
				if got := picked[a.Address]; a.Prefix != got {
					t.Errorf("%s: /debug/prefix says %+v, PrepareData gave the pick %+v", a.Address, a.Prefix, got)
				}
			}
			if bs := ans.Endpoints[0].Prefix.BlockSizeTokens; bs != 4 {
				t.Errorf("pod-0: block size %d, want its events' 4", bs)
			}
			if bs := ans.Endpoints[1].Prefix.BlockSizeTokens; bs != tt.wantBlockSize {
				t.Errorf("pod-1: block size %d, want %d", bs, tt.wantBlockSize)
			}
		})
	}
}

func TestDebugPrefixSaysWhenNoProducerRuns(t *testing.T) {
	t.Parallel()
	e, err := epp.New(epp.Options{
		Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0",
		ConfigText: "plugins:\n- type: queue-scorer\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	runEPP(t, e)
	resp, err := http.Get("http://" + e.DebugAddr() + "/debug/prefix?token_ids=1,2,3")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = fmt.Fprint(&b, resp.Status)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("/debug/prefix with no prefix producer = %s, want 404", b.String())
	}
}

func runEPP(t *testing.T, e *epp.EPP) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("EPP run: %v", err)
		}
	})
}

func joinTokens(ids []uint32) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return strings.Join(parts, ",")
}
