package share

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/events"
)

// Options tune a Sharer. Zero fields take the defaults named beside them.
type Options struct {
	// Namespace and Pool name the pool whose replicas share
	// (events.DispatchSubject).
	Namespace, Pool string
	// Disabled keeps the replica to its own view: it neither publishes
	// nor listens, and says so in its state.
	Disabled bool
	// Replica is this replica's id in its messages (default: random).
	Replica uint64
	// FlushInterval is how long a step waits to be sent with the ones
	// after it (default 10ms): one message carries every step of the
	// interval. A message costs far more to carry than a step adds to
	// it, so the interval bounds the messages while peers see a
	// dispatch at most this much later.
	FlushInterval time.Duration
	// SyncInterval is how often the replica sends its whole in-flight
	// set (default 1s): it repairs lost messages. A replica also sends it
	// at once when it hears a peer it did not know, so that a replica
	// that starts hears every peer's set within CatchUp (default 250ms),
	// the time readiness waits for it (and, should a peer answer later,
	// within a sync interval).
	SyncInterval, CatchUp time.Duration
	// FadeMargin is how long past its expected end a peer's dispatch
	// that no message ended is kept (default 2s); UnknownLife is a
	// dispatch's life when no end is expected (default 30s), and MaxLife
	// bounds any (default 10m).
	FadeMargin, UnknownLife, MaxLife time.Duration
	// MaxRemote and MaxRemotePerEndpoint cap the peers' dispatches held
	// (default 16384 and 2048); MaxPeers caps the peers tracked
	// (default 256); MaxPending caps the steps waiting to be sent
	// (default 16384).
	MaxRemote, MaxRemotePerEndpoint, MaxPeers, MaxPending int
	// Now is the clock (default time.Now): the datastore's dispatches'
	// clock.
	Now    func() time.Time
	Logger *slog.Logger
}

func (o *Options) defaults() {
	set := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	set(&o.FlushInterval, 10*time.Millisecond)
	set(&o.SyncInterval, time.Second)
	set(&o.CatchUp, 250*time.Millisecond)
	set(&o.FadeMargin, 2*time.Second)
	set(&o.UnknownLife, 30*time.Second)
	set(&o.MaxLife, 10*time.Minute)
	seti := func(d *int, v int) {
		if *d <= 0 {
			*d = v
		}
	}
	seti(&o.MaxRemote, 16384)
	seti(&o.MaxRemotePerEndpoint, 2048)
	seti(&o.MaxPeers, 256)
	seti(&o.MaxPending, 16384)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	for o.Replica == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		o.Replica = binary.LittleEndian.Uint64(b[:])
	}
}

// State is how far a replica's in-flight view reaches.
type State int

// The states, as the state gauge labels them.
const (
	// StateOff: sharing is turned off; the replica sees its own dispatches.
	StateOff State = iota
	// StateLocalOnly: NATS is not connected; the replica sees its own
	// dispatches, and its peers' fade out.
	StateLocalOnly
	// StateCatchingUp: listening, but not yet for a whole sync interval:
	// some peers' dispatches may be missing.
	StateCatchingUp
	// StateSharing: every peer's dispatches are counted.
	StateSharing
)

var stateNames = [...]string{"off", "local-only", "catching-up", "sharing"}

func (s State) String() string { return stateNames[s] }

// Sharer shares this replica's dispatches with its pool's other replicas
// and applies theirs to its datastore. Make it with New, then Run it.
type Sharer struct {
	o       Options
	nc      *nats.Conn
	ds      *datalayer.Datastore
	subject string
	m       *metrics

	// What waits to be sent, and the timer that sends it: the step that
	// finds the queue empty starts the timer itself, so that a message
	// wakes the publisher once, not also to start its timer.
	mu      sync.Mutex
	pending []Entry
	flushT  *time.Timer
	// syncNow asks the publisher for a sync: a new peer was heard.
	syncNow chan struct{}

	// Owned by the publisher (Run's goroutine).
	live    map[uint64]Entry
	seq     uint64
	buf     bytes.Buffer
	scratch []Entry

	// The peers' dispatches, under rmu.
	rmu         sync.Mutex
	dec         Decoder
	peers       map[uint64]*peer
	perEndpoint map[string]int
	remote      int

	// listening is when the subscription began (Unix ns, 0: not).
	listening atomic.Int64
}

type peer struct {
	seq, mark uint64
	heard     int64
	entries   map[uint64]*remote
}

