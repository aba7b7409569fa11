package chaos

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
)

// Proxy is a TCP proxy between NATS clients and a server that can lose
// what the clients publish on kv.events subjects, as a lossy path between a
// relay and NATS would (Every), and hold everything they send, as a
// partition would (Paused). What the server sends passes unchanged.
type Proxy struct {
	ln     net.Listener
	target string
	// Every drops one publish on a kv.events subject in every Every (1:
	// all of them); 0 drops none.
	Every atomic.Int64
	// DropBatches drops every event batch but lets heartbeats through, as
	// a loss that only the heartbeats can reveal.
	DropBatches atomic.Bool
	// Paused holds everything the clients send until it is cleared.
	Paused  atomic.Bool
	n       atomic.Int64
	dropped atomic.Int64
	closed  atomic.Bool
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

// NewProxy listens on a loopback port and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos proxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the NATS URL clients dial to go through the proxy.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

// Dropped is how many publishes the proxy has dropped.
func (p *Proxy) Dropped() int64 { return p.dropped.Load() }

// Close stops the proxy and every connection through it.
func (p *Proxy) Close() {
	p.closed.Store(true)
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(c, s)
			_ = c.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.filter(c, s)
			_ = s.Close()
		}()
	}
}

// filter copies the client's protocol to the server, leaving out the
// chosen publishes: PUB/HPUB lines are parsed for their payload size so
// that the whole message is skipped.
func (p *Proxy) filter(c, s net.Conn) {
	r := bufio.NewReaderSize(c, 1<<16)
	wr := bufio.NewWriterSize(s, 1<<16)
	flush := func() bool { return r.Buffered() != 0 || wr.Flush() == nil }
	for {
		for p.Paused.Load() && !p.closed.Load() {
			time.Sleep(2 * time.Millisecond)
		}
		line, err := r.ReadSlice('\n')
		if err != nil {
			return
		}
		f := strings.Fields(string(line))
		if len(f) < 3 || (f[0] != "PUB" && f[0] != "HPUB") {
			if _, err := wr.Write(line); err != nil || !flush() {
				return
			}
			continue
		}
		total, err := strconv.Atoi(f[len(f)-1])
		if err != nil || total < 0 || total > 64<<20 {
			return
		}
		head := append([]byte(nil), line...)
		body := make([]byte, total+2)
		if _, err := io.ReadFull(r, body); err != nil {
			return
		}
		if strings.HasPrefix(f[1], events.SubjectPrefix+".") {
			if every := p.Every.Load(); every > 0 && p.n.Add(1)%every == 0 {
				p.dropped.Add(1)
				continue
			}
			if p.DropBatches.Load() && !bytes.Contains(body, []byte(events.HeaderHeartbeat)) {
				p.dropped.Add(1)
				continue
			}
		}
		if _, err := wr.Write(head); err != nil {
			return
		}
		if _, err := wr.Write(body); err != nil || !flush() {
			return
		}
	}
}
