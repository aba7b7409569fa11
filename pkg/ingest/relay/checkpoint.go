package relay

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

// The relay's state survives the relay (docs/snapshot.md, "A relay that
// restarts"): in StateDir, a checkpoint of the mirror, written every
// CheckpointInterval, and a journal of what happened to it since, appended
// batch by batch. A restarted relay rebuilds its mirror from them exactly
// as it stood at its last batch, and keeps the engine's Kv-Instance, so
// that the EPP sees a restart of the relay as what it is: at most a gap.
//
// Files, all in StateDir:
//
//	checkpoint          the last complete checkpoint (replaced by rename)
//	checkpoint.tmp      one being written
//	journal-<gen>       what happened after checkpoint generation gen-1
//
// A checkpoint is "KVRCKPT1", a length-prefixed JSON header (the mirror's
// Position, the digest of the last batch, the journal generation it
// covers, the relay's identity), the mirror's snapshot chunks (vLLM
// batches, as snapshot replies carry them), each length-prefixed, and a
// CRC-32C of everything before it. A journal is a sequence of records:
// kind (1 byte), length (4 bytes), body, CRC-32C of kind, length and body.
// A batch record's body is seq (8), block size (4), rank (4) and the
// payload as the engine sent it; a position record's body is the JSON of a
// Position and whether it reset the mirror. Integers are big-endian.
// Reading stops at the first record that is torn or does not check.

const (
	checkpointFile  = "checkpoint"
	checkpointMagic = "KVRCKPT1"
	journalPrefix   = "journal-"

	recBatch    = 1
	recPosition = 2

	// maxRecord bounds one journal record (a batch past the relay's own
	// bounds is not journalled but makes the journal incomplete).
	maxRecord = 64 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrState is wrapped by the errors of reading and writing the relay's
// persisted state.
var ErrState = errors.New("relay state")

// checkpointHeader is the JSON header of a checkpoint.
type checkpointHeader struct {
	Version  int    `json:"version"`
	Endpoint string `json:"endpoint"`
	Pod      string `json:"pod"`
	// Journal is the journal generation the checkpoint covers: replay
	// journal-(Journal+1) and later on top of it.
	Journal  uint64    `json:"journal"`
	Position Position  `json:"position"`
	Digest   uint64    `json:"lastDigest"`
	Written  time.Time `json:"written"`
	Chunks   int       `json:"chunks"`
}

// positionRecord is a journal position record's body.
type positionRecord struct {
	Reset    bool     `json:"reset"`
	Position Position `json:"position"`
}

// restored is what a relay read back from its state directory.
type restored struct {
	pos    Position
	digest uint64
	// journal is the last journal generation read.
	journal uint64
	// records is how many journal records were replayed.
	records int
}

// encodeCheckpoint writes a checkpoint of the mirror state described by
// blocks (as captured) to w.
func encodeCheckpoint(w io.Writer, h checkpointHeader, blocks []snapBlock, chunkBytes int) (int64, error) {
	chunks, err := encodeSnapshot(h.Position, blocks, chunkBytes)
	if err != nil {
		return 0, err
	}
	h.Version, h.Chunks = 1, len(chunks)
	hdr, err := json.Marshal(h)
	if err != nil {
		return 0, fmt.Errorf("%w: checkpoint header: %w", ErrState, err)
	}
	crc := crc32.New(castagnoli)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<16)
	var n int64
	write := func(b []byte) {
		if err == nil {
			var k int
			k, err = bw.Write(b)
			n += int64(k)
		}
	}
	var u32 [4]byte
	write([]byte(checkpointMagic))
	binary.BigEndian.PutUint32(u32[:], uint32(len(hdr)))
	write(u32[:])
	write(hdr)
	binary.BigEndian.PutUint32(u32[:], uint32(len(chunks)))
	write(u32[:])
	for _, c := range chunks {
		binary.BigEndian.PutUint32(u32[:], uint32(len(c)))
		write(u32[:])
		write(c)
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return n, fmt.Errorf("%w: write checkpoint: %w", ErrState, err)
	}
	binary.BigEndian.PutUint32(u32[:], crc.Sum32())
	k, err := w.Write(u32[:])
	n += int64(k)
	if err != nil {
		return n, fmt.Errorf("%w: write checkpoint: %w", ErrState, err)
	}
	return n, nil
}

