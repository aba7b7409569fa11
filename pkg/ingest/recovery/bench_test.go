package recovery

import (
	"context"
	"log/slog"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/relay"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// BenchmarkRecover100kBlocks measures recovering one endpoint that holds
// 100k blocks: the request, the relay taking and encoding its snapshot,
// the chunks crossing a real NATS server over loopback TCP, and the
// install into the index.
func BenchmarkRecover100kBlocks(b *testing.B) {
	const (
		blocks    = 100_000
		chain     = 64
		bs        = 16
		pod, addr = "vllm-0", "10.0.0.7:8000"
	)
	mirror := relay.NewMirror(0)
	mirror.Reset("inst")
	tok := uint32(0)
	for c := 0; c < blocks/chain; c++ {
		e := events.Event{Kind: events.KindBlockStored, BlockSize: bs}
		for k := 0; k < chain; k++ {
			e.BlockHashes = append(e.BlockHashes, uint64(c*chain+k+1))
			for range bs {
				tok++
				e.TokenIDs = append(e.TokenIDs, tok)
			}
		}
		mirror.Apply(uint64(c), &events.Batch{Events: []events.Event{e}}, bs, 0)
	}
	seq := mirror.Position().Seq

	ns, err := natsembed.Start(natsembed.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer ns.Shutdown()
	relayNC, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer relayNC.Close()
	// The relay's reply, as serveSnapshot sends it.
	_, err = relayNC.Subscribe(events.SnapshotSubject("ns", "pool", pod), func(m *nats.Msg) {
		s, err := mirror.Snapshot(0)
		if err != nil {
			b.Error(err)
			return
		}
		o := events.Origin{Stream: events.Stream{Endpoint: addr}, Pod: pod, Instance: "inst", BlockSize: bs, Seq: seq}
		for i, c := range s.Chunks {
			h := o.Header()
			h.Set(events.HeaderSnapshotChunk, strconv.Itoa(i))
			h.Set(events.HeaderSnapshotChunks, strconv.Itoa(len(s.Chunks)))
			h.Set(events.HeaderSnapshotExact, "true")
			_ = relayNC.PublishMsg(&nats.Msg{Subject: m.Reply, Header: h, Data: c})
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	ix := index.New(index.Options{}, nil)
	ix.AddEndpoint(addr)
	r, err := New(Options{Namespace: "ns", Pool: "pool", Timeout: time.Minute,
		Pod: func(string) (string, bool) { return pod, true }, Logger: slog.New(slog.DiscardHandler)}, ix, nc, nil)
	if err != nil {
		b.Fatal(err)
	}
	st := r.get(events.Stream{Endpoint: addr})
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		if err := r.resync(ctx, st); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if s, _ := ix.State(addr); s != datalayer.StreamExact {
		b.Fatalf("state after recovery = %s", s)
	}
	// The last chain must be held whole.
	last := make([]uint32, chain*bs)
	for i := range last {
		last[i] = tok - uint32(len(last)) + uint32(i) + 1
	}
	out := make([]index.Match, 1)
	ix.Lookup(index.AppendBlockKeys(nil, index.RootKey("", "", ""), last, bs), []string{addr}, out)
	if out[0].Blocks != chain {
		b.Fatalf("last chain matches %d blocks after recovery, want %d", out[0].Blocks, chain)
	}
	perOp := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(perOp*1e3, "ms/recovery")
	b.ReportMetric(blocks/perOp, "blocks/s")
	b.ReportMetric(0, "ns/op")
}
