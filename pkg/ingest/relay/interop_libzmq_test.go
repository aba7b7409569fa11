//go:build libzmq

package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// TestRelayTakesBatchesFromLibzmq has libzmq, the transport vLLM itself
// publishes with, play the engine's PUB socket, in both directions of
// connection. It needs libzmq (Debian: libzmq3-dev) and cgo:
//
//	go test -race -tags libzmq ./pkg/relay/ -run Libzmq
func TestRelayTakesBatchesFromLibzmq(t *testing.T) {
	t.Parallel()
	for _, connect := range []bool{false, true} {
		name := "when the relay binds and libzmq dials"
		if connect {
			name = "when libzmq binds and the relay dials"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			zctx, err := zmq.NewContext()
			if err != nil {
				t.Fatal(err)
			}
			defer zctx.Term()
			// XPUB sends exactly as vLLM's PUB does, and also hands the test
			// the subscription when it arrives, so that nothing is sent
			// before anyone listens (a PUB drops it, silently).
			pub, err := zctx.NewSocket(zmq.XPUB)
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if err := pub.SetLinger(0); err != nil {
				t.Fatal(err)
			}
			ns := startNATS(t, natsembed.Options{})
			defer ns.Shutdown()
			col := collect(t, ns.ClientURL())
			cfg := baseConfig()
			if connect {
				if err := pub.Bind("tcp://127.0.0.1:*"); err != nil {
					t.Fatal(err)
				}
				ep, err := pub.GetLastEndpoint()
				if err != nil {
					t.Fatal(err)
				}
				cfg.Connect, cfg.ZMQEndpoint = true, ep
			}
			r := startRelay(t, cfg, ns.ClientURL())
			if !connect {
				if err := pub.Connect(r.zmqEndpoint()); err != nil {
					t.Fatal(err)
				}
			}
			testkit.WaitFor(t, "the relay's socket", func() error {
				if !r.Ready() {
					return errors.New("r.Ready() is false")
				}
				return nil
			})
			if err := pub.SetRcvtimeo(testkit.WaitLimit); err != nil {
				t.Fatal(err)
			}
			if sub, err := pub.RecvBytes(0); err != nil || len(sub) == 0 || sub[0] != 1 {
				t.Fatalf("the relay's subscription never reached the publisher: %q, %v", sub, err)
			}

			bm := newBatchMaker(11, 16, 32)
			payloads := map[uint64][]byte{}
			for seq := uint64(0); seq < 40; seq++ {
				payloads[seq] = bm.payload(t)
				if _, err := pub.SendMessage(testTopic, seqBytes(seq), payloads[seq]); err != nil {
					t.Fatalf("libzmq send %d: %v", seq, err)
				}
			}
			checkRelayed(t, col.wait(t, 40), payloads, seqRange(0, 40))
			if got := value(r.m.restarts) + value(r.m.gapsUnfilled) + value(r.m.decodeErrors); got != 0 {
				t.Fatalf("restarts, gaps and decode errors sum to %v", got)
			}
			if p := r.Mirror().Position(); !p.Exact || p.Seq != 39 {
				t.Fatalf("mirror position %+v, want exact at 39", p)
			}
		})
	}
}

// TestRelayFillsGapsFromALibzmqReplaySocket has a libzmq ROUTER answer
// replays the way vLLM's replay socket does.
func TestRelayFillsGapsFromALibzmqReplaySocket(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	zctx, err := zmq.NewContext()
	if err != nil {
		t.Fatal(err)
	}
	defer zctx.Term()
	router, err := zctx.NewSocket(zmq.ROUTER)
	if err != nil {
		t.Fatal(err)
	}
	_ = router.SetLinger(0)
	_ = router.SetRcvtimeo(50 * time.Millisecond)
	if err := router.Bind("tcp://127.0.0.1:*"); err != nil {
		t.Fatal(err)
	}
	replayEP, _ := router.GetLastEndpoint()

	bm := newBatchMaker(12, 16, 8)
	payloads := map[uint64][]byte{}
	for seq := uint64(0); seq < 30; seq++ {
		payloads[seq] = bm.payload(t)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		defer router.Close()
		for ctx.Err() == nil {
			msg, err := router.RecvMessageBytes(0)
			if err != nil || len(msg) != 3 || len(msg[2]) != 8 {
				continue
			}
			id, start := msg[0], binary.BigEndian.Uint64(msg[2])
			for seq := start; seq < 30; seq++ {
				_, _ = router.SendMessage(id, "", seqBytes(seq), payloads[seq])
			}
			_, _ = router.SendMessage(id, "", seqBytes(math.MaxUint64), "")
		}
	}()
	defer func() { cancel(); <-served }()

	ns := startNATS(t, natsembed.Options{})
	defer ns.Shutdown()
	col := collect(t, ns.ClientURL())
	eng := newEngine(t, ctx)
	cfg := baseConfig()
	cfg.ReplayEndpoint = replayEP
	r := startRelay(t, cfg, ns.ClientURL())
	if err := eng.pub.Dial(r.zmqEndpoint()); err != nil {
		t.Fatal(err)
	}
	eng.waitSubscribed(t)
	for seq := uint64(0); seq < 30; seq++ {
		eng.send(t, seq, payloads[seq], seq < 10 || seq >= 20)
	}
	checkRelayed(t, col.wait(t, 30), payloads, seqRange(0, 30))
	if got := value(r.m.gapsFilled); got != 1 {
		t.Fatalf("gaps_filled_total %v, want 1", got)
	}
}
