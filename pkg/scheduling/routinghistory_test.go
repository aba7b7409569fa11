package scheduling_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/prepare/routinghistory"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
	"github.com/kvroute/kvroute/pkg/scheduling/internal/schedtest"
)

// historyKeeper keeps the routing history in a real approximate index, as
// the EPP's speculator does; it records no speculative holdings.
type historyKeeper struct{ index *approx.Index }

func (historyKeeper) Speculate(string, []uint64, int) {}

func (h historyKeeper) RecordHistory(addr string, hashes []uint64) { h.index.Record(addr, hashes) }

// Upstream's chart configuration (prefix-cache-scorer 3, queue 2, KV usage
// 2) places by where its picks sent a prefix. Under cache pressure the
// engine evicts a prefix from the pod it was sent to, and the exact index
// then says nobody holds it: the scorer must still send it back there, as
// upstream's does, rather than to whichever pod is least loaded, which
// would spread every prefix over every pod's cache. The exact answer stays
// what it is.
func TestAnUpstreamChartFileSendsAPrefixBackToThePodItWentToAfterTheCacheLostIt(t *testing.T) {
	t.Parallel()
	chart, err := os.ReadFile("config/testdata/upstream/gie-v1.5.0-chart-default-plugins.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		text    string
		wantSec string
	}{
		{"as the chart writes it, the prefix goes back to the pod it was sent to", string(chart), "pod-0"},
		{"scoring holdings alone, it goes to the least loaded pod", strings.Replace(string(chart), "- type: prefix-cache-scorer\n", "- type: prefix-cache-scorer\n  parameters: {routingHistory: false}\n", 1), "pod-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			history := approx.New(0, nil)
			r := config.NewInTreeRegistry()
			err := r.Register(routinghistory.Type, func(name string, _ json.RawMessage, _ framework.Handle) (plugin.Plugin, error) {
				return routinghistory.New(name, history), nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.RegisterDefaultProducer(datalayer.RoutedPrefixKey, routinghistory.Type); err != nil {
				t.Fatal(err)
			}
			l, err := r.Load([]byte(tt.text), &config.Handle{Spec: historyKeeper{history}})
			if err != nil {
				t.Fatal(err)
			}
			opts := l.SchedulerOptions()
			opts.Rand = rand.New(rand.NewPCG(1, 2))
			opts.Now = func() time.Time { return schedtest.Now }
			s, err := scheduling.New(opts)
			if err != nil {
				t.Fatal(err)
			}
			var producers []prepare.DataProducer
			for _, p := range l.Plugins {
				if dp, ok := p.(prepare.DataProducer); ok {
					producers = append(producers, dp)
				}
			}

			keys := make([]uint64, 16)
			for i := range keys {
				keys[i] = uint64(1000 + i)
			}
			// Neither pod holds the prefix: the first time because nobody
			// has computed it, the second because pod-0's cache evicted it.
			pick := func(busy0, busy1 schedtest.C) (string, []*datalayer.Candidate) {
				t.Helper()
				busy0.Name, busy1.Name = "pod-0", "pod-1"
				busy0.Prefix, busy1.Prefix = schedtest.Info(16, 0, 0, 0, 0), schedtest.Info(16, 0, 0, 0, 0)
				cands := schedtest.Cands(busy0, busy1)
				for _, c := range cands {
					c.Put(framework.RequestBlockKeysKey, keys)
				}
				for _, dp := range producers {
					if err := dp.Produce(context.Background(), &request.Request{Model: "m", TokenIDs: make([]uint32, 256)}, cands); err != nil {
						t.Fatal(err)
					}
				}
				res, err := s.Schedule(context.Background(), &request.Request{ID: "r", Model: "m", TokenIDs: make([]uint32, 256)}, cands)
				if err != nil {
					t.Fatal(err)
				}
				return res.Targets()[0].Name, cands
			}
			if first, _ := pick(schedtest.C{Queue: 0, KV: 0.1}, schedtest.C{Queue: 4, KV: 0.6}); first != "pod-0" {
				t.Fatalf("first pick %s, want the idle pod-0", first)
			}
			second, cands := pick(schedtest.C{Queue: 2, KV: 0.3}, schedtest.C{Queue: 0, KV: 0.1})
			if second != tt.wantSec {
				t.Errorf("second pick %s, want %s", second, tt.wantSec)
			}
			for _, c := range cands {
				info, _ := datalayer.PrefixCacheInfoOf(c)
				if info.MatchBlocks != 0 || !info.Exact {
					t.Errorf("%s: prefix info %+v, want the exact answer (nothing held) unchanged", c.Name, info)
				}
				routed, ok := datalayer.RoutedPrefixOf(c)
				if want := tt.wantSec == "pod-0"; ok != want {
					t.Fatalf("%s: routed prefix published %v, want %v", c.Name, ok, want)
				}
				if ok && (routed.Blocks == 16) != (c.Name == "pod-0") {
					t.Errorf("%s: routed %d of %d blocks, want all 16 only on pod-0", c.Name, routed.Blocks, routed.TotalBlocks)
				}
			}
		})
	}
}
