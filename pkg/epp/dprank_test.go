package epp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// TestARepeatedPromptLandsOnTheRankThatHoldsIt runs one simulated vLLM
// engine of four data-parallel ranks behind one port, publishing each
// rank's events over a real NATS server, and the EPP over ext_proc on
// loopback: a prompt one rank holds goes there (the rank header is set and
// the engine serves it there, from its cache), a client cannot name the
// rank, and a rank whose stream is uncertain is not taken at its word.
func TestARepeatedPromptLandsOnTheRankThatHoldsIt(t *testing.T) {
	t.Parallel()
	const bs = 16
	e, err := epp.New(epp.Options{
		Pool: "pool", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
		RequestPath: epp.RequestPathOptions{ExtProcAddr: "127.0.0.1:0", Plaintext: true},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	f, err := sim.StartFleet(ctx, sim.FleetConfig{
		Engines: 1, Model: "m", DataParallel: 4,
		Pool:      blockpool.Config{BlockSize: bs, GPUBlocks: 512},
		Timing:    sim.Timing{PrefillPerToken: 10 * time.Microsecond, DecodeStep: time.Millisecond, MaxSeqs: 8},
		Publisher: events.NewPublisher(nc, e.Namespace(), e.Pool()),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := f.Close(); err != nil {
			t.Error(err)
		}
		nc.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("EPP: %v", err)
		}
	})
	srv := f.Servers[0]
	addr := srv.Addr()
	e.Datastore().Upsert(&datalayer.Endpoint{Name: "vllm-0", Address: addr, Pod: "vllm-0", Model: "m"})
	testkit.WaitFor(t, "the EPP to be ready", func() error {
		if !e.Ready() {
			return errors.New("e.Ready() is false")
		}
		return nil
	})
	client, err := envoy.Dial(e.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	hc := &http.Client{}
	up := envoy.HTTPUpstream(hc)

	prompt := func(base uint32) []uint32 {
		p := make([]uint32, 8*bs)
		for i := range p {
			p[i] = base + uint32(i)
		}
		return p
	}
	body := func(p []uint32) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "prompt": p, "max_tokens": 2})
		return b
	}
	// viaEPP sends p through ext_proc, with a rank header of the client's
	// own, and returns the rank the EPP named and the cached tokens the
	// engine reported.
	viaEPP := func(p []uint32) (rank string, cached int) {
		t.Helper()
		res, err := client.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body(p),
			Headers: map[string]string{datalayer.HeaderDataParallelRank: "3"}}, up)
		if err != nil {
			t.Fatal(err)
		}
		if res.Status != http.StatusOK {
			t.Fatalf("status %d: %s", res.Status, res.ResponseBody)
		}
		var u struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.Unmarshal(res.ResponseBody, &u); err != nil {
			t.Fatal(err)
		}
		return res.SetHeaders[datalayer.HeaderDataParallelRank], u.Usage.Details.Cached
	}
	// direct sends p to the engine on rank, passing no EPP.
	direct := func(p []uint32, rank int) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(body(p)))
		req.Header.Set(sim.HeaderDataParallelRank, fmt.Sprint(rank))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("direct to rank %d: status %d", rank, resp.StatusCode)
		}
	}
	held := func(p []uint32, rank, blocks int) {
		t.Helper()
		keys := index.AppendBlockKeys(nil, index.RootKey("m", "", ""), p, bs)
		testkit.WaitFor(t, fmt.Sprintf("the index to see rank %d hold %d blocks", rank, blocks), func() error {
			for _, m := range e.Index().LookupRanks(keys, addr, nil) {
				if m.Rank == rank && m.Blocks-m.Speculative >= blocks {
					return nil
				}
			}
			return fmt.Errorf("ranks: %+v", e.Index().LookupRanks(keys, addr, nil))
		})
	}

	// Rank 2 alone holds P, from a request that passed no EPP.
	p := prompt(1000)
	direct(p, 2)
	held(p, 2, 8)
	_, pinnedBefore := srv.RankServed()
	rank, cached := viaEPP(p)
	if rank != "2" {
		t.Fatalf("a prompt rank 2 holds was sent to rank %q", rank)
	}
	_, pinned := srv.RankServed()
	if pinned[2] != pinnedBefore[2]+1 || pinned[3] != pinnedBefore[3] {
		t.Fatalf("the engine served it pinned to %v, was %v: the header was not honoured, or the client's passed", pinned, pinnedBefore)
	}
	if cached < 7*bs {
		t.Fatalf("rank 2 served it with %d cached tokens, want its 8 blocks' (the last may be recomputed)", cached)
	}

	// Rank 2's stream breaks: what it holds is no longer taken at its
	// word, and P goes where the load says, as a cold prompt would.
	e.Index().SetStreamState(events.Stream{Endpoint: addr, DPRank: 2}, datalayer.StreamUncertain)
	if rank, _ := viaEPP(p); rank == "2" || rank == "" {
		t.Fatalf("with rank 2 uncertain, the prompt it holds went to rank %q", rank)
	}
}
