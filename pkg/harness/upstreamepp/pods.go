package upstreamepp

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// MaxPods is how many engines PodListeners can place: 127.0.0.2 to
// 127.0.0.254.
const MaxPods = 253

// PodListeners are the listeners of a fleet whose engine i listens on
// 127.0.0.(i+2), all on one port, as pods of a pool do: what an
// InferencePool's one target port and its pods' IPs describe. Every
// address in 127.0.0.0/8 reaches this machine on Linux.
type PodListeners struct {
	// Port is every engine's port.
	Port int

	mu    sync.Mutex
	lns   []net.Listener
	taken []bool
}

// ListenPods binds n listeners on one port; it tries a few ports, since a
// port free on 127.0.0.2 may be taken on another address.
func ListenPods(n int) (*PodListeners, error) {
	if n <= 0 || n > MaxPods {
		return nil, fmt.Errorf("upstreamepp: %d pods; 1 to %d fit in 127.0.0.2-254", n, MaxPods)
	}
	var last error
	for range 20 {
		p, err := listenPods(n)
		if err == nil {
			return p, nil
		}
		last = err
	}
	return nil, fmt.Errorf("upstreamepp: no port free on all of 127.0.0.2-%s: %w", PodIP(n-1), last)
}

func listenPods(n int) (*PodListeners, error) {
	first, err := net.Listen("tcp", net.JoinHostPort(PodIP(0), "0"))
	if err != nil {
		return nil, err
	}
	p := &PodListeners{Port: first.Addr().(*net.TCPAddr).Port, lns: []net.Listener{first}, taken: make([]bool, n)}
	for i := 1; i < n; i++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(PodIP(i), strconv.Itoa(p.Port)))
		if err != nil {
			p.Close()
			return nil, err
		}
		p.lns = append(p.lns, ln)
	}
	return p, nil
}

// PodIP is engine i's address.
func PodIP(i int) string { return fmt.Sprintf("127.0.0.%d", i+2) }

// Addr is engine i's address and port.
func (p *PodListeners) Addr(i int) string { return net.JoinHostPort(PodIP(i), strconv.Itoa(p.Port)) }

// Len is the number of engines.
func (p *PodListeners) Len() int { return len(p.taken) }

// Listen hands out engine i's listener, once: sim.FleetConfig.Listen.
// The taker closes it.
func (p *PodListeners) Listen(i int) (net.Listener, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i < 0 || i >= len(p.lns) {
		return nil, fmt.Errorf("upstreamepp: engine %d of %d pod addresses", i, len(p.lns))
	}
	if p.taken[i] {
		return nil, fmt.Errorf("upstreamepp: engine %d's listener was already taken", i)
	}
	p.taken[i] = true
	return p.lns[i], nil
}

// Close closes the listeners no one took.
func (p *PodListeners) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for i, ln := range p.lns {
		if i < len(p.taken) && p.taken[i] {
			continue
		}
		p.taken[i] = true
		errs = append(errs, ln.Close())
	}
	return errors.Join(errs...)
}
