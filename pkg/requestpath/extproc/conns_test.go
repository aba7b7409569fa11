package extproc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// rawClient speaks HTTP/2 to the ext_proc server frame by frame, as a
// hostile client would: it opens Process streams, announces a gRPC
// message of a chosen length and sends its bytes as fast as the server's
// windows allow, one byte short of the end, so that the server holds
// them and never sees the message.
type rawClient struct {
	c  net.Conn
	fr *http2.Framer

	wmu sync.Mutex // serialises writes

	mu       sync.Mutex
	cond     *sync.Cond
	connWin  int64
	initWin  int64
	winDelta map[uint32]int64 // window updates per stream
	ended    map[uint32]bool  // reset, or ended with trailers
	pings    int
	settings bool
	goaway   bool
	err      error // why reading stopped
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	rc := &rawClient{c: c, fr: http2.NewFramer(c, c), connWin: 65535, initWin: 65535,
		winDelta: map[uint32]int64{}, ended: map[uint32]bool{}}
	rc.cond = sync.NewCond(&rc.mu)
	_, err = io.WriteString(c, http2.ClientPreface)
	if err == nil {
		err = rc.fr.WriteSettings()
	}
	if err != nil {
		// The server closed the connection at once: a refusal, which
		// the test reads from rc.err.
		rc.err = err
		return rc
	}
	go rc.read()
	return rc
}

// read follows the server's frames: settings, windows, pings, ends; it
// acknowledges settings and pings, as a client must.
func (rc *rawClient) read() {
	for {
		f, err := rc.fr.ReadFrame()
		rc.mu.Lock()
		if err != nil {
			rc.err = err
			rc.cond.Broadcast()
			rc.mu.Unlock()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					rc.initWin = int64(v)
				}
				rc.settings = true
				rc.wmu.Lock()
				_ = rc.fr.WriteSettingsAck()
				rc.wmu.Unlock()
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				rc.connWin += int64(f.Increment)
			} else {
				rc.winDelta[f.StreamID] += int64(f.Increment)
			}
		case *http2.PingFrame:
			if f.IsAck() {
				rc.pings++
			} else {
				rc.wmu.Lock()
				_ = rc.fr.WritePing(true, f.Data)
				rc.wmu.Unlock()
			}
		case *http2.GoAwayFrame:
			rc.goaway = true
		case *http2.RSTStreamFrame:
			rc.ended[f.StreamID] = true
		case *http2.HeadersFrame:
			if f.StreamEnded() {
				rc.ended[f.StreamID] = true
			}
		}
		rc.cond.Broadcast()
		rc.mu.Unlock()
	}
}

// The methods the raw client calls.
const (
	processPath     = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
	healthCheckPath = "/grpc.health.v1.Health/Check"
)

// grpcHeaders is a call's request header block, with extra fields.
func grpcHeaders(path string, extra ...hpack.HeaderField) []byte {
	var b bytes.Buffer
	e := hpack.NewEncoder(&b)
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":authority", "ext-proc"},
		{":path", path},
		{"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		_ = e.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for _, f := range extra {
		_ = e.WriteField(f)
	}
	return b.Bytes()
}

// open opens stream id: HTTP/2 wants a connection's streams opened in
// the order of their ids. The header block goes in frames of 16 KiB at
// most, HTTP/2's least frame size.
func (rc *rawClient) open(id uint32, extra ...hpack.HeaderField) error {
	return rc.openPath(id, processPath, extra...)
}

// openPath opens stream id calling the method at path.
func (rc *rawClient) openPath(id uint32, path string, extra ...hpack.HeaderField) error {
	rc.wmu.Lock()
	defer rc.wmu.Unlock()
	block := grpcHeaders(path, extra...)
	const maxFrame = 16 << 10
	first := block[:min(len(block), maxFrame)]
	block = block[len(first):]
	if err := rc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0}); err != nil {
		return err
	}
	for len(block) > 0 {
		frag := block[:min(len(block), maxFrame)]
		block = block[len(frag):]
		if err := rc.fr.WriteContinuation(id, len(block) == 0, frag); err != nil {
			return err
		}
	}
	return nil
}

