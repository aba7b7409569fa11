package epp_test

// The attacks of docs/security.md that reach the assembled EPP, each run
// against the real components (the EPP as epp.New builds it, its embedded
// NATS server, simulated engines publishing real events), each checking
// that what the index answers for the real pods did not change, and, for
// the resource attacks, that the heap grew no more than the configured
// bounds allow, as the runtime reports it.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// victims is a fleet whose engines each hold a prompt of their own, and
// what the index answers for those prompts.
type victims struct {
	f       *fleet.Fleet
	prompts [][]uint32
	before  string
	nc      *nats.Conn // the attacker's connection
	log     *testkit.LogBuffer
}

func startVictims(t *testing.T, edit func(*epp.Options)) *victims {
	t.Helper()
	v := &victims{log: &testkit.LogBuffer{}}
	v.f = fleet.Start(t, fleet.Options{NoTokenizer: true, EPP: func(o *epp.Options) {
		o.Logger = slog.New(slog.NewTextHandler(v.log, nil))
		if edit != nil {
			edit(o)
		}
	}})
	testkit.WaitFor(t, "the EPP to consume", func() error {
		if !v.f.EPP.Ready() {
			return errors.New("v.f.EPP.Ready() is false")
		}
		return nil
	})
	v.prompts = v.f.FillPrefixes(t, 64)
	for i, s := range v.f.Servers {
		v.f.WaitHeld(t, s.Addr, v.prompts[i])
	}
	// A stream still resyncing after its first events would settle during
	// the attack and read as a change. A stream's first batch can be
	// applied (and read exact) before the gap it shows schedules a resync,
	// so the baseline waits for answers that hold still, out of recovery,
	// with no resync in flight, for a while.
	var since time.Time
	last := ""
	testkit.WaitFor(t, "every pod's stream settled out of recovery", func() error {
		a := v.answers(t)
		inFlight := testkit.Value(t, v.f.Metrics, "kvroute_recovery_in_flight")
		switch {
		case strings.Contains(a, " recovering;") || inFlight != 0:
			last = ""
			return fmt.Errorf("%v resyncs in flight; answers: %s", inFlight, a)
		case a != last:
			since, last = time.Now(), a
			return fmt.Errorf("answers changed: %s", a)
		case time.Since(since) < 300*time.Millisecond:
			return fmt.Errorf("answers held for %v", time.Since(since))
		}
		return nil
	})
	v.before = last
	var err error
	if v.nc, err = nats.Connect(v.f.EPP.NATSURL()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.nc.Close)
	return v
}

// answers is what the index says of every real pod for every prompt.
func (v *victims) answers(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for i, p := range v.prompts {
		ans, err := v.f.EPP.Lookup(context.Background(), prefixquery.Query{Model: "m", TokenIDs: p})
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range ans.Endpoints {
			fmt.Fprintf(&b, "prompt %d on %s: %d/%d %s; ", i, a.Name, a.Prefix.MatchBlocks, a.Prefix.TotalBlocks, a.Stream)
		}
	}
	return b.String()
}

// answersOf keeps, of answers, what it says of pods.
func (v *victims) answersOf(t *testing.T, answers string, pods ...string) string {
	t.Helper()
	var kept []string
	for _, line := range strings.Split(answers, "; ") {
		for _, p := range pods {
			if strings.Contains(line, " on "+p+":") {
				kept = append(kept, line)
			}
		}
	}
	return strings.Join(kept, "; ")
}

func (v *victims) unchanged(t *testing.T) {
	t.Helper()
	if after := v.answers(t); after != v.before {
		t.Errorf("the attack changed what the index answers:\n before %s\n after  %s", v.before, after)
	}
}

func (v *victims) rejected(t *testing.T, reason string) float64 {
	return testkit.Value(t, v.f.Metrics, "kvroute_events_rejected_total", "reason", reason)
}

