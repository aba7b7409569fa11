package events

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
)

// ErrNoConn is returned when a Publisher or Consumer is given no connection.
var ErrNoConn = errors.New("no NATS connection")

// Publisher puts vLLM batches onto NATS under the contract: the payload
// unchanged, identity and order in headers, on the pod's subject. It is
// safe for concurrent use; ordering across calls is the caller's, since
// NATS keeps the order of one connection's publishes.
type Publisher struct {
	nc              *nats.Conn
	namespace, pool string
}

// NewPublisher returns a Publisher for the pods of one pool.
func NewPublisher(nc *nats.Conn, namespace, pool string) *Publisher {
	return &Publisher{nc: nc, namespace: namespace, pool: pool}
}

// Conn is the connection the publisher sends on.
func (p *Publisher) Conn() *nats.Conn { return p.nc }

// Namespace and Pool are the pool the publisher's subjects name.
func (p *Publisher) Namespace() string { return p.namespace }

// Pool is the InferencePool the publisher's subjects name.
func (p *Publisher) Pool() string { return p.pool }

// Publish sends one encoded batch. The origin is checked first, because a
// batch every consumer would reject is better refused here, where the bug is.
// A missing Pod falls back to the endpoint for the subject token.
func (p *Publisher) Publish(o Origin, payload []byte) error {
	if p.nc == nil {
		return ErrNoConn
	}
	if err := validateEndpoint(o.Endpoint); err != nil {
		return fmt.Errorf("publish %s: %w: %s %q: %v", o.Stream, ErrBadHeader, HeaderEndpoint, o.Endpoint, err)
	}
	if o.DPRank < 0 || o.BlockSize < 0 {
		return fmt.Errorf("publish %s: %w: negative rank or block size", o.Stream, ErrBadHeader)
	}
	pod := o.Pod
	if pod == "" {
		pod = o.Endpoint
	}
	msg := &nats.Msg{Subject: Subject(p.namespace, p.pool, pod), Header: o.Header(), Data: payload}
	if err := p.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("publish %s seq %d: %w", o.Stream, o.Seq, err)
	}
	return nil
}

// PublishHeartbeat sends a heartbeat for the stream o names: o.Seq is the
// last batch published under o.Instance. It goes on the stream's own
// subject, so that it reaches every consumer after the batches before it.
func (p *Publisher) PublishHeartbeat(o Origin) error {
	if p.nc == nil {
		return ErrNoConn
	}
	if err := validateEndpoint(o.Endpoint); err != nil {
		return fmt.Errorf("heartbeat %s: %w: %s %q: %v", o.Stream, ErrBadHeader, HeaderEndpoint, o.Endpoint, err)
	}
	pod := o.Pod
	if pod == "" {
		pod = o.Endpoint
	}
	msg := &nats.Msg{Subject: Subject(p.namespace, p.pool, pod), Header: o.HeartbeatHeader()}
	if err := p.nc.PublishMsg(msg); err != nil {
		return fmt.Errorf("heartbeat %s seq %d: %w", o.Stream, o.Seq, err)
	}
	return nil
}
