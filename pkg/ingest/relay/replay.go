package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-zeromq/zmq4"
)

// ErrReplay is wrapped by the errors a replay returns.
var ErrReplay = errors.New("replay")

// maxReplayBatches bounds what one replay collects, whatever seq claims:
// vLLM's replay buffer holds 10000 steps by default.
const maxReplayBatches = 1 << 16

// replayEnd is the seq of the message that ends a replay.
const replayEnd = math.MaxUint64

// replayed is one batch recovered from the engine's replay socket.
type replayed struct {
	seq     uint64
	payload []byte
}

// replayer asks the engine's replay socket (a ROUTER over a ring of recent
// batches) for the batches a gap skipped.
type replayer struct {
	endpoint string
	timeout  time.Duration
}

// fetch returns the batches with from <= seq < to that the engine still
// holds, in the order it sent them. It asks for everything from `from` and
// stops at the end marker, at the first batch at or past `to`, or when the
// timeout ends; what it has by then is returned with the error, if any. A
// fresh DEALER per request keeps a late reply to an abandoned request from
// being taken for the answer to the next one.
func (r *replayer) fetch(ctx context.Context, from, to uint64) ([]replayed, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	d := zmq4.NewDealer(ctx,
		zmq4.WithLogger(quietLogger()),
		zmq4.WithDialerRetry(50*time.Millisecond),
		zmq4.WithDialerMaxRetries(-1),
		zmq4.WithTimeout(r.timeout),
	)
	defer d.Close()
	if err := d.Dial(guardEndpoint(r.endpoint)); err != nil {
		return nil, fmt.Errorf("%w: dial %s: %w", ErrReplay, r.endpoint, err)
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], from)
	if err := d.SendMulti(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return nil, fmt.Errorf("%w: request from %d: %w", ErrReplay, from, err)
	}
	var out []replayed
	for len(out) < maxReplayBatches {
		msg, err := d.Recv()
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return out, fmt.Errorf("%w: from %d: %w", ErrReplay, from, err)
		}
		seq, payload, err := parseReplay(msg.Frames)
		if err != nil {
			return out, fmt.Errorf("%w: from %d: %w", ErrReplay, from, err)
		}
		switch {
		case seq == replayEnd:
			return out, nil
		case seq < from:
			continue
		case seq >= to:
			return out, nil
		}
		out = append(out, replayed{seq: seq, payload: payload})
	}
	return out, nil
}

// parseReplay reads one reply: ["", seq, payload] or, from newer vLLM,
// ["", topic, seq, payload].
func parseReplay(frames [][]byte) (uint64, []byte, error) {
	if len(frames) < 3 || len(frames) > 4 || len(frames[0]) != 0 {
		return 0, nil, fmt.Errorf("%w: reply of %d frames, want [\"\", (topic,) seq, payload]", ErrMalformedFrame, len(frames))
	}
	seq, payload := frames[len(frames)-2], frames[len(frames)-1]
	if len(seq) != 8 {
		return 0, nil, fmt.Errorf("%w: replay seq frame of %d bytes, want 8", ErrMalformedFrame, len(seq))
	}
	return binary.BigEndian.Uint64(seq), payload, nil
}
