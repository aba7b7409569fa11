package events

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
)

// SubjectPrefix starts every KV-event subject. The full subject is
// kv.events.<namespace>.<pool>.<pod>.
const SubjectPrefix = "kv.events"

// The headers of the NATS contract. They carry a batch's identity and order.
// The subject names the pod, and it is the one part of a message the
// server's permissions vouch for, so the headers may only agree with it: a
// consumer holds Kv-Pod to the subject's pod token and Kv-Endpoint to the
// endpoints discovery gives that pod (see the EPP's consumer). An endpoint
// cannot be a subject token at all, hence the header. nats.Header is
// case-sensitive, so publishers must use these spellings; ParseOrigin
// tolerates other cases all the same.
const (
	// HeaderEndpoint is the ip:port (or host:port) the gateway routes to. Required.
	HeaderEndpoint = "Kv-Endpoint"
	// HeaderPod is the pod's name. Optional, informational.
	HeaderPod = "Kv-Pod"
	// HeaderModel is the model the engine serves. Optional.
	HeaderModel = "Kv-Model"
	// HeaderSeq is vLLM's batch sequence number, a decimal uint64. Required.
	HeaderSeq = "Kv-Seq"
	// HeaderDPRank is the data-parallel rank, a non-negative int; absent means 0.
	HeaderDPRank = "Kv-DP-Rank"
	// HeaderInstance changes whenever the engine restarts. Optional but
	// strongly advised: without it a restart is only seen when seq goes back.
	HeaderInstance = "Kv-Instance"
	// HeaderBlockSize is the engine's block size in tokens, a non-negative
	// int; absent means unknown (0).
	HeaderBlockSize = "Kv-Block-Size"
	// HeaderHeartbeat marks a heartbeat: a message on the stream's own
	// subject, with no payload, whose Kv-Seq is the last batch the
	// publisher sent under Kv-Instance. Publishers send one every few
	// seconds, quiet or not, so that a consumer that lost the stream's last
	// batches finds out (docs/nats.md). The value is "1".
	HeaderHeartbeat = "Kv-Heartbeat"
)

// SnapshotSubjectPrefix starts the subject a relay answers snapshot
// requests on: kv.snapshot.<namespace>.<pool>.<pod>. See docs/snapshot.md.
const SnapshotSubjectPrefix = "kv.snapshot"

// DispatchSubjectPrefix starts the subject on which a pool's EPP replicas
// share what they dispatched: kv.dispatch.<namespace>.<pool>. Every replica
// publishes and subscribes there; see docs/architecture.md.
const DispatchSubjectPrefix = "kv.dispatch"

// DispatchSubject returns the subject a pool's EPP replicas share their
// dispatches on, its tokens sanitised as Subject's are.
func DispatchSubject(namespace, pool string) string {
	return DispatchSubjectPrefix + "." + sanitizeToken(namespace) + "." + sanitizeToken(pool)
}

// EPPInboxPrefix is the prefix of the EPP's reply subjects (its snapshot
// requests' and JetStream's), given to nats.CustomInboxPrefix. The NATS
// auth callout lets the EPP subscribe to EPPInboxPrefix.> and to no other
// inbox, so it reads no other client's replies.
const EPPInboxPrefix = "_INBOX_kvroute_epp"

// The headers a snapshot reply adds to the contract's headers. Each reply
// message is one chunk; Kv-Seq on every chunk is the last batch the snapshot
// includes, and Kv-Instance the engine instance it describes.
const (
	// HeaderSnapshotChunk is the chunk's 0-based index, a decimal int.
	HeaderSnapshotChunk = "Kv-Snapshot-Chunk"
	// HeaderSnapshotChunks is the number of chunks in the snapshot.
	HeaderSnapshotChunks = "Kv-Snapshot-Chunks"
	// HeaderSnapshotExact is "true" when the relay saw every batch of the
	// engine instance since its seq 0, and "false" when it knows it missed
	// some (it started late, a gap could not be filled, a payload did not
	// decode, or its mirror hit its bound): the snapshot is then its best
	// knowledge, not the engine's exact state.
	HeaderSnapshotExact = "Kv-Snapshot-Exact"
	// HeaderSnapshotState refines Kv-Snapshot-Exact: "exact" (as
	// Kv-Snapshot-Exact true), "partial" (the relay started after the
	// engine and could not recover its history: everything in the snapshot
	// is held, blocks stored before the relay's first batch may be
	// missing), or "inexact" (batches were lost after the relay's first
	// one: the snapshot may be wrong either way). Absent, Kv-Snapshot-Exact
	// decides between exact and inexact.
	HeaderSnapshotState = "Kv-Snapshot-State"
	// HeaderSnapshotError is set, on a reply with no payload and no other
	// snapshot headers, when the relay cannot answer (it has relayed no
	// batch yet); the value says why.
	HeaderSnapshotError = "Kv-Snapshot-Error"
)

// ErrBadHeader is returned when a message's headers break the contract: a
// required header is missing or a value does not parse.
var ErrBadHeader = errors.New("bad kv-event header")

// Subject returns the subject a pod's batches are published on. Each token
// is sanitised (see sanitizeToken) so that no pod name can add a level to
// the subject or act as a wildcard.
func Subject(namespace, pool, pod string) string {
	return SubjectPrefix + "." + sanitizeToken(namespace) + "." + sanitizeToken(pool) + "." + sanitizeToken(pod)
}

