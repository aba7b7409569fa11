package share

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/kvroute/kvroute/pkg/datalayer"
)

// The wire format, msgpack throughout:
//
//	message: [version, replica, seq, now, flags, [endpoint...], [entry...]]
//	sent:    [1, id, endpoint index, at, prefill, prompt, outputs, prefillFor, perToken, end, first]
//	first:   [2, id, at, end]
//	done:    [3, id, at]
//	failed:  [4, id]
//
// replica is the sender's random id, seq its message counter (1, 2, …),
// now its clock (Unix ns) when it sent. Every time in an entry (at, end,
// first) is in microseconds from now, nil when unknown, so that small
// offsets take a byte or three. prefillFor and perToken are microseconds.
// A sync message (flags&flagSync) lists the sender's whole in-flight set
// as sent entries, with first set on those decoding; flagComplete says
// the list holds all of it, so that a receiver may drop the sender's
// entries it lacks.

// Version is the wire format's version, the message's first element.
const Version = 1

const (
	flagSync     = 1
	flagComplete = 2
)

// Bounds on what a message may hold: a decoder rejects more before it
// allocates for it.
const (
	// MaxEntries bounds a message's entries.
	MaxEntries = 8192
	// MaxEndpoints bounds a message's endpoint table.
	MaxEndpoints = 4096
	maxName      = 512
	maxTokens    = 1 << 24
	// maxOffset bounds a time's distance from the message's clock: a
	// week, far past any dispatch's life.
	maxOffset = int64(7 * 24 * time.Hour / time.Microsecond)
	// maxDuration bounds prefillFor and perToken.
	maxDuration = int64(time.Hour / time.Microsecond)
)

// ErrBadMessage wraps every decoding error.
var ErrBadMessage = errors.New("bad dispatch-share message")

// Message is one message of a replica's.
type Message struct {
	Replica, Seq uint64
	// Now is the sender's clock when it sent, Unix ns.
	Now int64
	// Sync: Entries are the sender's whole in-flight set (Complete) or
	// the first MaxEntries of it.
	Sync, Complete bool
	Entries        []Entry
}

// Entry is one step of one dispatch; its times are the sender's Unix ns
// (zero: unknown).
type Entry struct {
	Kind     datalayer.NoteKind
	ID       uint64
	Endpoint string
	At       int64
	// First is when a sync's decoding entry had its first token.
	First, End               int64
	Prefill, Prompt, Outputs int
	PrefillFor, PerToken     time.Duration
}

