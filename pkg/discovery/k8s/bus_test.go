package k8s

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// bus is the event path of a deployment: an embedded NATS server, a
// relay-like publisher and the EPP's consumer feeding the index.
type bus struct {
	t   *testing.T
	pub *events.Publisher
	nc  *nats.Conn
	reg *prometheus.Registry
}

func startBus(t *testing.T, namespace, pool string, e *epp) *bus {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Options{Host: "127.0.0.1", Port: 0})
	if err != nil {
		t.Fatalf("nats: %v", err)
	}
	t.Cleanup(srv.Shutdown)
	url := srv.ClientURL()
	sub, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect consumer: %v", err)
	}
	t.Cleanup(sub.Close)
	pub, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect publisher: %v", err)
	}
	t.Cleanup(pub.Close)
	b := &bus{t: t, pub: events.NewPublisher(pub, namespace, pool), nc: pub, reg: prometheus.NewRegistry()}
	c, err := consumer.New(sub, consumer.Options{
		Namespace: namespace, Pool: pool, Logger: slog.New(slog.DiscardHandler),
	}, e.index, b.reg)
	if err != nil {
		t.Fatalf("consumer: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("consumer Run: %v", err)
		}
	})
	testkit.WaitFor(t, "the consumer to subscribe", func() error {
		if !c.Connected() {
			return errors.New("c.Connected() is false")
		}
		return nil
	})
	return b
}

// publish sends one batch storing a fresh block at addr.
func (b *bus) publish(pod, addr string, seq uint64) {
	b.t.Helper()
	batch := &events.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: []events.Event{{
		Kind:        events.KindBlockStored,
		BlockHashes: []uint64{seq},
		TokenIDs:    []uint32{uint32(seq), 1, 2, 3},
		BlockSize:   4,
		Medium:      events.TierGPU,
	}}}
	payload, err := events.AppendBatch(nil, batch, events.EncodingArray)
	if err != nil {
		b.t.Fatalf("encode: %v", err)
	}
	o := events.Origin{Stream: events.Stream{Endpoint: addr}, Pod: pod, Model: "org/model-a", Instance: "i1", BlockSize: 4, Seq: seq}
	if err := b.pub.Publish(o, payload); err != nil {
		b.t.Fatalf("publish: %v", err)
	}
}

// drain waits until the consumer has taken n batches off the wire,
// whatever became of them.
func (b *bus) drain(n int) {
	b.t.Helper()
	if err := b.nc.Flush(); err != nil {
		b.t.Fatalf("flush: %v", err)
	}
	testkit.WaitFor(b.t, "the consumer to take every batch", func() error {
		if seen := testkit.Value(b.t, b.reg, "kvroute_events_batches_total"); seen < float64(n) {
			return fmt.Errorf("testkit.Value(b.t, b.reg, \"kvroute_events_batches_total\") is %v, want >= %v", seen, float64(n))
		}
		return nil
	})
}