// flood publishes n messages made by msg, a chunk at a time, waiting after
// each chunk until done reports that many handled, so that the test
// measures what the EPP keeps rather than what NATS buffers.
func (v *victims) flood(t *testing.T, n int, msg func(i int) *nats.Msg, done func() float64) {
	t.Helper()
	const chunk = 10_000
	base := done()
	for i := 0; i < n; {
		end := min(i+chunk, n)
		for ; i < end; i++ {
			if err := v.nc.PublishMsg(msg(i)); err != nil {
				t.Fatal(err)
			}
		}
		if err := v.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, fmt.Sprintf("%d forged messages handled", end), func() error {
			if seen := done() - base; seen < float64(end) {
				return fmt.Errorf("done()-base is %v, want >= %v", seen, float64(end))
			}
			return nil
		})
	}
}

func encode(t *testing.T, b *events.Batch) []byte {
	t.Helper()
	data, err := events.AppendBatch(nil, b, events.EncodingArray)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Row 1: one message on a subject of its own, naming a real pod's
// endpoint and a new engine instance. Before, the pod's holdings went to
// zero and it still read exact.
func TestAttackAMessageOnAnotherSubjectCannotSpeakForAPod(t *testing.T) {
	v := startVictims(t, nil)
	cleared := encode(t, &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}})
	victim := v.f.Servers[0]
	for _, tc := range []struct {
		name, subjectPod, headerPod, reason string
	}{
		{"a pod outside the pool", "evil", "", "endpoint_of_other_pod"},
		{"a pod outside the pool naming the victim", "evil", "pod-0", "pod_mismatch"},
		{"another member of the pool", "pod-1", "pod-1", "endpoint_of_other_pod"},
	} {
		o := events.Origin{Stream: events.Stream{Endpoint: victim.Addr}, Pod: tc.headerPod, Instance: "forged-instance", Seq: 0}
		before := v.rejected(t, tc.reason)
		if err := v.nc.PublishMsg(&nats.Msg{Subject: events.Subject(v.f.EPP.Namespace(), v.f.EPP.Pool(), tc.subjectPod), Header: o.Header(), Data: cleared}); err != nil {
			t.Fatal(err)
		}
		testkit.WaitFor(t, tc.name+" rejected", func() error {
			if seen := v.rejected(t, tc.reason); seen <= before {
				return fmt.Errorf("v.rejected(t, tc.reason) is %v, want > %v", seen, before)
			}
			return nil
		})
	}
	v.unchanged(t)
	if n := testkit.Value(t, v.f.Metrics, "kvroute_index_events_applied_total", "kind", "AllBlocksCleared"); n != 0 {
		t.Errorf("%v forged AllBlocksCleared applied", n)
	}
}

// Row 3: 200k forged Kv-DP-Rank values for one real endpoint. Before,
// 440 MB were kept for good, recovery retried a snapshot per fake stream
// and 12k warnings were logged.
func TestAttackForgedRanksOfOneEndpointKeepNoState(t *testing.T) {
	const forged = 200_000
	v := startVictims(t, nil)
	victim := v.f.Servers[1]
	data := encode(t, &events.Batch{Events: []events.Event{{Kind: events.KindAllBlocksCleared}}})
	h0 := testkit.LiveHeap()
	v.flood(t, forged, func(i int) *nats.Msg {
		o := events.Origin{Stream: events.Stream{Endpoint: victim.Addr, DPRank: 1000 + i}, Pod: "pod-1", Instance: "x", Seq: 0}
		return &nats.Msg{Subject: events.Subject(v.f.EPP.Namespace(), v.f.EPP.Pool(), "pod-1"), Header: o.Header(), Data: data}
	}, func() float64 {
		return v.rejected(t, "rank_limit") + testkit.Value(t, v.f.Metrics, "kvroute_events_batches_total", "result", "applied")
	})
	grown := testkit.LiveHeap() - h0
	t.Logf("heap grew by %d KiB after %d forged ranks", grown>>10, forged)
	// The ranks admitted up to the cap are real streams now, and may have
	// cleared: what the cap lets a pod's own relay do to its own pod.
	// The other pods are untouched.
	if got := v.rejected(t, "rank_limit"); got < forged-32 {
		t.Errorf("rank_limit rejections = %v, want at least %d", got, forged-32)
	}
	if grown > 16<<20 {
		t.Errorf("heap grew by %d MiB after %d forged ranks, want no state kept for them", grown>>20, forged)
	}
	if n := v.f.EPP.Recovery().Pending(); n > 32+1 {
		t.Errorf("%d streams await a resync, want at most the rank cap", n)
	}
	if n := strings.Count(v.log.String(), "rejected kv-event message"); n > 100 {
		t.Errorf("%d log lines for %d rejections, want them rate-limited", n, forged)
	}
	v.unchanged(t)
}