// endedStream waits until the server has ended stream id or read every
// frame sent before, and says whether it ended the stream.
func (rc *rawClient) endedStream(t *testing.T, id uint32) bool {
	t.Helper()
	if err := rc.sync(); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.ended[id]
}

// send announces a message of length bytes on stream id and sends all
// of it but its last byte in frames of frame bytes, as the windows allow.
// It returns the bytes sent, or fewer when the server ended the stream
// first.
func (rc *rawClient) send(id uint32, length, frame int) (int, error) {
	msg := make([]byte, 5+length-1)
	binary.BigEndian.PutUint32(msg[1:5], uint32(length))
	sent := 0
	for sent < len(msg) {
		rc.mu.Lock()
		for {
			avail := min(rc.connWin, rc.initWin+rc.winDelta[id]-int64(sent))
			if rc.ended[id] || rc.err != nil {
				rc.mu.Unlock()
				return sent, rc.err
			}
			if avail > 0 {
				n := min(int(avail), frame, len(msg)-sent)
				rc.connWin -= int64(n)
				rc.mu.Unlock()
				rc.wmu.Lock()
				err := rc.fr.WriteData(id, false, msg[sent:sent+n])
				rc.wmu.Unlock()
				if err != nil {
					return sent, err
				}
				sent += n
				break
			}
			rc.cond.Wait()
		}
	}
	return sent, nil
}

// sync returns once the server has read every frame sent before it: it
// answers a ping in order.
func (rc *rawClient) sync() error {
	rc.mu.Lock()
	want := rc.pings + 1
	rc.mu.Unlock()
	rc.wmu.Lock()
	err := rc.fr.WritePing(false, [8]byte{1})
	rc.wmu.Unlock()
	if err != nil {
		return err
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for rc.pings < want && rc.err == nil {
		rc.cond.Wait()
	}
	return rc.err
}

// closed waits for the server to close the connection, and says
// whether it sent a GOAWAY first.
func (rc *rawClient) closed() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for rc.err == nil {
		rc.cond.Wait()
	}
	return rc.goaway
}

