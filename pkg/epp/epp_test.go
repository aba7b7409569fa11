package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// startEPP runs an EPP on an embedded NATS server and loopback ports until
// the test ends.
func startEPP(t *testing.T) *EPP {
	t.Helper()
	return startEPPWith(t, Options{})
}

// startEPPWith is startEPP with o's scheduling configuration.
func startEPPWith(t *testing.T, o Options) *EPP {
	t.Helper()
	e, err := New(Options{Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0", ConfigText: o.ConfigText})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("EPP run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("EPP did not stop within 10s of cancel")
		}
	})
	return e
}

func get(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDebugPrefixAnswersWhatTheEnginesHold(t *testing.T) {
	e := startEPP(t)
	base := "http://" + e.HTTPAddr()

	if code, body := get(t, base+"/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz with no endpoints = %d %q, want 503", code, body)
	}

	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub := events.NewPublisher(nc, e.Namespace(), e.Pool())
	engines := make([]*sim.Engine, 3)
	for i := range engines {
		cfg := sim.EngineConfig{
			Pod: fmt.Sprintf("pod-%d", i), Address: fmt.Sprintf("127.0.0.1:%d", 8000+i), Model: "m",
			Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 64, Seed: uint64(i + 1)},
		}
		engines[i] = sim.NewEngine(cfg, pub)
		e.Datastore().Upsert(&datalayer.Endpoint{Name: cfg.Pod, Address: cfg.Address, Pod: cfg.Pod, Model: "m"})
	}

	shared := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	promptA := blockpool.Request{Tokens: append(append([]uint32{}, shared...), 100, 101, 102, 103)}
	promptB := blockpool.Request{Tokens: append(append([]uint32{}, shared...), 200, 201, 202, 203)}
	mustServe(t, engines[0], promptA)
	mustServe(t, engines[1], promptB)

	// pod-0 holds all 4 blocks of A; pod-1 the 3 shared ones; pod-2 nothing.
	want := map[string]int{"127.0.0.1:8000": 4, "127.0.0.1:8001": 3, "127.0.0.1:8002": 0}
	q := url.Values{"model": {"m"}, "token_ids": {joinTokens(promptA.Tokens)}}
	var ans prefixquery.Answer
	testkit.WaitFor(t, "the index to reflect the published events", func() error {
		code, body := get(t, "http://"+e.DebugAddr()+"/debug/prefix?"+q.Encode())
		if code != http.StatusOK {
			t.Fatalf("/debug/prefix = %d %s", code, body)
		}
		ans = prefixquery.Answer{}
		if err := json.Unmarshal([]byte(body), &ans); err != nil {
			t.Fatalf("decode %q: %v", body, err)
		}
		for _, a := range ans.Endpoints {
			if a.Prefix.MatchBlocks != want[a.Address] {
				return fmt.Errorf("%s matches %d blocks, want %d", a.Address, a.Prefix.MatchBlocks, want[a.Address])
			}
		}
		if seen := len(ans.Endpoints); seen != 3 {
			return fmt.Errorf("len(ans.Endpoints) is %v, want %v", seen, 3)
		}
		return nil
	})
	for _, a := range ans.Endpoints {
		truth := byAddr(engines, a.Address).Held(promptA)
		if a.Prefix.MatchBlocks != truth.Blocks || a.Prefix.BlocksByTier != truth.ByTier {
			t.Errorf("%s: index says %d blocks %v, engine holds %d %v", a.Address,
				a.Prefix.MatchBlocks, a.Prefix.BlocksByTier, truth.Blocks, truth.ByTier)
		}
		// pod-2 never published an event: its block size is unknown (the
		// default, 16, is assumed) and its answer cannot be exact.
		wantTotal, wantBS, exact := 4, 4, true
		if a.Address == "127.0.0.1:8002" {
			wantTotal, wantBS, exact = 1, 16, false
		}
		if a.Prefix.TotalBlocks != wantTotal || a.Prefix.BlockSizeTokens != wantBS {
			t.Errorf("%s: total %d blocks of %d tokens, want %d of %d", a.Address,
				a.Prefix.TotalBlocks, a.Prefix.BlockSizeTokens, wantTotal, wantBS)
		}
		if a.Prefix.Exact != exact {
			t.Errorf("%s: exact = %t, want %t", a.Address, a.Prefix.Exact, exact)
		}
	}

	// Ready once it has caught up: a resync the events started may still
	// be in flight when the index already answers.
	testkit.WaitFor(t, "/readyz to answer 200 with endpoints and a connected consumer", func() error {
		code, _ := get(t, base+"/readyz")
		if code != http.StatusOK {
			return fmt.Errorf("code is %v, want %v", code, http.StatusOK)
		}
		return nil
	})
	_, metrics := get(t, base+"/metrics")
	for _, name := range []string{"kvroute_events_batches_total", "kvroute_index_", "kvroute_datastore_endpoints"} {
		if !strings.Contains(metrics, name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
}

func TestDebugPrefixRejectsMalformedQueries(t *testing.T) {
	e := startEPP(t)
	base := "http://" + e.DebugAddr() + "/debug/prefix"
	tests := []struct {
		name, method, query, body, reason string
	}{
		{"a negative token id", "GET", "token_ids=1,-2", "", "token id 1"},
		{"a token id past 32 bits", "GET", "token_ids=4294967296", "", "token id 0"},
		{"no token ids", "GET", "model=m", "", "token_ids is empty"},
		{"a JSON body that is not JSON", "POST", "", "{", "JSON body"},
		{"a JSON body with an unknown field", "POST", "", `{"tokens":[1]}`, "unknown field"},
		{"a method other than GET and POST", "DELETE", "", "", "not allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(tc.method, base+"?"+tc.query, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tc.reason) {
				t.Fatalf("got %d %q, want 400 mentioning %q", resp.StatusCode, b, tc.reason)
			}
		})
	}
}

func mustServe(t *testing.T, e *sim.Engine, p blockpool.Request) {
	t.Helper()
	if _, err := e.Serve(p); err != nil {
		t.Fatal(err)
	}
}

func byAddr(engines []*sim.Engine, addr string) *sim.Engine {
	for _, e := range engines {
		if e.Config().Address == addr {
			return e
		}
	}
	return nil
}

func joinTokens(ids []uint32) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprint(id)
	}
	return strings.Join(parts, ",")
}