// remote is a peer's dispatch, accounted in the datastore as one of its
// own, never announced.
type remote struct {
	d        datalayer.Dispatch
	endpoint string
	deadline int64
	mark     uint64
}

// New makes a Sharer for ds over nc (nil: none, the replica keeps its own
// view), a connection best made with nats.NoEcho so that the server does
// not send the replica its own messages, with its metrics registered in reg (nil: none). Unless sharing is
// disabled, ds's announced dispatches are told to it from now on.
func New(nc *nats.Conn, ds *datalayer.Datastore, o Options, reg prometheus.Registerer) (*Sharer, error) {
	o.defaults()
	s := &Sharer{
		o: o, nc: nc, ds: ds, subject: events.DispatchSubject(o.Namespace, o.Pool),
		flushT: time.NewTimer(time.Hour), syncNow: make(chan struct{}, 1), live: make(map[uint64]Entry),
		peers: make(map[uint64]*peer), perEndpoint: make(map[string]int),
	}
	s.flushT.Stop()
	s.m = newMetrics(s)
	if reg != nil {
		if err := s.m.register(reg); err != nil {
			return nil, fmt.Errorf("share: metrics: %w", err)
		}
	}
	if !o.Disabled && nc != nil {
		ds.SetDispatchListener(s)
	}
	return s, nil
}

// Replica is this replica's id in its messages.
func (s *Sharer) Replica() uint64 { return s.o.Replica }

// State is how far the replica's in-flight view reaches now.
func (s *Sharer) State() State {
	switch {
	case s.o.Disabled:
		return StateOff
	case s.nc == nil || s.listening.Load() == 0 || !s.nc.IsConnected():
		return StateLocalOnly
	case !s.CaughtUp():
		return StateCatchingUp
	}
	return StateSharing
}

// CaughtUp reports whether the replica has listened for CatchUp: readiness
// waits for it, so that a restarted replica picks only once it counts its
// peers' dispatches. A replica that does not share has nothing to catch up.
func (s *Sharer) CaughtUp() bool {
	if s.o.Disabled || s.nc == nil {
		return true
	}
	l := s.listening.Load()
	return l != 0 && s.o.Now().UnixNano()-l >= int64(s.o.CatchUp)
}

// Detail says the state in words, for readiness and logs.
func (s *Sharer) Detail() string {
	st := s.State()
	s.rmu.Lock()
	peers, remote := len(s.peers), s.remote
	s.rmu.Unlock()
	switch st {
	case StateOff:
		return "dispatch sharing off: in-flight load is this replica's own"
	case StateLocalOnly:
		return "dispatch sharing: NATS not connected, in-flight load is this replica's own"
	case StateCatchingUp:
		return fmt.Sprintf("dispatch sharing: catching up with peers' dispatches (%d peers, %d dispatches so far)", peers, remote)
	}
	return fmt.Sprintf("dispatch sharing: %d peers, %d of their dispatches in flight", peers, remote)
}

// RemoteInFlight is how many of the peers' dispatches are counted now.
func (s *Sharer) RemoteInFlight() int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.remote
}

// Note queues one of this replica's dispatch steps to be sent
// (datalayer.DispatchListener). It never blocks: past MaxPending, steps
// are dropped (peers then fade the dispatch out, or the next sync repairs it).
func (s *Sharer) Note(id uint64, n datalayer.DispatchNote) {
	s.mu.Lock()
	if len(s.pending) >= s.o.MaxPending {
		s.mu.Unlock()
		s.m.dropped.WithLabelValues("queue-full").Inc()
		return
	}
	s.pending = append(s.pending, Entry{
		Kind: n.Kind, ID: id, Endpoint: n.Endpoint, At: n.At, End: n.End,
		Prefill: n.Prefill, Prompt: n.Prompt, Outputs: n.Outputs, PrefillFor: n.PrefillFor, PerToken: n.PerToken,
	})
	if len(s.pending) == 1 {
		s.flushT.Reset(s.o.FlushInterval)
	}
	s.mu.Unlock()
}

