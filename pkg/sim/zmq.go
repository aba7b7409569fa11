package sim

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultBufferSteps is the replay ring's size when ZMQConfig leaves it
// zero: vLLM's default buffer_steps.
const DefaultBufferSteps = 10000

// ErrZMQ is wrapped by the errors of an engine's ZeroMQ output.
var ErrZMQ = errors.New("engine zeromq output")

// ZMQConfig is an engine's ZeroMQ output, as vLLM's --kv-events-config
// describes its publisher.
type ZMQConfig struct {
	// Endpoint is the PUB socket's endpoint. As vLLM does, the engine binds
	// it when it holds '*' or "::" or is ipc:// or inproc://, and dials it
	// otherwise (then the relay binds). Bind forces binding, for a test
	// that wants a loopback port of its own choosing.
	Endpoint string
	Bind     bool
	// ReplayEndpoint is the ROUTER socket serving the replay ring; it is
	// always bound. Empty means no replay.
	ReplayEndpoint string
	// Topic is the first frame of every message.
	Topic string
	// BufferSteps is how many recent batches the replay ring keeps
	// (default DefaultBufferSteps).
	BufferSteps int
}

// zmqOut is an engine's ZeroMQ publisher and replay service.
type zmqOut struct {
	topic  []byte
	router zmq4.Socket
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// pub is the PUB socket; nil while a dialling engine has no subscriber.
	pub zmq4.Socket
	// bound is the PUB socket's address when it binds.
	bound net.Addr
	// ring holds the last BufferSteps batches, oldest first from head.
	ring []ringEntry
	head int
	size int
}

type ringEntry struct {
	seq     uint64
	payload []byte
}

// replayEnd is the seq of the message that ends a replay.
const replayEnd = math.MaxUint64