// decodeCheckpoint reads a checkpoint. Every error wraps ErrState; nothing
// in data can make it allocate more than a small multiple of len(data).
func decodeCheckpoint(data []byte) (checkpointHeader, []*events.Batch, error) {
	var h checkpointHeader
	bad := func(format string, a ...any) (checkpointHeader, []*events.Batch, error) {
		return h, nil, fmt.Errorf("%w: checkpoint: %s", ErrState, fmt.Sprintf(format, a...))
	}
	if len(data) < len(checkpointMagic)+12 || string(data[:len(checkpointMagic)]) != checkpointMagic {
		return bad("not a checkpoint (%d bytes)", len(data))
	}
	body, sum := data[:len(data)-4], binary.BigEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return bad("checksum mismatch")
	}
	r := body[len(checkpointMagic):]
	next := func() ([]byte, bool) {
		if len(r) < 4 {
			return nil, false
		}
		n := binary.BigEndian.Uint32(r)
		if uint64(n) > uint64(len(r)-4) {
			return nil, false
		}
		b := r[4 : 4+n]
		r = r[4+n:]
		return b, true
	}
	hdr, ok := next()
	if !ok {
		return bad("truncated header")
	}
	if err := json.Unmarshal(hdr, &h); err != nil {
		return bad("header: %v", err)
	}
	if h.Version != 1 {
		return bad("version %d, want 1", h.Version)
	}
	if len(r) < 4 {
		return bad("truncated chunk count")
	}
	n := binary.BigEndian.Uint32(r)
	r = r[4:]
	if n > uint32(len(r)/4) || int(n) != h.Chunks {
		return bad("%d chunks announced, header says %d, %d bytes left", n, h.Chunks, len(r))
	}
	chunks := make([]*events.Batch, 0, n)
	for i := range int(n) {
		c, ok := next()
		if !ok {
			return bad("chunk %d truncated", i)
		}
		b, err := events.Decode(c)
		if err != nil {
			return bad("chunk %d: %v", i, err)
		}
		chunks = append(chunks, b)
	}
	if len(r) != 0 {
		return bad("%d bytes after the last chunk", len(r))
	}
	return h, chunks, nil
}

// appendRecord appends one journal record to dst.
func appendRecord(dst []byte, kind byte, body ...[]byte) []byte {
	n := 0
	for _, b := range body {
		n += len(b)
	}
	start := len(dst)
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	for _, b := range body {
		dst = append(dst, b...)
	}
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

// batchRecordHead is a batch record's body before the payload.
func batchRecordHead(seq uint64, blockSize, dpRank int) []byte {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], seq)
	binary.BigEndian.PutUint32(b[8:12], uint32(blockSize))
	binary.BigEndian.PutUint32(b[12:16], uint32(dpRank))
	return b[:]
}

// journalRecord is one record read back.
type journalRecord struct {
	kind byte
	// batch records
	seq               uint64
	blockSize, dpRank int
	payload           []byte
	// position records
	pos positionRecord
}

// readJournal returns the well-formed records at the start of data, and
// whether it stopped early at one that was torn or corrupt (the tail a
// relay that died mid-write leaves).
func readJournal(data []byte) (recs []journalRecord, torn bool) {
	for len(data) > 0 {
		if len(data) < 9 {
			return recs, true
		}
		kind, n := data[0], binary.BigEndian.Uint32(data[1:5])
		if n > maxRecord || uint64(n)+9 > uint64(len(data)) {
			return recs, true
		}
		body := data[5 : 5+n]
		if crc32.Checksum(data[:5+n], castagnoli) != binary.BigEndian.Uint32(data[5+n:9+n]) {
			return recs, true
		}
		data = data[9+n:]
		rec := journalRecord{kind: kind}
		switch kind {
		case recBatch:
			if len(body) < 16 {
				return recs, true
			}
			bs, rank := binary.BigEndian.Uint32(body[8:12]), binary.BigEndian.Uint32(body[12:16])
			if bs > 1<<20 || rank > 1<<20 {
				return recs, true
			}
			rec.seq, rec.blockSize, rec.dpRank = binary.BigEndian.Uint64(body[:8]), int(bs), int(rank)
			rec.payload = body[16:]
		case recPosition:
			if err := json.Unmarshal(body, &rec.pos); err != nil {
				return recs, true
			}
		default:
			return recs, true
		}
		recs = append(recs, rec)
	}
	return recs, false
}

// journalGens lists the journal generations in dir, oldest first.
func journalGens(dir string) ([]uint64, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrState, err)
	}
	var gens []uint64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, journalPrefix) || e.IsDir() {
			continue
		}
		if g, err := strconv.ParseUint(strings.TrimPrefix(name, journalPrefix), 10, 64); err == nil {
			gens = append(gens, g)
		}
	}
	slices.Sort(gens)
	return gens, nil
}

func journalPath(dir string, gen uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%020d", journalPrefix, gen))
}

// readBounded reads a whole file of at most limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > limit {
		return nil, fmt.Errorf("%w: %s is %d bytes, over the %d-byte bound", ErrState, path, fi.Size(), limit)
	}
	var buf bytes.Buffer
	buf.Grow(int(fi.Size()))
	if _, err := io.Copy(&buf, io.LimitReader(f, limit+1)); err != nil {
		return nil, err
	}
	if int64(buf.Len()) > limit {
		return nil, fmt.Errorf("%w: %s grew past the %d-byte bound", ErrState, path, limit)
	}
	return buf.Bytes(), nil
}

// writeFileAtomic writes data produced by fill to path through a temporary
// file, synced and renamed into place, so that a crash leaves either the
// old file or the new one.
func writeFileAtomic(path string, fill func(io.Writer) (int64, error)) (int64, error) {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrState, err)
	}
	n, err := fill(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return n, fmt.Errorf("%w: %w", ErrState, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return n, nil
}
