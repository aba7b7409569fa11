package sim

import (
	"context"
	"net"
	"strings"
	"sync"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// simTCP is the transport the engine's ZeroMQ sockets go through: plain
// TCP, with two changes that make the simulated engine's connections end
// as a vLLM process's do.
//
// A dialling PUB's connections report their end (watchConn), so that the
// engine can dial a restarted subscriber afresh.
//
// A bound socket's listener closes every connection it accepted, and any
// it accepts after, when it closes (exitingListener). A vLLM engine that
// exits closes every connection its sockets hold: the relay reading its
// publisher sees the end, redials and finds the new process. The ZeroMQ
// library does not always do that: its accept loop adds a connection once
// the ZMTP handshake is done, and one accepted while the socket closes is
// added after the close has shut the others, and then stays open, silent,
// with nothing behind it. A relay that redialled at that moment would
// wait on it for ever.
const simTCP = "kvsim-tcp"

// connDiedKey carries, in the context of the socket that dials, the
// channel its connection closes when it ends.
type connDiedKey struct{}

func init() {
	if err := zmq4.RegisterTransport(simTCP, simTransport{tcp: transport.New("tcp")}); err != nil {
		panic(err) // only if the name is taken, which is a build mistake
	}
}

// simEndpoint routes a tcp:// endpoint through simTCP.
func simEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return simTCP + "://" + rest
	}
	return ep
}

type simTransport struct{ tcp transport.Transport }

func (t simTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.tcp.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	died, _ := ctx.Value(connDiedKey{}).(chan struct{})
	return &watchConn{Conn: c, died: died}, nil
}

func (t simTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := t.tcp.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &exitingListener{Listener: l, conns: map[net.Conn]struct{}{}}, nil
}

func (t simTransport) Addr(ep string) (string, error) { return t.tcp.Addr(ep) }

// watchConn closes died once its first read fails: the peer is gone.
type watchConn struct {
	net.Conn
	died chan struct{}
	once sync.Once
}

func (c *watchConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && c.died != nil {
		c.once.Do(func() { close(c.died) })
	}
	return n, err
}

// exitingListener remembers what it accepted, and closes it all with
// itself.
type exitingListener struct {
	net.Listener
	mu     sync.Mutex
	closed bool
	conns  map[net.Conn]struct{}
}

func (l *exitingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return nil, net.ErrClosed
	}
	l.conns[c] = struct{}{}
	return &exitingConn{Conn: c, l: l}, nil
}

func (l *exitingListener) Close() error {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = map[net.Conn]struct{}{}
	l.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
	return l.Listener.Close()
}

// exitingConn leaves its listener's set when it closes, so that a
// long-lived engine does not keep every connection it ever had.
type exitingConn struct {
	net.Conn
	l *exitingListener
}

func (c *exitingConn) Close() error {
	c.l.mu.Lock()
	delete(c.l.conns, c.Conn)
	c.l.mu.Unlock()
	return c.Conn.Close()
}
