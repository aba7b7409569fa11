package relay

import (
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
)

// ReplySnapshot answers one snapshot request from m, as docs/snapshot.md
// describes: the mirror's snapshot as chunks on req.Reply, or a refusal
// when the mirror has applied nothing yet (then it returns ErrNoSnapshot).
// base gives the chunks' endpoint, pod and model; the instance, seq, rank
// and block size are the mirror's position. A request without a reply
// subject is ignored. The relay serves its requests with it, and so does
// any publisher that keeps a mirror of what it publishes (the simulator's
// engines).
func ReplySnapshot(nc *nats.Conn, req *nats.Msg, m *Mirror, base events.Origin, chunkBytes int) error {
	if req.Reply == "" {
		return nil
	}
	s, err := m.Snapshot(chunkBytes)
	if err != nil {
		h := nats.Header{}
		h.Set(events.HeaderSnapshotError, err.Error())
		if perr := nc.PublishMsg(&nats.Msg{Subject: req.Reply, Header: h}); perr != nil {
			return fmt.Errorf("snapshot refusal: %w", perr)
		}
		return err
	}
	p := s.Position
	o := base
	o.DPRank, o.Instance, o.BlockSize, o.Seq = p.DPRank, p.Instance, p.BlockSize, p.Seq
	n := strconv.Itoa(len(s.Chunks))
	for i, c := range s.Chunks {
		h := o.Header()
		h.Set(events.HeaderSnapshotChunk, strconv.Itoa(i))
		h.Set(events.HeaderSnapshotChunks, n)
		h.Set(events.HeaderSnapshotExact, strconv.FormatBool(p.Exact))
		h.Set(events.HeaderSnapshotState, p.SnapshotState())
		if err := nc.PublishMsg(&nats.Msg{Subject: req.Reply, Header: h, Data: c}); err != nil {
			return fmt.Errorf("snapshot reply cut short at chunk %d of %d: %w", i, len(s.Chunks), err)
		}
	}
	return nil
}
