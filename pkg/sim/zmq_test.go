package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

const zmqTopic = "kv@10.0.0.7:8000@llama"

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func zmqEngine(t *testing.T, cfg ZMQConfig) *Engine {
	t.Helper()
	e := NewEngine(EngineConfig{Pod: "vllm-0", Address: "10.0.0.7:8000", Model: "llama",
		Pool: blockpool.Config{BlockSize: 4, GPUBlocks: 32, Seed: 1}}, nil)
	if err := e.StartZMQ(cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func serveN(t *testing.T, e *Engine, n int) {
	t.Helper()
	for i := range n {
		toks := make([]uint32, 12)
		for j := range toks {
			toks[j] = uint32(i*100 + j)
		}
		if _, err := e.Serve(blockpool.Request{Tokens: toks}); err != nil {
			t.Fatal(err)
		}
	}
}

// recvBatch reads one published message and checks vLLM's framing.
func recvBatch(s zmq4.Socket) (uint64, *events.Batch, error) {
	msg, err := s.Recv()
	if err != nil {
		return 0, nil, err
	}
	if len(msg.Frames) != 3 || string(msg.Frames[0]) != zmqTopic || len(msg.Frames[1]) != 8 {
		return 0, nil, fmt.Errorf("message frames %q, want [topic, 8-byte seq, payload]", msg.Frames)
	}
	b, err := events.Decode(msg.Frames[2])
	if err != nil {
		return 0, nil, fmt.Errorf("payload: %w", err)
	}
	return binary.BigEndian.Uint64(msg.Frames[1]), b, nil
}

// firstBatch publishes until a batch reaches sub (a PUB drops what it sends
// before the subscription reaches it) and returns its seq.
func firstBatch(t *testing.T, ctx context.Context, e *Engine, sub zmq4.Socket) uint64 {
	t.Helper()
	type result struct {
		seq uint64
		err error
	}
	got := make(chan result, 1)
	go func() {
		seq, _, err := recvBatch(sub)
		got <- result{seq, err}
	}()
	for {
		serveN(t, e, 1)
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatal(r.err)
			}
			return r.seq
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			t.Fatal("no batch arrived")
		}
	}
}

func TestZMQPublishesVLLMFramesInSeqOrder(t *testing.T) {
	for _, mode := range []string{"engine binds", "engine dials"} {
		t.Run(mode, func(t *testing.T) {
			port := freePort(t)
			ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(20*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
			defer sub.Close()
			if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
				t.Fatal(err)
			}
			var e *Engine
			if mode == "engine binds" {
				e = zmqEngine(t, ZMQConfig{Endpoint: ep, Bind: true, Topic: zmqTopic})
				if err := sub.Dial(ep); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := sub.Listen(ep); err != nil {
					t.Fatal(err)
				}
				e = zmqEngine(t, ZMQConfig{Endpoint: ep, Topic: zmqTopic})
			}
			first := firstBatch(t, ctx, e, sub)
			serveN(t, e, 3)
			for want := first + 1; want < first+4; want++ {
				seq, b, err := recvBatch(sub)
				if err != nil {
					t.Fatal(err)
				}
				if seq != want || len(b.Events) == 0 {
					t.Fatalf("seq %d with %d events, want seq %d with events", seq, len(b.Events), want)
				}
			}
		})
	}
}

func replay(t *testing.T, ep string, start uint64) (seqs []uint64, topicFrames bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(ep); err != nil {
		t.Fatal(err)
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], start)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, s[:])); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatal(err)
		}
		f := msg.Frames
		if len(f) != 4 || len(f[0]) != 0 || string(f[1]) != zmqTopic || len(f[2]) != 8 {
			t.Fatalf("reply frames %q, want [\"\", topic, seq, payload]", f)
		}
		seq := binary.BigEndian.Uint64(f[2])
		if seq == replayEnd {
			if len(f[3]) != 0 {
				t.Fatal("end marker with a payload")
			}
			return seqs, true
		}
		if _, err := events.Decode(f[3]); err != nil {
			t.Fatalf("replayed seq %d: %v", seq, err)
		}
		seqs = append(seqs, seq)
	}
}

