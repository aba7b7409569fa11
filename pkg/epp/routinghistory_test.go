package epp

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// The upstream EPP's chart configuration (prefix-cache-scorer 3, queue 2,
// KV usage 2), loaded as written, on engines whose KV events reach the
// index. A prompt goes to the idle pod-0; pod-0's cache then evicts it, so
// that the exact index rightly says nobody holds it; and pod-1 becomes the
// less loaded. Upstream's scorer sends the prompt back to pod-0, where it
// was sent (its routing history), and so must the file here: otherwise
// every prompt the cache loses moves to whichever pod is least loaded, and
// under cache pressure every pod's cache churns. The exact answer must
// still say that pod-0 holds nothing.
func TestAnUpstreamChartFileSendsAPromptBackToThePodItWentToAfterItsCacheLostIt(t *testing.T) {
	chart, err := os.ReadFile("../scheduling/config/testdata/upstream/gie-v1.5.0-chart-default-plugins.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		text string
		want string
	}{
		{"as written, it goes back to pod-0", string(chart), "pod-0"},
		{"scoring the index's holdings alone, it goes to the less loaded pod-1",
			strings.Replace(string(chart), "- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n  parameters: {routingHistory: false}\n", 1), "pod-1"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := startEPPWith(t, Options{ConfigText: tt.text})
			nc, err := nats.Connect(e.NATSURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			pub := events.NewPublisher(nc, e.Namespace(), e.Pool())
			engines := make([]*sim.Engine, 2)
			for j := range engines {
				cfg := sim.EngineConfig{
					// Addresses of their own per case: nothing answers a
					// scrape there, so the load set below stays.
					Pod: fmt.Sprintf("pod-%d", j), Address: fmt.Sprintf("127.0.%d.%d:1", 90+i, j+1), Model: "m",
					Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 8, Seed: uint64(j + 1)},
				}
				engines[j] = sim.NewEngine(cfg, pub)
				e.Datastore().Upsert(&datalayer.Endpoint{Name: cfg.Pod, Address: cfg.Address, Pod: cfg.Pod, Model: "m"})
			}
			load := func(queue0, queue1 int, kv0, kv1 float64) {
				for j, m := range []datalayer.Metrics{
					{WaitingQueueSize: queue0, KVCacheUsage: kv0},
					{WaitingQueueSize: queue1, KVCacheUsage: kv1},
				} {
					m.BlockSize, m.NumGPUBlocks, m.UpdateTime = 4, 8, time.Now()
					e.Datastore().SetMetrics(engines[j].Config().Pod, m)
				}
			}
			tokens := func(base uint32) []uint32 {
				out := make([]uint32, 24)
				for k := range out {
					out[k] = base + uint32(k)
				}
				return out
			}
			// Core NATS keeps nothing for a subscriber yet to come: the
			// engines publish once the EPP listens.
			testkit.WaitFor(t, "the EPP's consumer to subscribe", func() error {
				if !e.consumer.Connected() {
					return fmt.Errorf("consumer not subscribed")
				}
				return nil
			})
			// Every engine's stream in order before anything is asked.
			for j, eng := range engines {
				mustServe(t, eng, blockpool.Request{Tokens: tokens(uint32(1000 * (j + 1)))})
			}
			testkit.WaitFor(t, "both streams exact", func() error {
				for _, eng := range engines {
					if s, _ := e.Index().State(eng.Config().Address); s != datalayer.StreamExact {
						return fmt.Errorf("%s: stream %v", eng.Config().Pod, s)
					}
				}
				return nil
			})

			prompt := tokens(7)
			route := func() (string, []*datalayer.Candidate) {
				t.Helper()
				p, err := e.Director().Route(context.Background(), &request.Request{Model: "m", TokenIDs: prompt}, nil)
				if err != nil {
					t.Fatal(err)
				}
				ep, ok := e.Datastore().ByAddress(p.Targets[0])
				if !ok {
					t.Fatalf("picked %s, no endpoint", p.Targets[0])
				}
				return ep.Name, p.Candidates
			}
			load(0, 4, 0.1, 0.6)
			if first, _ := route(); first != "pod-0" {
				t.Fatalf("first pick %s, want the idle pod-0", first)
			}
			mustServe(t, engines[0], blockpool.Request{Tokens: prompt})
			matched := func(want int) func() error {
				return func() error {
					_, cands := route()
					for _, c := range cands {
						info, _ := datalayer.PrefixCacheInfoOf(c)
						if w := map[bool]int{true: want}[c.Address == engines[0].Config().Address]; info.MatchBlocks != w || !info.Exact {
							return fmt.Errorf("%s: %+v, want %d blocks held, exactly", c.Address, info, w)
						}
					}
					return nil
				}
			}
			testkit.WaitFor(t, "the index to see pod-0 hold the prompt", matched(len(prompt)/4))
			// Two other prompts fill pod-0's 8 blocks: the first is evicted.
			mustServe(t, engines[0], blockpool.Request{Tokens: tokens(5000)})
			mustServe(t, engines[0], blockpool.Request{Tokens: tokens(6000)})
			if held := engines[0].Held(blockpool.Request{Tokens: prompt}); held.Blocks != 0 {
				t.Fatalf("pod-0 still holds %d blocks of the prompt", held.Blocks)
			}
			testkit.WaitFor(t, "the index to see the eviction", matched(0))

			load(2, 0, 0.3, 0.1)
			second, cands := route()
			if second != tt.want {
				t.Errorf("second pick %s, want %s", second, tt.want)
			}
			for _, c := range cands {
				if info, _ := datalayer.PrefixCacheInfoOf(c); info.MatchBlocks != 0 || !info.Exact {
					t.Errorf("%s: prefix info %+v, want the exact answer, nothing held", c.Address, info)
				}
			}
		})
	}
}
