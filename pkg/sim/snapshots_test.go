package sim_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// An engine publishing straight to NATS answers snapshot requests as a
// relay does, and its heartbeats name its last batch.
func TestAnEngineOnNATSAnswersSnapshotsAndHeartbeats(t *testing.T) {
	t.Parallel()
	srv := testkit.StartNATS(t, testkit.NATSOptions{InProcess: true})
	nc := srv.Connect(t, "engine")
	const bs = 4
	eng := sim.NewEngine(sim.EngineConfig{Pod: "vllm-0", Address: "10.0.0.7:8000", Model: "m",
		Pool: blockpool.Config{BlockSize: bs, GPUBlocks: 24, CPUBlocks: 8, Seed: 3}}, events.NewPublisher(nc, "ns", "pool"))
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- eng.ServeSnapshots(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Error(err)
		}
	})

	client := srv.Connect(t, "epp")
	beats, err := client.SubscribeSync(events.Subject("ns", "pool", "vllm-0"))
	if err != nil {
		t.Fatal(err)
	}
	if err := client.Flush(); err != nil {
		t.Fatal(err)
	}
	prompts := sim.SharedPrefix{Groups: 3, PromptsPerGroup: 4, SystemTokens: 4 * bs, QuestionTokens: 3 * bs, Seed: 1}.Prompts()
	for range 3 {
		for _, p := range prompts {
			p.ID = ""
			if _, err := eng.Serve(p); err != nil {
				t.Fatal(err)
			}
		}
	}
	last, _ := eng.LastSeq()
	testkit.WaitFor(t, "a heartbeat naming the last batch", func() error {
		m, err := beats.NextMsg(time.Second)
		if err != nil {
			return err
		}
		if !events.IsHeartbeat(m.Header) {
			return fmt.Errorf("a message on %s that is no heartbeat", m.Subject)
		}
		o, err := events.ParseOrigin(m.Header)
		if err != nil {
			return err
		}
		if o.Seq != last {
			return fmt.Errorf("o.Seq is %v, want %v", o.Seq, last)
		}
		return nil
	})

	inbox := client.NewRespInbox()
	sub, err := client.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := client.PublishRequest(events.SnapshotSubject("ns", "pool", "vllm-0"), inbox, nil); err != nil {
		t.Fatal(err)
	}
	var chunks []*events.Batch
	var o events.Origin
	for total := -1; total < 0 || len(chunks) < total; {
		m, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("chunk %d: %v", len(chunks), err)
		}
		if m.Header.Get(events.HeaderSnapshotState) != events.SnapshotExact {
			t.Fatalf("snapshot state %q, want exact", m.Header.Get(events.HeaderSnapshotState))
		}
		if total, err = strconv.Atoi(m.Header.Get(events.HeaderSnapshotChunks)); err != nil {
			t.Fatal(err)
		}
		if o, err = events.ParseOrigin(m.Header); err != nil {
			t.Fatal(err)
		}
		b, err := events.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, b)
	}
	if o.Seq != last {
		t.Fatalf("snapshot at seq %d, the engine's last batch is %d", o.Seq, last)
	}
	ix := index.New(index.Options{}, nil)
	ix.AddEndpoint("10.0.0.7:8000")
	if err := ix.InstallSnapshot(o, chunks); err != nil {
		t.Fatal(err)
	}
	out := make([]index.Match, 1)
	held := 0
	for _, p := range prompts {
		ix.Lookup(index.AppendBlockKeys(nil, index.RootKey("m", "", ""), p.Tokens, bs), []string{"10.0.0.7:8000"}, out)
		got, want := blockpool.Held{Blocks: out[0].Blocks, ByTier: out[0].ByTier}, eng.Held(p)
		if got != want {
			t.Fatalf("installed snapshot holds %+v of a prompt, the engine %+v", got, want)
		}
		held += want.Blocks
	}
	if held == 0 {
		t.Fatal("the engine holds nothing: the test proves nothing")
	}
}