// vllmBinds is vLLM's rule for whether a publisher endpoint is bound.
func vllmBinds(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// listenable turns vLLM's wildcard host into one the ZeroMQ library binds.
func listenable(ep string) string { return strings.Replace(ep, "://*:", "://0.0.0.0:", 1) }

func quietLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// StartZMQ opens the engine's ZeroMQ output: from then on every batch is
// also sent as vLLM's three frames [topic, seq (8 bytes, big-endian),
// payload], and kept in the replay ring. The sockets live until Close.
// An engine may publish over NATS, ZeroMQ, or both.
func (e *Engine) StartZMQ(cfg ZMQConfig) error {
	if cfg.Endpoint == "" {
		return fmt.Errorf("%w: no endpoint", ErrZMQ)
	}
	if cfg.BufferSteps <= 0 {
		cfg.BufferSteps = DefaultBufferSteps
	}
	ctx, cancel := context.WithCancel(context.Background())
	z := &zmqOut{topic: []byte(cfg.Topic), cancel: cancel, ring: make([]ringEntry, cfg.BufferSteps)}
	if cfg.Bind || vllmBinds(cfg.Endpoint) {
		pub := zmq4.NewPub(ctx, zmq4.WithLogger(quietLogger()))
		if err := pub.Listen(simEndpoint(listenable(cfg.Endpoint))); err != nil {
			_ = pub.Close()
			z.close()
			return fmt.Errorf("%w: bind %s: %w", ErrZMQ, cfg.Endpoint, err)
		}
		z.pub, z.bound = pub, pub.Addr()
	} else {
		z.wg.Add(1)
		go func() {
			defer z.wg.Done()
			z.dial(ctx, cfg.Endpoint)
		}()
	}
	if cfg.ReplayEndpoint != "" {
		z.router = zmq4.NewRouter(ctx, zmq4.WithLogger(quietLogger()))
		if err := z.router.Listen(simEndpoint(listenable(cfg.ReplayEndpoint))); err != nil {
			z.close()
			return fmt.Errorf("%w: bind replay %s: %w", ErrZMQ, cfg.ReplayEndpoint, err)
		}
		z.wg.Add(1)
		go func() {
			defer z.wg.Done()
			z.serveReplay(ctx)
		}()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.zmq != nil {
		z.close()
		return fmt.Errorf("%w: already started", ErrZMQ)
	}
	e.zmq = z
	return nil
}

// ZMQAddr is the PUB socket's bound address, nil when it dials.
func (e *Engine) ZMQAddr() net.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.zmq == nil {
		return nil
	}
	return e.zmq.bound
}

// ZMQSubscribed says whether a subscriber has subscribed to the engine's
// PUB socket, as the socket's own subscription list tells; a publisher
// drops every batch sent before that, as vLLM's does.
func (e *Engine) ZMQSubscribed() bool {
	e.mu.Lock()
	z := e.zmq
	e.mu.Unlock()
	if z == nil {
		return false
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	t, ok := z.pub.(zmq4.Topics)
	return ok && len(t.Topics()) > 0
}

// ReplayAddr is the replay socket's bound address, nil without one.
func (e *Engine) ReplayAddr() net.Addr {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.zmq == nil || e.zmq.router == nil {
		return nil
	}
	return e.zmq.router.Addr()
}

// Close stops the engine's ZeroMQ output, if any, and waits for its
// goroutines: the engine process ends, as far as its subscribers can tell.
func (e *Engine) Close() error {
	e.mu.Lock()
	z := e.zmq
	e.zmq = nil
	e.mu.Unlock()
	if z != nil {
		z.close()
	}
	return nil
}

func (z *zmqOut) close() {
	z.cancel()
	if z.router != nil {
		_ = z.router.Close()
	}
	z.wg.Wait()
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.pub != nil {
		_ = z.pub.Close()
		z.pub = nil
	}
}

// dial keeps a PUB socket connected to a subscriber that binds (a relay),
// until ctx ends. The ZeroMQ library's own reconnect does not reliably
// redial a subscriber that went away, so each connection gets a socket of
// its own, replaced when the connection dies; what is sent meanwhile is
// lost, as from a PUB with no subscriber, and shows as a seq gap.
func (z *zmqOut) dial(ctx context.Context, ep string) {
	for ctx.Err() == nil {
		died := make(chan struct{})
		sctx, cancel := context.WithCancel(context.WithValue(ctx, connDiedKey{}, died))
		pub := zmq4.NewPub(sctx, zmq4.WithLogger(quietLogger()),
			zmq4.WithDialerRetry(50*time.Millisecond), zmq4.WithDialerMaxRetries(-1))
		err := pub.Dial(simEndpoint(ep))
		if err == nil && !subscribed(ctx, pub) {
			// A subscriber that was closing as it accepted us leaves a
			// connection nobody reads or closes; one that subscribes to
			// nothing is no subscriber either.
			err = errNoSubscription
		}
		if err != nil {
			_ = pub.Close()
			cancel()
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			continue
		}
		z.mu.Lock()
		z.pub = pub
		z.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-died:
		}
		z.mu.Lock()
		if z.pub == pub {
			z.pub = nil
		}
		z.mu.Unlock()
		_ = pub.Close()
		cancel()
	}
}

// send publishes one batch and keeps it for replay. Called with the
// engine's lock held, so batches go out in seq order.
func (z *zmqOut) send(seq uint64, payload []byte) error {
	p := append([]byte(nil), payload...)
	z.mu.Lock()
	defer z.mu.Unlock()
	i := (z.head + z.size) % len(z.ring)
	if z.size == len(z.ring) {
		z.head = (z.head + 1) % len(z.ring)
	} else {
		z.size++
	}
	z.ring[i] = ringEntry{seq: seq, payload: p}
	if z.pub == nil {
		return nil // no subscriber: dropped, as by a PUB
	}
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	// PUB never blocks on an absent subscriber, and, like vLLM's, drops for
	// a slow one: the subscriber sees a gap in seq.
	if err := z.pub.SendMulti(zmq4.NewMsgFrom(z.topic, s[:], p)); err != nil {
		return fmt.Errorf("%w: send batch %d: %w", ErrZMQ, seq, err)
	}
	return nil
}

// serveReplay answers replay requests until ctx ends. A request is
// ["", start_seq (8 bytes, big-endian)] from a DEALER; the reply is every
// batch still in the ring from start_seq on, as ["", topic, seq, payload],
// then ["", topic, ff…ff, ""]. A start that has left the ring is no error:
// the reply starts at the oldest batch held.
func (z *zmqOut) serveReplay(ctx context.Context) {
	for {
		msg, err := z.router.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			continue
		}
		id, start, ok := parseReplayRequest(msg.Frames)
		if !ok {
			continue
		}
		for _, ent := range z.since(start) {
			var s [8]byte
			binary.BigEndian.PutUint64(s[:], ent.seq)
			if err := z.router.SendMulti(zmq4.NewMsgFrom(id, nil, z.topic, s[:], ent.payload)); err != nil {
				break
			}
		}
		end := [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		_ = z.router.SendMulti(zmq4.NewMsgFrom(id, nil, z.topic, end[:], nil))
	}
}

// parseReplayRequest reads a replay request as the ROUTER delivers it:
// [peer identity, "", start_seq (8 bytes, big-endian)]. Anything else is
// ignored, as vLLM ignores it.
func parseReplayRequest(f [][]byte) (id []byte, start uint64, ok bool) {
	if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
		return nil, 0, false
	}
	return f[0], binary.BigEndian.Uint64(f[2]), true
}

// since returns the ring's batches with seq >= start, oldest first.
func (z *zmqOut) since(start uint64) []ringEntry {
	z.mu.Lock()
	defer z.mu.Unlock()
	var out []ringEntry
	for k := 0; k < z.size; k++ {
		ent := z.ring[(z.head+k)%len(z.ring)]
		if ent.seq >= start && ent.seq != replayEnd {
			out = append(out, ent)
		}
	}
	return out
}

var errNoSubscription = errors.New("no subscription arrived")

// subscribeWait bounds the wait for a dialled subscriber's subscription.
const subscribeWait = time.Second

// subscribed waits until the socket's subscriber has subscribed to
// something.
func subscribed(ctx context.Context, pub zmq4.Socket) bool {
	t, ok := pub.(zmq4.Topics)
	if !ok {
		return true
	}
	deadline := time.Now().Add(subscribeWait)
	for len(t.Topics()) == 0 {
		if ctx.Err() != nil || time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}