// SnapshotSubject returns the subject on which the relay of a pod answers
// snapshot requests, its tokens sanitised as Subject's are.
func SnapshotSubject(namespace, pool, pod string) string {
	return SnapshotSubjectPrefix + "." + sanitizeToken(namespace) + "." + sanitizeToken(pool) + "." + sanitizeToken(pod)
}

// PoolSubject returns the wildcard subject covering every pod of a pool.
func PoolSubject(namespace, pool string) string {
	return SubjectPrefix + "." + sanitizeToken(namespace) + "." + sanitizeToken(pool) + ".>"
}

// sanitizeToken maps s to one subject token of [A-Za-z0-9_-]: every other
// byte (dots, wildcards, spaces, each byte of a multi-byte rune) becomes '_',
// and an empty token becomes "_" because NATS rejects empty tokens.
func sanitizeToken(s string) string {
	if s == "" {
		return "_"
	}
	clean := true
	for i := 0; i < len(s); i++ {
		if !tokenByte(s[i]) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if !tokenByte(c) {
			b[i] = '_'
		}
	}
	return string(b)
}

func tokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// Snapshot states, the values of HeaderSnapshotState.
const (
	SnapshotExact   = "exact"
	SnapshotPartial = "partial"
	SnapshotInexact = "inexact"
)

// HeartbeatHeader returns the headers of a heartbeat for o: o's contract
// headers, Kv-Seq the last batch sent, and Kv-Heartbeat.
func (o Origin) HeartbeatHeader() nats.Header {
	h := o.Header()
	h.Set(HeaderHeartbeat, "1")
	return h
}

// IsHeartbeat reports whether a message's headers mark it a heartbeat.
func IsHeartbeat(h nats.Header) bool {
	v, ok := header(h, HeaderHeartbeat)
	return ok && v != "" && v != "0"
}

// Header returns the contract headers describing o. Optional headers whose
// value is empty (or a zero block size) are left out rather than sent empty.
func (o Origin) Header() nats.Header {
	h := make(nats.Header, 7)
	h.Set(HeaderEndpoint, o.Endpoint)
	h.Set(HeaderSeq, strconv.FormatUint(o.Seq, 10))
	h.Set(HeaderDPRank, strconv.Itoa(o.DPRank))
	if o.Pod != "" {
		h.Set(HeaderPod, o.Pod)
	}
	if o.Model != "" {
		h.Set(HeaderModel, o.Model)
	}
	if o.Instance != "" {
		h.Set(HeaderInstance, o.Instance)
	}
	if o.BlockSize != 0 {
		h.Set(HeaderBlockSize, strconv.Itoa(o.BlockSize))
	}
	return h
}

// ParseOrigin reads a batch's Origin from its headers. Kv-Endpoint and
// Kv-Seq are required; the rest default to zero values when absent. Every
// error wraps ErrBadHeader.
func ParseOrigin(h nats.Header) (Origin, error) {
	var o Origin
	ep, ok := header(h, HeaderEndpoint)
	if !ok {
		return o, fmt.Errorf("%w: missing %s", ErrBadHeader, HeaderEndpoint)
	}
	if err := validateEndpoint(ep); err != nil {
		return o, fmt.Errorf("%w: %s %q: %v", ErrBadHeader, HeaderEndpoint, ep, err)
	}
	o.Endpoint = ep

	seq, ok := header(h, HeaderSeq)
	if !ok {
		return o, fmt.Errorf("%w: missing %s", ErrBadHeader, HeaderSeq)
	}
	n, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return o, fmt.Errorf("%w: %s %q is not a uint64", ErrBadHeader, HeaderSeq, seq)
	}
	o.Seq = n

	if o.DPRank, err = optionalCount(h, HeaderDPRank); err != nil {
		return o, err
	}
	if o.BlockSize, err = optionalCount(h, HeaderBlockSize); err != nil {
		return o, err
	}
	o.Pod, _ = header(h, HeaderPod)
	o.Model, _ = header(h, HeaderModel)
	o.Instance, _ = header(h, HeaderInstance)
	return o, nil
}

// header looks key up exactly first, which is the contract and the common
// case, then case-insensitively for publishers that canonicalise header
// names the way HTTP libraries do (Kv-Dp-Rank).
func header(h nats.Header, key string) (string, bool) {
	if v, ok := h[key]; ok && len(v) > 0 {
		return v[0], true
	}
	for k, v := range h {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0], true
		}
	}
	return "", false
}

// optionalCount parses a non-negative int header, 0 when absent. The upper
// bound keeps a hostile value from becoming a huge allocation downstream.
func optionalCount(h nats.Header, key string) (int, error) {
	s, ok := header(h, key)
	if !ok {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 32)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: %s %q is not a non-negative int", ErrBadHeader, key, s)
	}
	return int(n), nil
}

// validateEndpoint accepts ip:port or host:port with a DNS-style host: it is
// what the gateway will dial, so anything else is a publisher bug.
func validateEndpoint(ep string) error {
	if ap, err := netip.ParseAddrPort(ep); err == nil {
		if ap.Port() == 0 {
			return errors.New("port 0")
		}
		return nil
	}
	i := strings.LastIndexByte(ep, ':')
	if i <= 0 {
		return errors.New("want host:port")
	}
	host, port := ep[:i], ep[i+1:]
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return fmt.Errorf("bad port %q", port)
	}
	if len(host) > 253 {
		return errors.New("host too long")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("bad host %q", host)
		}
		for j := 0; j < len(label); j++ {
			c := label[j]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("bad host %q", host)
			}
		}
	}
	return nil
}