// Encode appends m's encoding to buf's contents.
func Encode(buf *bytes.Buffer, m *Message) error {
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	var flags uint64
	if m.Sync {
		flags |= flagSync
	}
	if m.Complete {
		flags |= flagComplete
	}
	// The endpoint table: each name once, in order of first use.
	var names []string
	index := make(map[string]int, 8)
	for i := range m.Entries {
		if m.Entries[i].Kind != datalayer.NoteSent {
			continue
		}
		if _, ok := index[m.Entries[i].Endpoint]; !ok {
			index[m.Entries[i].Endpoint] = len(names)
			names = append(names, m.Entries[i].Endpoint)
		}
	}
	if len(m.Entries) > MaxEntries || len(names) > MaxEndpoints {
		return fmt.Errorf("share: a message of %d entries on %d endpoints is over the bounds", len(m.Entries), len(names))
	}
	errs := []error{
		enc.EncodeArrayLen(7), enc.EncodeUint(Version), enc.EncodeUint(m.Replica), enc.EncodeUint(m.Seq),
		enc.EncodeInt(m.Now), enc.EncodeUint(flags), enc.EncodeArrayLen(len(names)),
	}
	for _, n := range names {
		errs = append(errs, enc.EncodeString(n))
	}
	errs = append(errs, enc.EncodeArrayLen(len(m.Entries)))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	at := func(t int64) error {
		if t == 0 {
			return enc.EncodeNil()
		}
		return enc.EncodeInt(max(min((t-m.Now)/int64(time.Microsecond), maxOffset), -maxOffset))
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		var err error
		switch e.Kind {
		case datalayer.NoteSent:
			err = errors.Join(enc.EncodeArrayLen(11), enc.EncodeUint(uint64(e.Kind)), enc.EncodeUint(e.ID),
				enc.EncodeUint(uint64(index[e.Endpoint])), at(e.At),
				enc.EncodeUint(uint64(min(max(e.Prefill, 0), maxTokens))), enc.EncodeUint(uint64(min(max(e.Prompt, 0), maxTokens))),
				enc.EncodeUint(uint64(min(max(e.Outputs, 0), maxTokens))),
				enc.EncodeUint(uint64(min(max(int64(e.PrefillFor/time.Microsecond), 0), maxDuration))),
				enc.EncodeUint(uint64(min(max(int64(e.PerToken/time.Microsecond), 0), maxDuration))),
				at(e.End), at(e.First))
		case datalayer.NoteFirst:
			err = errors.Join(enc.EncodeArrayLen(4), enc.EncodeUint(uint64(e.Kind)), enc.EncodeUint(e.ID), at(e.At), at(e.End))
		case datalayer.NoteDone:
			err = errors.Join(enc.EncodeArrayLen(3), enc.EncodeUint(uint64(e.Kind)), enc.EncodeUint(e.ID), at(e.At))
		case datalayer.NoteFailed:
			err = errors.Join(enc.EncodeArrayLen(2), enc.EncodeUint(uint64(e.Kind)), enc.EncodeUint(e.ID))
		default:
			err = fmt.Errorf("share: entry kind %d", e.Kind)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Decoder decodes messages; its zero value is ready, and it reuses its
// memory from one message to the next (a Message it returned is valid
// until the next Decode).
type Decoder struct {
	dec   *msgpack.Decoder
	rd    bytes.Reader
	names []string
	msg   Message
}

// Decode decodes one message. Every error wraps ErrBadMessage; no input
// panics it or makes it allocate more than its bounds allow.
func (d *Decoder) Decode(b []byte) (*Message, error) {
	m, err := d.decode(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	return m, nil
}

func (d *Decoder) decode(b []byte) (*Message, error) {
	if d.dec == nil {
		d.dec = msgpack.NewDecoder(nil)
	}
	d.rd.Reset(b)
	d.dec.Reset(&d.rd)
	dec := d.dec
	if n, err := dec.DecodeArrayLen(); err != nil || n != 7 {
		return nil, fmt.Errorf("want a 7-element array (%d, %v)", n, err)
	}
	if v, err := dec.DecodeUint64(); err != nil || v != Version {
		return nil, fmt.Errorf("version %d (%v), want %d", v, err, Version)
	}
	m := &d.msg
	*m = Message{Entries: m.Entries[:0]}
	var err error
	if m.Replica, err = dec.DecodeUint64(); err != nil {
		return nil, fmt.Errorf("replica: %v", err)
	}
	if m.Seq, err = dec.DecodeUint64(); err != nil {
		return nil, fmt.Errorf("seq: %v", err)
	}
	// Bounded so that no time an entry offsets from it overflows.
	if m.Now, err = dec.DecodeInt64(); err != nil || m.Now <= 0 || m.Now > math.MaxInt64-2*maxOffset*int64(time.Microsecond) {
		return nil, fmt.Errorf("now %d: %v", m.Now, err)
	}
	flags, err := dec.DecodeUint64()
	if err != nil {
		return nil, fmt.Errorf("flags: %v", err)
	}
	m.Sync, m.Complete = flags&flagSync != 0, flags&flagComplete != 0
	n, err := dec.DecodeArrayLen()
	if err != nil || n < 0 || n > MaxEndpoints {
		return nil, fmt.Errorf("endpoint table of %d (%v)", n, err)
	}
	d.names = d.names[:0]
	for range n {
		s, err := d.string()
		if err != nil {
			return nil, fmt.Errorf("endpoint: %v", err)
		}
		d.names = append(d.names, s)
	}
	if n, err = dec.DecodeArrayLen(); err != nil || n < 0 || n > MaxEntries {
		return nil, fmt.Errorf("%d entries (%v)", n, err)
	}
	for range n {
		e, err := d.entry(m.Now)
		if err != nil {
			return nil, fmt.Errorf("entry %d: %v", len(m.Entries), err)
		}
		m.Entries = append(m.Entries, e)
	}
	if d.rd.Len() != 0 {
		return nil, fmt.Errorf("%d bytes after the message", d.rd.Len())
	}
	return m, nil
}

// string decodes a string no longer than maxName without reading a longer
// one into memory.
func (d *Decoder) string() (string, error) {
	c, err := d.dec.PeekCode()
	if err != nil {
		return "", err
	}
	if !msgpcode.IsFixedString(c) && c != msgpcode.Str8 && c != msgpcode.Str16 && c != msgpcode.Str32 {
		return "", fmt.Errorf("code %#x is not a string", c)
	}
	n, err := d.dec.DecodeBytesLen()
	if err != nil {
		return "", err
	}
	if n > maxName || n < 0 {
		return "", fmt.Errorf("a name of %d bytes", n)
	}
	buf := make([]byte, n)
	if err := d.dec.ReadFull(buf); err != nil {
		return "", err
	}
	return string(buf), nil
}

func (d *Decoder) entry(now int64) (Entry, error) {
	var e Entry
	dec := d.dec
	n, err := dec.DecodeArrayLen()
	if err != nil || n < 2 {
		return e, fmt.Errorf("an array of %d (%v)", n, err)
	}
	kind, err := dec.DecodeUint64()
	if err != nil {
		return e, err
	}
	e.Kind = datalayer.NoteKind(min(kind, math.MaxUint8))
	if want := entryLen(e.Kind); want == 0 || n != want {
		return e, fmt.Errorf("kind %d in an array of %d", kind, n)
	}
	if e.ID, err = dec.DecodeUint64(); err != nil || e.ID == 0 {
		return e, fmt.Errorf("id %d (%v)", e.ID, err)
	}
	at := func() (int64, error) {
		c, err := dec.PeekCode()
		if err != nil {
			return 0, err
		}
		if c == msgpcode.Nil {
			return 0, dec.DecodeNil()
		}
		v, err := dec.DecodeInt64()
		if err != nil {
			return 0, err
		}
		if v > maxOffset || v < -maxOffset {
			return 0, fmt.Errorf("a time %dµs from the message's", v)
		}
		return now + v*int64(time.Microsecond), nil
	}
	count := func(limit int64) (int64, error) {
		v, err := dec.DecodeUint64()
		if err != nil {
			return 0, err
		}
		if v > uint64(limit) {
			return 0, fmt.Errorf("%d is over %d", v, limit)
		}
		return int64(v), nil
	}
	switch e.Kind {
	case datalayer.NoteSent:
		i, err := count(MaxEndpoints)
		if err != nil || int(i) >= len(d.names) {
			return e, fmt.Errorf("endpoint %d of %d (%v)", i, len(d.names), err)
		}
		e.Endpoint = d.names[i]
		var v [5]int64
		if e.At, err = at(); err != nil {
			return e, err
		}
		for j, limit := range [5]int64{maxTokens, maxTokens, maxTokens, maxDuration, maxDuration} {
			if v[j], err = count(limit); err != nil {
				return e, err
			}
		}
		e.Prefill, e.Prompt, e.Outputs = int(v[0]), int(v[1]), int(v[2])
		e.PrefillFor, e.PerToken = time.Duration(v[3])*time.Microsecond, time.Duration(v[4])*time.Microsecond
		if e.End, err = at(); err != nil {
			return e, err
		}
		if e.First, err = at(); err != nil {
			return e, err
		}
	case datalayer.NoteFirst:
		if e.At, err = at(); err != nil {
			return e, err
		}
		if e.End, err = at(); err != nil {
			return e, err
		}
	case datalayer.NoteDone:
		if e.At, err = at(); err != nil {
			return e, err
		}
	}
	return e, nil
}

// entryLen is the length of an entry of kind k's array (0: no such kind).
func entryLen(k datalayer.NoteKind) int {
	switch k {
	case datalayer.NoteSent:
		return 11
	case datalayer.NoteFirst:
		return 4
	case datalayer.NoteDone:
		return 3
	case datalayer.NoteFailed:
		return 2
	}
	return 0
}
