package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrMalformedFrame is wrapped by the errors parseFrame returns: a ZeroMQ
// message that is not one of vLLM's [topic, seq, payload] batches.
var ErrMalformedFrame = errors.New("malformed kv event message")

// engineMsg is one batch as the engine's publisher framed it.
type engineMsg struct {
	topic   []byte
	seq     uint64
	payload []byte
}

// parseFrame reads vLLM's three-frame message [topic, seq(8 bytes BE), payload].
func parseFrame(frames [][]byte) (engineMsg, error) {
	if len(frames) != 3 {
		return engineMsg{}, fmt.Errorf("%w: %d frames, want 3", ErrMalformedFrame, len(frames))
	}
	if len(frames[1]) != 8 {
		return engineMsg{}, fmt.Errorf("%w: seq frame of %d bytes, want 8", ErrMalformedFrame, len(frames[1]))
	}
	return engineMsg{topic: frames[0], seq: binary.BigEndian.Uint64(frames[1]), payload: frames[2]}, nil
}

// zmqRetry is how often a connecting socket redials an engine that is not
// (or no longer) listening.
const zmqRetry = 200 * time.Millisecond

// quietLogger keeps the ZeroMQ library's own logging, which reports every
// peer that goes away, out of the relay's structured log.
func quietLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// intake owns the SUB socket on the engine's publisher. In connect mode it
// makes a new socket whenever the engine goes away and dials again, rather
// than rely on the library's automatic reconnect, which races with Close.
type intake struct {
	endpoint, topic string
	bind            bool
	// sock is the bound socket in bind mode, made by open and closed by read.
	sock zmq4.Socket
	up   atomic.Bool
	// addr is the bound address in bind mode, for tests that bind port 0.
	addr atomic.Pointer[net.Addr]
}

func (in *intake) newSocket(ctx context.Context) (zmq4.Socket, error) {
	s := zmq4.NewSub(ctx,
		zmq4.WithLogger(quietLogger()),
		zmq4.WithDialerRetry(zmqRetry),
		zmq4.WithDialerMaxRetries(-1),
	)
	if err := s.SetOption(zmq4.OptionSubscribe, in.topic); err != nil {
		_ = s.Close()
		return nil, fmt.Errorf("subscribe to %q: %w", in.topic, err)
	}
	return s, nil
}

// open binds the socket in bind mode, so that a bad endpoint fails the
// start; in connect mode the dialling happens in read.
func (in *intake) open(ctx context.Context) error {
	if !in.bind {
		return nil
	}
	s, err := in.newSocket(ctx)
	if err != nil {
		return err
	}
	if err := s.Listen(guardEndpoint(in.endpoint)); err != nil {
		_ = s.Close()
		return fmt.Errorf("bind %s: %w", in.endpoint, err)
	}
	if a := s.Addr(); a != nil {
		in.addr.Store(&a)
	}
	in.sock = s
	in.up.Store(true)
	return nil
}

// delivery is one message from the engine. fresh marks the first on a new
// connection (connect mode) or the first after a peer left (bind mode):
// the process behind it may be another engine, even when its seq follows
// on from the last one relayed.
type delivery struct {
	frames [][]byte
	fresh  bool
}

// read hands every message to out until ctx ends, and closes its sockets.
func (in *intake) read(ctx context.Context, out chan<- delivery) {
	defer in.up.Store(false)
	if in.bind {
		defer in.sock.Close()
		in.recv(ctx, in.sock, out)
		return
	}
	for ctx.Err() == nil {
		s, err := in.newSocket(ctx)
		if err != nil {
			return
		}
		if err := s.Dial(guardEndpoint(in.endpoint)); err != nil {
			// The dialer retries a refused connection for ever, but gives
			// up on one whose ZMTP handshake fails: an engine that closes
			// as the relay redials (it is restarting) resets it. That is
			// one more reason to dial again, not the end of the intake.
			_ = s.Close()
			select {
			case <-ctx.Done():
				return
			case <-time.After(zmqRetry):
			}
			continue
		}
		in.up.Store(true)
		in.recv(ctx, s, out)
		in.up.Store(false)
		_ = s.Close()
	}
}

// recv reads one socket until ctx ends or, when dialling, until the engine
// goes away. A bound socket outlives its peers: an error from one that
// left is not the socket's end, but makes the next message fresh.
func (in *intake) recv(ctx context.Context, s zmq4.Socket, out chan<- delivery) {
	fresh := true
	for {
		msg, err := s.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			if !in.bind {
				return
			}
			fresh = true
			continue
		}
		if len(msg.Frames) == 0 {
			continue
		}
		select {
		case out <- delivery{frames: msg.Frames, fresh: fresh}:
			fresh = false
		case <-ctx.Done():
			return
		}
	}
}

// topicMatches applies the subscription on our side too: some publishers
// send everything to a subscriber whatever it asked for.
func topicMatches(topic []byte, want string) bool {
	return strings.HasPrefix(string(topic), want)
}
