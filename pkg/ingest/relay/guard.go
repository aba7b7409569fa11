package relay

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// The ZeroMQ library allocates each frame at the size its header claims and
// collects a message's frames without bound, so one hostile header on the
// relay's port could take the process down. The relay therefore reaches TCP
// endpoints through a transport of its own that reads the ZMTP framing as
// it passes and cuts a connection that announces more than these bounds.
const (
	// MaxMessageBytes bounds one ZeroMQ message, all frames together. A
	// vLLM batch of a 100k-token prefill is well under 1 MiB.
	MaxMessageBytes = 64 << 20
	// maxMessageFrames bounds the frames of one message; vLLM sends 3 or 4.
	maxMessageFrames = 64

	// guardedTCP is the transport name the relay registers; endpoints given
	// as tcp:// are dialled and bound through it.
	guardedTCP = "kvroute-tcp"

	zmtpGreetingLen = 64
	zmtpFlagMore    = 0x01
	zmtpFlagLong    = 0x02
)

// ErrFrameTooLarge is returned by reads on a guarded connection whose peer
// announced a message past MaxMessageBytes or maxMessageFrames.
var ErrFrameTooLarge = errors.New("zeromq message over the relay's bounds")

func init() {
	if err := zmq4.RegisterTransport(guardedTCP, guardTransport{tcp: transport.New("tcp")}); err != nil {
		panic(err) // only if the name is taken, which is a build mistake
	}
}

// guardEndpoint routes a tcp:// endpoint through the guarded transport.
// Other transports (ipc://) are local to the pod and left alone.
func guardEndpoint(ep string) string {
	if rest, ok := strings.CutPrefix(ep, "tcp://"); ok {
		return guardedTCP + "://" + rest
	}
	return ep
}

type guardTransport struct{ tcp transport.Transport }

func (g guardTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := g.tcp.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c}, nil
}

func (g guardTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	l, err := g.tcp.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return guardListener{l}, nil
}

func (g guardTransport) Addr(ep string) (string, error) { return g.tcp.Addr(ep) }

type guardListener struct{ net.Listener }

func (l guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &guardConn{Conn: c}, nil
}

// guardConn checks the ZMTP stream it reads: a 64-byte greeting, then
// frames of [flags, size (1 byte, or 8 if flags has LONG), body]. Commands
// are framed the same way.
type guardConn struct {
	net.Conn
	z zmtpScanner
}

func (c *guardConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		if serr := c.z.scan(p[:n]); serr != nil {
			// Closed here, because the library does not close a connection
			// whose handshake fails.
			_ = c.Conn.Close()
			return 0, serr
		}
	}
	return n, err
}

// zmtpScanner follows ZMTP framing across reads of any size.
type zmtpScanner struct {
	greeting int   // greeting bytes seen
	state    uint8 // what the next byte is
	flags    byte  // flags of the frame being read
	sizeBuf  [8]byte
	sizeLen  int    // size bytes expected in stateSize
	sizeGot  int    // size bytes seen
	body     uint64 // body bytes still to come
	msgBytes uint64 // bytes of the message's frames so far
	frames   int    // frames of the message so far
	err      error
}

const (
	stateFlags uint8 = iota
	stateSize
	stateBody
)

func (z *zmtpScanner) scan(p []byte) error {
	if z.err != nil {
		return z.err
	}
	for len(p) > 0 {
		if z.greeting < zmtpGreetingLen {
			n := min(len(p), zmtpGreetingLen-z.greeting)
			z.greeting += n
			p = p[n:]
			continue
		}
		switch z.state {
		case stateFlags:
			z.flags = p[0]
			p = p[1:]
			z.sizeLen, z.sizeGot = 1, 0
			if z.flags&zmtpFlagLong != 0 {
				z.sizeLen = 8
			}
			z.state = stateSize
		case stateSize:
			n := min(len(p), z.sizeLen-z.sizeGot)
			copy(z.sizeBuf[8-z.sizeLen+z.sizeGot:], p[:n])
			z.sizeGot += n
			p = p[n:]
			if z.sizeGot < z.sizeLen {
				continue
			}
			size := binary.BigEndian.Uint64(z.sizeBuf[:])
			z.sizeBuf = [8]byte{}
			z.frames++
			if size > MaxMessageBytes || z.msgBytes+size > MaxMessageBytes || z.frames > maxMessageFrames {
				z.err = fmt.Errorf("%w: frame %d of %d bytes after %d bytes", ErrFrameTooLarge, z.frames, size, z.msgBytes)
				return z.err
			}
			z.msgBytes += size
			z.body = size
			z.state = stateBody
			if size == 0 {
				z.endFrame()
			}
		case stateBody:
			n := uint64(len(p))
			if n >= z.body {
				p = p[z.body:]
				z.body = 0
				z.endFrame()
				continue
			}
			z.body -= n
			p = nil
		}
	}
	return nil
}

func (z *zmtpScanner) endFrame() {
	if z.flags&zmtpFlagMore == 0 {
		z.msgBytes, z.frames = 0, 0
	}
	z.state = stateFlags
}