// Run shares until ctx is done. Without NATS, or disabled, it only waits.
func (s *Sharer) Run(ctx context.Context) error {
	if s.o.Disabled || s.nc == nil {
		<-ctx.Done()
		return nil
	}
	sub, err := s.nc.Subscribe(s.subject, s.receive)
	if err != nil {
		return fmt.Errorf("share: subscribe %s: %w", s.subject, err)
	}
	// A slow receiver drops messages rather than hold the connection's
	// memory without bound; the sync repairs what it lost.
	_ = sub.SetPendingLimits(4096, 64<<20)
	s.listening.Store(s.o.Now().UnixNano())
	defer func() { _ = sub.Unsubscribe() }()
	// A sync at once: peers hear of this replica (and of what a replica
	// restarted in place still has in flight) without waiting an interval.
	s.sync()
	syncT := time.NewTicker(s.o.SyncInterval)
	defer syncT.Stop()
	sweepT := time.NewTicker(min(s.o.FadeMargin/4, 250*time.Millisecond))
	defer sweepT.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.flushT.C:
			s.flush()
		case <-syncT.C:
			s.flush()
			s.sync()
		case <-s.syncNow:
			s.flush()
			s.sync()
		case <-sweepT.C:
			s.sweep(s.o.Now().UnixNano())
		}
	}
}

// flush sends the steps waiting, in as few messages as the bounds allow.
func (s *Sharer) flush() {
	s.mu.Lock()
	out := s.pending
	s.pending = s.scratch[:0]
	s.mu.Unlock()
	for i := range out {
		e := &out[i]
		switch e.Kind {
		case datalayer.NoteSent:
			if len(s.live) < s.o.MaxRemote {
				s.live[e.ID] = *e
			}
		case datalayer.NoteFirst:
			if l, ok := s.live[e.ID]; ok {
				l.First, l.End = e.At, e.End
				s.live[e.ID] = l
			}
		default:
			delete(s.live, e.ID)
		}
	}
	for rest := out; len(rest) > 0; {
		n := min(len(rest), MaxEntries)
		s.publish(&Message{Entries: rest[:n]})
		rest = rest[n:]
	}
	// The two buffers take turns: the next steps go into this one.
	s.scratch = out[:0]
}

// sync sends the replica's whole in-flight set (its first MaxEntries).
func (s *Sharer) sync() {
	m := Message{Sync: true, Complete: len(s.live) <= MaxEntries}
	for _, e := range s.live {
		if len(m.Entries) == MaxEntries {
			break
		}
		m.Entries = append(m.Entries, e)
	}
	s.publish(&m)
}

func (s *Sharer) publish(m *Message) {
	s.seq++
	m.Replica, m.Seq, m.Now = s.o.Replica, s.seq, s.o.Now().UnixNano()
	s.buf.Reset()
	if err := Encode(&s.buf, m); err != nil {
		s.o.Logger.Error("dispatch share: encode", "error", err)
		return
	}
	if err := s.nc.Publish(s.subject, s.buf.Bytes()); err != nil {
		s.m.publishErrors.Inc()
		return
	}
	s.m.published.Inc()
	s.m.publishedBytes.Add(float64(s.buf.Len()))
}

// receive applies a peer's message.
func (s *Sharer) receive(msg *nats.Msg) {
	s.m.received.Inc()
	s.m.receivedBytes.Add(float64(len(msg.Data)))
	s.rmu.Lock()
	defer s.rmu.Unlock()
	m, err := s.dec.Decode(msg.Data)
	if err != nil {
		s.m.rejected.Inc()
		s.o.Logger.Debug("dispatch share: message rejected", "error", err)
		return
	}
	s.apply(m, s.o.Now().UnixNano())
}

// errOwn is apply's answer to a replica's own message, which it ignores:
// every replica hears what it publishes on the shared subject.
var errOwn = errors.New("own message")

