package recovery

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
)

// Errors a snapshot request ends with; the resync's result label names
// them too.
var (
	// ErrNoResponders: no relay serves the pod's snapshot subject.
	ErrNoResponders = errors.New("no relay answers snapshot requests")
	// ErrRefused: the relay answered with Kv-Snapshot-Error (it has
	// relayed no batch yet).
	ErrRefused = errors.New("snapshot refused")
	// ErrTimeout: the snapshot's chunks did not all arrive in time.
	ErrTimeout = errors.New("snapshot timed out")
	// ErrInvalid: a chunk broke the protocol (headers, order, payload).
	ErrInvalid = errors.New("invalid snapshot")
	// ErrTooLarge: the snapshot exceeds Options.MaxSnapshotBytes.
	ErrTooLarge = errors.New("snapshot too large")
)

// maxChunks bounds the chunk count a relay may announce, whatever the byte
// bound allows, so that a hostile header cannot size a large slice.
const maxChunks = 1 << 16

// snapshot is one complete, checked snapshot.
type snapshot struct {
	origin events.Origin
	// state is what the relay says the snapshot knows: events.SnapshotExact,
	// SnapshotPartial or SnapshotInexact.
	state  string
	chunks []*events.Batch
	bytes  int
	blocks int
}

// fetch requests the snapshot of the stream s from the relay of pod and
// collects its chunks (docs/snapshot.md). The reply is several messages, so
// it subscribes to a fresh inbox before publishing the request.
func (r *Recovery) fetch(ctx context.Context, pod string, s events.Stream) (*snapshot, error) {
	subj := events.SnapshotSubject(r.opts.Namespace, r.opts.Pool, pod)
	inbox := r.nc.NewRespInbox()
	sub, err := r.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s: subscribe: %w", subj, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The client must hold a whole snapshot while it is read, so its
	// pending bounds follow ours rather than the client's defaults.
	if err := sub.SetPendingLimits(maxChunks, r.opts.MaxSnapshotBytes+(1<<20)); err != nil {
		return nil, fmt.Errorf("snapshot %s: pending limits: %w", subj, err)
	}
	if err := r.nc.PublishRequest(subj, inbox, nil); err != nil {
		return nil, fmt.Errorf("snapshot %s: request: %w", subj, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()

	a := assembly{stream: s, maxBytes: r.opts.MaxSnapshotBytes}
	for {
		m, err := sub.NextMsgWithContext(ctx)
		switch {
		case errors.Is(err, nats.ErrNoResponders), err == nil && isNoResponders(m):
			return nil, fmt.Errorf("snapshot %s: %w", subj, ErrNoResponders)
		case err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), context.DeadlineExceeded):
			return nil, fmt.Errorf("snapshot %s: %w after %s (%d of %d chunks)", subj, ErrTimeout, r.opts.Timeout, a.got(), a.want)
		case err != nil:
			return nil, fmt.Errorf("snapshot %s: %w", subj, err)
		}
		done, err := a.add(m)
		if err != nil {
			return nil, fmt.Errorf("snapshot %s: %w", subj, err)
		}
		if done {
			return a.snap, nil
		}
	}
}

// assembly collects one snapshot's reply messages, checking each as it
// comes: the snapshot wire format (docs/snapshot.md), read from the network.
type assembly struct {
	stream   events.Stream
	maxBytes int
	snap     *snapshot
	want     int
}

func (a *assembly) got() int {
	if a.snap == nil {
		return 0
	}
	return len(a.snap.chunks)
}

// add checks and decodes one reply; done says the snapshot is complete.
func (a *assembly) add(m *nats.Msg) (done bool, err error) {
	if reason := m.Header.Get(events.HeaderSnapshotError); reason != "" {
		return false, fmt.Errorf("%w: %s", ErrRefused, reason)
	}
	c, err := parseChunk(m)
	if err != nil {
		return false, err
	}
	if c.origin.Stream != a.stream {
		return false, fmt.Errorf("%w: chunk describes %s, want %s", ErrInvalid, c.origin.Stream, a.stream)
	}
	if a.snap == nil {
		a.snap = &snapshot{origin: c.origin, state: c.state, chunks: make([]*events.Batch, 0, min(c.total, 64))}
		a.want = c.total
	} else if c.origin.Instance != a.snap.origin.Instance || c.origin.Seq != a.snap.origin.Seq || c.total != a.want || c.state != a.snap.state {
		return false, fmt.Errorf("%w: chunk %d disagrees with chunk 0 on instance, seq, count or exactness", ErrInvalid, c.index)
	}
	if c.index != len(a.snap.chunks) {
		return false, fmt.Errorf("%w: chunk %d where %d was due", ErrInvalid, c.index, len(a.snap.chunks))
	}
	if a.snap.bytes += len(m.Data); a.snap.bytes > a.maxBytes {
		return false, fmt.Errorf("%w: over %d bytes", ErrTooLarge, a.maxBytes)
	}
	b, err := events.Decode(m.Data)
	if err != nil {
		return false, fmt.Errorf("chunk %d: %w: %w", c.index, ErrInvalid, err)
	}
	a.snap.blocks += b.Blocks()
	a.snap.chunks = append(a.snap.chunks, b)
	return len(a.snap.chunks) == a.want, nil
}

// isNoResponders recognises the server's status reply to a request nobody
// is subscribed for.
func isNoResponders(m *nats.Msg) bool {
	return m != nil && len(m.Data) == 0 && m.Header.Get("Status") == "503"
}

// chunk is what a reply message's headers say about it.
type chunk struct {
	origin       events.Origin
	index, total int
	state        string
}

// parseChunk reads a snapshot chunk's headers. Every error wraps ErrInvalid.
func parseChunk(m *nats.Msg) (chunk, error) {
	var c chunk
	o, err := events.ParseOrigin(m.Header)
	if err != nil {
		return c, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	c.origin = o
	total, err := strconv.Atoi(m.Header.Get(events.HeaderSnapshotChunks))
	if err != nil || total < 1 || total > maxChunks {
		return c, fmt.Errorf("%w: %s %q is not a count in 1..%d", ErrInvalid, events.HeaderSnapshotChunks, m.Header.Get(events.HeaderSnapshotChunks), maxChunks)
	}
	index, err := strconv.Atoi(m.Header.Get(events.HeaderSnapshotChunk))
	if err != nil || index < 0 || index >= total {
		return c, fmt.Errorf("%w: %s %q is not an index below %d", ErrInvalid, events.HeaderSnapshotChunk, m.Header.Get(events.HeaderSnapshotChunk), total)
	}
	exact, err := strconv.ParseBool(m.Header.Get(events.HeaderSnapshotExact))
	if err != nil {
		return c, fmt.Errorf("%w: %s %q is not a bool", ErrInvalid, events.HeaderSnapshotExact, m.Header.Get(events.HeaderSnapshotExact))
	}
	c.index, c.total = index, total
	// Kv-Snapshot-State refines Kv-Snapshot-Exact; a relay that does not
	// send it says exact or inexact by the older header alone.
	switch st := m.Header.Get(events.HeaderSnapshotState); {
	case st == "" && exact:
		c.state = events.SnapshotExact
	case st == "":
		c.state = events.SnapshotInexact
	case st == events.SnapshotExact && exact, st == events.SnapshotPartial && !exact, st == events.SnapshotInexact && !exact:
		c.state = st
	default:
		return c, fmt.Errorf("%w: %s %q does not agree with %s %t", ErrInvalid, events.HeaderSnapshotState, st, events.HeaderSnapshotExact, exact)
	}
	return c, nil
}