// Hostile clients fill every connection the server allows with streams
// that each announce a large message and send all of it but its last
// byte, as fast as the server's windows let them; half announce more than
// the message bound. The server's heap grows by no more than the bound
// docs/security.md states (per connection, per stream, per message in
// progress), the over-long messages are refused before they are read, a
// connection past the cap is closed at once, and a request on the
// gateway's connection is routed meanwhile.
func TestConnectionsAndLargeMessagesStayWithinTheirBound(t *testing.T) {
	const (
		attackers  = 12
		perConn    = 8
		maxMessage = 256 << 10
		oversized  = 4 << 20 // gRPC's own default bound
		frame      = 4 << 10
	)
	s, c, reg := startServer(t, plainDirector(t, 2), extproc.Options{
		Plaintext: true, MaxBodyBytes: 128 << 10, MaxInFlightBytes: 2 << 20,
		MaxConns: attackers + 1, MaxStreamsPerConn: perConn, MaxStreams: attackers*perConn + 10,
		MaxMessageBytes: maxMessage,
	})
	route := func(when string) {
		res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: completion(tokens(1, 16), false)}, nil)
		if err != nil || res.Immediate != nil || res.Destination == "" {
			t.Fatalf("%s: %+v %v", when, res, err)
		}
	}
	route("before the attack") // the gateway's connection, the first of the cap
	before := testkit.LiveHeap()

	addr := s.Addr()
	clients := make([]*rawClient, attackers)
	for i := range clients {
		clients[i] = dialRaw(t, addr)
	}
	type result struct {
		sent, want int
		err        error
	}
	results := make(chan result, attackers*perConn)
	var wg sync.WaitGroup
	for _, rc := range clients {
		for s := range perConn {
			if err := rc.open(uint32(2*s + 1)); err != nil {
				t.Fatal(err)
			}
		}
		for s := range perConn {
			length := maxMessage
			if s%2 == 1 {
				length = oversized
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				sent, err := rc.send(uint32(2*s+1), length, frame)
				results <- result{sent, length + 4, err}
			}()
		}
	}
	wg.Wait()
	close(results)
	held := 0
	for r := range results {
		switch {
		case r.err != nil:
			t.Fatalf("an attacker's stream: %v", r.err)
		case r.want == maxMessage+4 && r.sent != r.want:
			t.Fatalf("a stream within the bound sent %d bytes of %d: the server stopped it", r.sent, r.want)
		case r.want == oversized+4 && r.sent >= maxMessage:
			t.Fatalf("a stream announcing %d bytes sent %d: the server read past its bound of %d", oversized, r.sent, maxMessage)
		case r.want == maxMessage+4:
			held++
		}
	}
	for _, rc := range clients {
		if err := rc.sync(); err != nil {
			t.Fatal(err)
		}
		// gRPC's bandwidth-delay estimate would have raised the windows
		// by now, with the settings frame the client reads.
		rc.mu.Lock()
		win := rc.initWin
		rc.mu.Unlock()
		if win != extproc.DefaultWindowBytes {
			t.Fatalf("a stream's window is %d bytes, want it fixed at %d", win, extproc.DefaultWindowBytes)
		}
	}

	// One connection more than the cap is closed before the server says
	// anything.
	extra := dialRaw(t, addr)
	if err := extra.sync(); err == nil || extra.settings {
		t.Fatalf("a connection past the cap of %d: got the server's settings (%v), want it closed", attackers+1, err)
	}
	testkit.WaitFor(t, "the connection past the cap to be counted", func() error {
		if got := testkit.Value(t, reg, "kvroute_extproc_refused_total", "reason", "conns"); got != 1 {
			return fmt.Errorf("%v refused for the connection cap, want 1", got)
		}
		if got := testkit.Value(t, reg, "kvroute_extproc_connections"); got != attackers+1 {
			return fmt.Errorf("%v connections open, want %d", got, attackers+1)
		}
		return nil
	})
	route("during the attack")

	growth := testkit.LiveHeap() - before
	streams := int64(attackers * perConn)
	bound := attackers*extproc.ConnBytes + streams*(perStreamSlack+extproc.DefaultWindowBytes+extproc.MaxHeaderListBytes) +
		int64(held)*maxMessage*heldBytesPerByte
	t.Logf("heap +%d KiB with %d connections, %d streams and %d messages of %d KiB in progress; bound %d KiB",
		growth>>10, attackers, streams, held, maxMessage>>10, bound>>10)
	if growth > bound {
		t.Errorf("the heap grew by %d bytes, more than the bound of %d", growth, bound)
	}
	// The messages in progress are really held: a server that read none
	// would pass the bound above without bounding anything.
	if min := int64(held) * maxMessage * 3 / 4; growth < min {
		t.Errorf("the heap grew by %d bytes, less than the %d bytes of the messages in progress", growth, min)
	}
}

// heldBytesPerByte is what gRPC holds per byte of a message in progress
// sent in frames of 4 KiB: each frame's buffer, rounded up to a power of
// two by the buffer pool, and its list entries.
const heldBytesPerByte = 2

// gRPC reads a unary call's request before any handler runs, so health
// checks whose requests never end would hold their messages outside a
// cap taken by the ext_proc handler. The stream cap counts the streams of
// every method from their headers: past it, a Process stream is refused
// while health checks hold every place, and once they end a Process
// stream is taken again.
func TestTheStreamCapCountsEveryMethodsStreams(t *testing.T) {
	t.Parallel()
	const limit = 6
	s, _, reg := startServer(t, plainDirector(t, 1), extproc.Options{Plaintext: true, MaxStreams: limit})
	rc := dialRaw(t, s.Addr())
	results := make(chan error, limit)
	for i := range limit {
		id := uint32(2*i + 1)
		if err := rc.openPath(id, healthCheckPath); err != nil {
			t.Fatal(err)
		}
		go func() {
			_, err := rc.send(id, 64<<10, 4<<10)
			results <- err
		}()
	}
	for range limit {
		if err := <-results; err != nil {
			t.Fatal(err)
		}
	}
	past := uint32(2*limit + 1)
	if err := rc.open(past); err != nil {
		t.Fatal(err)
	}
	if !rc.endedStream(t, past) {
		t.Fatalf("a Process stream past %d health checks in progress was taken, want it refused", limit)
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_refused_total", "reason", "streams"); got != 1 {
		t.Fatalf("refused_total{streams} = %v, want 1", got)
	}
	for i := range limit {
		rc.wmu.Lock()
		err := rc.fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel)
		rc.wmu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitFor(t, "a Process stream to be taken once the health checks end", func() error {
		past += 2
		if err := rc.open(past); err != nil {
			return err
		}
		if rc.endedStream(t, past) {
			return fmt.Errorf("stream %d refused", past)
		}
		return nil
	})
}