// apply applies m, received at now; the caller holds rmu.
func (s *Sharer) apply(m *Message, now int64) error {
	if m.Replica == s.o.Replica {
		return errOwn
	}
	p := s.peers[m.Replica]
	if p == nil {
		if len(s.peers) >= s.o.MaxPeers {
			s.m.dropped.WithLabelValues("peers").Add(float64(len(m.Entries)))
			return nil
		}
		p = &peer{entries: make(map[uint64]*remote)}
		s.peers[m.Replica] = p
		// A replica just started (or just reconnected) catches up from
		// its peers' sets: send this one's now.
		select {
		case s.syncNow <- struct{}{}:
		default:
		}
	}
	switch {
	case p.seq != 0 && m.Seq <= p.seq:
		return nil // a duplicate or one overtaken: already counted
	case p.seq != 0 && m.Seq > p.seq+1:
		s.m.gaps.Add(float64(m.Seq - p.seq - 1))
	}
	p.seq, p.heard = m.Seq, now
	// The sender's times, moved onto this clock: a skew between the two
	// does not age or rejuvenate what it sent.
	off := now - m.Now
	local := func(t int64) int64 {
		if t == 0 {
			return 0
		}
		return t + off
	}
	if m.Sync {
		p.mark++
	}
	for i := range m.Entries {
		e := &m.Entries[i]
		r := p.entries[e.ID]
		switch e.Kind {
		case datalayer.NoteSent:
			if r == nil {
				if r = s.add(p, e, local(e.At), local(e.End), now); r == nil {
					continue
				}
			} else if e.End != 0 {
				r.deadline = s.deadline(local(e.End), 0, now)
			}
			if e.First != 0 {
				r.d.FirstToken(time.Unix(0, min(local(e.First), now)))
			}
			if m.Sync {
				r.mark = p.mark
			}
		case datalayer.NoteFirst:
			if r != nil {
				r.d.FirstToken(time.Unix(0, min(local(e.At), now)))
				r.deadline = s.deadline(local(e.End), local(e.At), now)
			}
		case datalayer.NoteDone:
			if r != nil {
				at := now
				if e.At != 0 {
					at = min(local(e.At), now)
				}
				r.d.DoneAt(time.Unix(0, at))
				s.remove(p, e.ID, r)
			}
		case datalayer.NoteFailed:
			if r != nil {
				r.d.Fail()
				s.remove(p, e.ID, r)
			}
		}
	}
	if m.Sync && m.Complete {
		// What the sender no longer has in flight has ended, whatever
		// message said so was lost.
		for id, r := range p.entries {
			if r.mark != p.mark {
				r.d.Fail()
				s.remove(p, id, r)
			}
		}
	}
	return nil
}

// add accounts a peer's dispatch, sent at at and expected to end at end
// (0: unknown); nil when a cap or an
// unknown endpoint refuses it.
func (s *Sharer) add(p *peer, e *Entry, at, end, now int64) *remote {
	if s.remote >= s.o.MaxRemote || s.perEndpoint[e.Endpoint] >= s.o.MaxRemotePerEndpoint {
		s.m.dropped.WithLabelValues("cap").Inc()
		return nil
	}
	at = min(at, now)
	r := &remote{endpoint: e.Endpoint}
	if !s.ds.DispatchInto(&r.d, e.Endpoint, time.Unix(0, at), e.Prefill, e.Prompt, e.Outputs) {
		s.m.dropped.WithLabelValues("unknown-endpoint").Inc()
		return nil
	}
	r.d.ExpectPrefill(e.PrefillFor)
	r.d.ExpectDecode(e.PerToken)
	r.deadline = s.deadline(end, at, now)
	p.entries[e.ID] = r
	s.remote++
	s.perEndpoint[e.Endpoint]++
	s.m.remote.Set(float64(s.remote))
	return r
}

// deadline is when a peer's dispatch fades: its expected end end plus the
// margin, or, with none expected, UnknownLife after from; never more than
// MaxLife from now.
func (s *Sharer) deadline(end, from, now int64) int64 {
	var t int64
	if end != 0 {
		t = max(end, now) + int64(s.o.FadeMargin)
	} else {
		t = max(from, now-int64(s.o.UnknownLife)) + int64(s.o.UnknownLife) + int64(s.o.FadeMargin)
	}
	return min(t, now+int64(s.o.MaxLife))
}

func (s *Sharer) remove(p *peer, id uint64, r *remote) {
	delete(p.entries, id)
	s.remote--
	if s.perEndpoint[r.endpoint]--; s.perEndpoint[r.endpoint] <= 0 {
		delete(s.perEndpoint, r.endpoint)
	}
	s.m.remote.Set(float64(s.remote))
}

// peerForget is how long a peer with nothing in flight is remembered
// after its last message: long enough that a pause in its syncs is not
// taken for a new peer, whose first message's seq would not be a gap.
const peerForget = time.Minute

// sweep fades the peers' dispatches past their deadlines at now, and
// forgets the peers long silent with none left.
func (s *Sharer) sweep(now int64) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	for pid, p := range s.peers {
		for id, r := range p.entries {
			if r.deadline <= now {
				r.d.Fail()
				s.remove(p, id, r)
				s.m.faded.Inc()
			}
		}
		if len(p.entries) == 0 && now-p.heard > int64(peerForget) {
			delete(s.peers, pid)
		}
	}
}