func TestZMQReplayServesTheRingFromTheAskedSeq(t *testing.T) {
	rport := freePort(t)
	rep := fmt.Sprintf("tcp://127.0.0.1:%d", rport)
	e := zmqEngine(t, ZMQConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t)), Bind: true,
		ReplayEndpoint: rep, Topic: zmqTopic, BufferSteps: 5})
	serveN(t, e, 8) // a batch each, seq 0..7; the ring keeps 3..7
	tests := []struct {
		name  string
		start uint64
		want  []uint64
	}{
		{"a start inside the ring replays from it", 5, []uint64{5, 6, 7}},
		{"a start that left the ring replays from the oldest held", 0, []uint64{3, 4, 5, 6, 7}},
		{"a start past the newest replays nothing", 8, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := replay(t, rep, tt.start)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("replayed %v, want %v", got, tt.want)
			}
		})
	}
}

func TestVLLMBindRule(t *testing.T) {
	t.Parallel()
	for ep, want := range map[string]bool{
		"tcp://*:5557":          true,
		"tcp://[::]:5557":       true,
		"ipc:///tmp/kv":         true,
		"inproc://kv":           true,
		"tcp://127.0.0.1:5557":  false,
		"tcp://relay-host:5557": false,
	} {
		if got := vllmBinds(ep); got != want {
			t.Errorf("vllmBinds(%q) = %v, want %v", ep, got, want)
		}
	}
}

func TestCloseEndsTheZMQOutput(t *testing.T) {
	port := freePort(t)
	e := zmqEngine(t, ZMQConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Bind: true})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// The port is free again: a restarted engine binds it.
	e2 := zmqEngine(t, ZMQConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port), Bind: true})
	serveN(t, e2, 1)
	if err := e.StartZMQ(ZMQConfig{}); err == nil {
		t.Error("StartZMQ without an endpoint succeeded")
	}
}

// The engine dials when its endpoint names a host (a relay that binds);
// the subscriber restarting, as a relay does, must not cut it off.
func TestZMQDialingEngineReachesARestartedSubscriber(t *testing.T) {
	port := freePort(t)
	ep := fmt.Sprintf("tcp://127.0.0.1:%d", port)
	e := zmqEngine(t, ZMQConfig{Endpoint: ep, Topic: zmqTopic})
	for range 2 { // the subscriber restarts between rounds
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		sub := zmq4.NewSub(ctx)
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			t.Fatal(err)
		}
		if err := sub.Listen(ep); err != nil {
			t.Fatal(err)
		}
		firstBatch(t, ctx, e, sub)
		_ = sub.Close()
		cancel()
	}
}

// FuzzReplayRequest feeds the replay socket's parser what a peer may send.
func FuzzReplayRequest(f *testing.F) {
	f.Add([]byte("peer"), []byte{}, []byte{0, 0, 0, 0, 0, 0, 0, 5}, false)
	f.Add([]byte{}, []byte{1}, []byte{1, 2, 3}, true)
	f.Add([]byte("peer"), []byte{}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, true)
	f.Fuzz(func(t *testing.T, id, empty, start []byte, extra bool) {
		frames := [][]byte{id, empty, start}
		if extra {
			frames = append(frames, nil)
		}
		gotID, seq, ok := parseReplayRequest(frames)
		want := !extra && len(empty) == 0 && len(start) == 8
		if ok != want {
			t.Fatalf("ok = %v for frames %q", ok, frames)
		}
		if ok && (string(gotID) != string(id) || seq != binary.BigEndian.Uint64(start)) {
			t.Fatalf("parsed id %q seq %d from %q", gotID, seq, frames)
		}
	})
}

// A bound socket's listener closes, with itself, every connection it
// accepted, also one the ZeroMQ library has not yet taken over (still in
// its handshake): an engine that exits leaves no connection open behind it.
func TestAClosedEngineListenerLeavesNoConnectionOpen(t *testing.T) {
	l, err := simTransport{tcp: transport.New("tcp")}.Listen(context.Background(), "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := l.Accept(); err != nil {
		t.Fatal(err)
	}
	// Nobody closes the accepted connection: the library's accept loop
	// would only have added it to the socket after its handshake.
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the client's connection is still open after the engine's listener closed: %v", err)
	}
}