// Row 5: 500k endpoints that are not in the pool. Before, the index
// dropped their events but the consumer kept 336 MB of per-stream state
// for an hour and counted them applied.
func TestAttackEndpointsOutsideThePoolKeepNoState(t *testing.T) {
	const forged = 200_000
	v := startVictims(t, nil)
	applied := testkit.Value(t, v.f.Metrics, "kvroute_events_batches_total", "result", "applied")
	data := encode(t, &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{1}, TokenIDs: []uint32{1, 2, 3, 4}, BlockSize: 4}}})
	h0 := testkit.LiveHeap()
	v.flood(t, forged, func(i int) *nats.Msg {
		pod := fmt.Sprintf("ghost-%d", i)
		o := events.Origin{Stream: events.Stream{Endpoint: fmt.Sprintf("10.%d.%d.%d:8000", i>>16, i>>8&255, i&255)}, Pod: pod, Instance: "x"}
		return &nats.Msg{Subject: events.Subject(v.f.EPP.Namespace(), v.f.EPP.Pool(), pod), Header: o.Header(), Data: data}
	}, func() float64 { return v.rejected(t, "unknown_endpoint") })
	grown := testkit.LiveHeap() - h0
	t.Logf("heap grew by %d KiB after %d endpoints outside the pool", grown>>10, forged)
	if grown > 16<<20 {
		t.Errorf("heap grew by %d MiB after %d endpoints outside the pool, want no state kept", grown>>20, forged)
	}
	if got := testkit.Value(t, v.f.Metrics, "kvroute_events_batches_total", "result", "applied") - applied; got != 0 {
		t.Errorf("%v batches of endpoints outside the pool counted applied", got)
	}
	v.unchanged(t)
}

// Row 4: millions of distinct forged blocks for one endpoint. Before, the
// cap was shared: one stream filled it and the other pods' stores were
// dropped; and its default was twice the chart's memory limit.
func TestAttackAFloodOfBlocksFromOneEndpointStaysWithinItsShare(t *testing.T) {
	const total, perEndpoint, flood, runBlocks = 400_000, 50_000, 1_000_000, 2048
	v := startVictims(t, func(o *epp.Options) { o.Index.MaxHoldings = total })
	flooder := v.f.Servers[0]
	tokens := make([]uint32, runBlocks*4)
	hashes := make([]uint64, runBlocks)
	h0 := testkit.LiveHeap()
	batches := flood / runBlocks
	v.flood(t, batches, func(i int) *nats.Msg {
		for j := range hashes {
			hashes[j] = uint64(i*runBlocks+j) | 1<<62
		}
		for j := range tokens {
			tokens[j] = uint32(i*len(tokens)+j) | 1<<31
		}
		o := events.Origin{Stream: events.Stream{Endpoint: flooder.Addr, DPRank: 1}, Pod: "pod-0", Instance: "flood", Seq: uint64(i), BlockSize: 4}
		b := &events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: 4}}}
		return &nats.Msg{Subject: events.Subject(v.f.EPP.Namespace(), v.f.EPP.Pool(), "pod-0"), Header: o.Header(), Data: encode(t, b)}
	}, func() float64 {
		return testkit.Value(t, v.f.Metrics, "kvroute_events_batches_total", "result", "applied")
	})
	grown := testkit.LiveHeap() - h0
	t.Logf("heap grew by %d KiB for %d forged blocks (the endpoint's share: %d holdings)", grown>>10, batches*runBlocks, perEndpoint)
	if limit := int64(perEndpoint*epp.BytesPerHolding*2 + 16<<20); grown > limit {
		t.Errorf("heap grew by %d MiB for %d forged blocks, over the endpoint's share (%d holdings, %d MiB with slack)",
			grown>>20, flood, perEndpoint, limit>>20)
	}
	if got := testkit.Value(t, v.f.Metrics, "kvroute_index_events_dropped_total", "reason", "endpoint_capacity"); got < float64(batches*runBlocks-perEndpoint) {
		t.Errorf("endpoint_capacity drops = %v, want the flood past the endpoint's share", got)
	}
	// The other pods keep what they hold, and still index what they store.
	if got, want := v.answersOf(t, v.answers(t), "pod-1", "pod-2"), v.answersOf(t, v.before, "pod-1", "pod-2"); got != want {
		t.Errorf("the other pods' answers changed:\n before %s\n after  %s", want, got)
	}
	fresh := make([]uint32, 64)
	for i := range fresh {
		fresh[i] = uint32(900_000 + i)
	}
	if _, err := v.f.Servers[1].Engine.Serve(blockpool.Request{Tokens: fresh}); err != nil {
		t.Fatal(err)
	}
	v.f.WaitHeld(t, v.f.Servers[1].Addr, fresh)
	if got := testkit.Value(t, v.f.Metrics, "kvroute_index_events_dropped_total", "reason", "capacity"); got != 0 {
		t.Errorf("%v stores dropped at the index's total bound: the flood took the others' room", got)
	}
}