// The plaintext health listener answers probes: a health check that
// announces a request of 1 MiB is refused from its prefix, and gets no
// more than its first window in, where gRPC's own bound of 4 MiB would
// open the window to the whole request.
func TestTheHealthListenerTakesOnlyProbeSizedRequests(t *testing.T) {
	t.Parallel()
	s, _, _ := startServer(t, plainDirector(t, 1), extproc.Options{Plaintext: true, HealthAddr: "127.0.0.1:0"})
	rc := dialRaw(t, s.HealthAddr())
	if err := rc.openPath(1, healthCheckPath); err != nil {
		t.Fatal(err)
	}
	const announced = 1 << 20
	sent, err := rc.send(1, announced, 4<<10)
	if err != nil {
		t.Fatal(err)
	}
	if sent > extproc.DefaultWindowBytes {
		t.Fatalf("a health check announcing %d bytes sent %d: the server read past its first window", announced, sent)
	}
}

// A stream's header list is held for the stream's life: gRPC's own bound
// is 16 MiB. A list past MaxHeaderListBytes is refused before the stream
// starts; one within it is served.
func TestHeaderListsPastTheirBoundAreRefused(t *testing.T) {
	t.Parallel()
	s, _, reg := startServer(t, plainDirector(t, 1), extproc.Options{Plaintext: true})
	rc := dialRaw(t, s.Addr())
	field := func(n int) hpack.HeaderField {
		return hpack.HeaderField{Name: "x-filler", Value: strings.Repeat("a", n)}
	}
	if err := rc.open(1, field(extproc.MaxHeaderListBytes/2)); err != nil {
		t.Fatal(err)
	}
	if rc.endedStream(t, 1) {
		t.Fatalf("a stream with %d bytes of headers was ended", extproc.MaxHeaderListBytes/2)
	}
	testkit.WaitFor(t, "the stream within the bound to start", func() error {
		if got := testkit.Value(t, reg, "kvroute_extproc_active_streams"); got != 1 {
			return fmt.Errorf("%v streams open, want 1", got)
		}
		return nil
	})
	// x/net's framer ends the whole connection over a header block so
	// much larger than the bound; either end is a refusal.
	over := dialRaw(t, s.Addr())
	if err := over.open(1, field(4*extproc.MaxHeaderListBytes)); err == nil {
		// The server reads frames in order: once it answers a ping, it
		// has ended the stream or the connection, or taken the stream.
		if err := over.sync(); err == nil && !over.endedStream(t, 1) {
			t.Fatalf("a stream with %d bytes of headers was not refused", 4*extproc.MaxHeaderListBytes)
		}
	}
	if got := testkit.Value(t, reg, "kvroute_extproc_active_streams"); got != 1 {
		t.Fatalf("%v streams open after the refusal, want 1", got)
	}
}

// A connection with no stream open is closed after the idle timeout,
// with a GOAWAY first, and gives its place under the cap back.
func TestIdleConnectionsAreClosed(t *testing.T) {
	t.Parallel()
	s, _, reg := startServer(t, plainDirector(t, 1), extproc.Options{
		Plaintext: true, MaxConns: 2, IdleTimeout: 50 * time.Millisecond,
	})
	rc := dialRaw(t, s.Addr())
	if !rc.closed() {
		t.Fatal("the idle connection was closed without a GOAWAY")
	}
	testkit.WaitFor(t, "the idle connections to give their places back", func() error {
		// The test's own gRPC client idles too.
		if got := testkit.Value(t, reg, "kvroute_extproc_connections"); got != 0 {
			return fmt.Errorf("%v connections open, want 0", got)
		}
		return nil
	})
}