// Row 6: requests naming models no endpoint serves. Before, three 100 KB
// model names grew /metrics from 40 KB to 24 MB, for good.
func TestAttackClientModelNamesNeverBecomeLabelValues(t *testing.T) {
	for _, pass := range []bool{false, true} {
		t.Run(fmt.Sprintf("unknown models passed through: %t", pass), func(t *testing.T) {
			v := startVictims(t, func(o *epp.Options) {
				o.RequestPath.ProxyAddr = "127.0.0.1:0"
				o.RequestPath.PassUnknownModels = pass
			})
			metricsSize := func() int {
				resp, err := http.Get("http://" + v.f.EPP.HTTPAddr() + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return len(b)
			}
			send := func(model string) {
				t.Helper()
				body := fmt.Sprintf(`{"model":"%s","prompt":[1,2,3,4,5,6,7,8]}`, model)
				resp, err := http.Post("http://"+v.f.EPP.ProxyAddr()+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if want := map[bool]int{false: 404, true: 200}[pass]; resp.StatusCode != want {
					t.Fatalf("status %d, want %d", resp.StatusCode, want)
				}
			}
			accounted := func(n float64) {
				testkit.WaitFor(t, "the requests to be accounted", func() error {
					if seen := testkit.Value(t, v.f.Metrics, "kvroute_proxy_requests_total"); seen < n {
						return fmt.Errorf("testkit.Value(t, v.f.Metrics, \"kvroute_proxy_requests_total\") is %v, want >= %v", seen, n)
					}
					return nil
				})
			}
			// The first unknown model makes the series of the one value
			// they all fold into.
			send("warm-up")
			accounted(1)
			before := metricsSize()
			name := strings.Repeat("x", 100<<10)
			for i := range 3 {
				send(fmt.Sprintf("%s%d", name, i))
			}
			accounted(4)
			if grown := metricsSize() - before; grown > 1<<10 {
				t.Errorf("/metrics grew by %d bytes for three 100 KB model names", grown)
			}
			v.unchanged(t)
		})
	}
}

// Row 8: /debug/prefix tells whoever reaches it which prompts the engines
// hold. Before, it was always on, on the metrics port.
func TestAttackDebugPrefixIsNotOnTheMetricsPort(t *testing.T) {
	v := startVictims(t, nil)
	if addr := v.f.EPP.DebugAddr(); addr != "" {
		t.Fatalf("a debug listener at %s by default", addr)
	}
	q := "/debug/prefix?model=m&token_ids=" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(v.prompts[0])), ","), "[]")
	for _, path := range []string{q, "/debug/pprof/"} {
		resp, err := http.Get("http://" + v.f.EPP.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || strings.Contains(string(b), v.f.Servers[0].Addr) {
			t.Errorf("GET %s on the metrics port: %d %q, want 404 and nothing about the pods", path[:14], resp.StatusCode, b)
		}
	}
}
