package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// FleetConfig shapes a fleet of cores, each behind its own HTTP server
// on loopback.
type FleetConfig struct {
	Engines int
	Model   string
	// PodPrefix names the pods: <PodPrefix>-<i> (default "vllm").
	PodPrefix string
	// Pool is every engine's block pool (Seed is made per engine).
	Pool   blockpool.Config
	Timing Timing
	// Speeds, when set, makes the fleet heterogeneous: engine i runs
	// Timing.Scaled(Speeds[i%len(Speeds)]), so that 0.5 is an engine half
	// as fast as the others.
	Speeds []float64
	// Encoding is the event batches' form; MixedEncodings alternates array
	// and map forms across the fleet, as a fleet mid-upgrade would.
	Encoding       events.Encoding
	MixedEncodings bool
	// Publisher carries events onto NATS; nil publishes nothing.
	Publisher *events.Publisher
	// Sidecar, when set, gives each engine what runs beside it (a relay's
	// snapshot service and heartbeats, for engines publishing straight to
	// NATS): it hears the engine's batches as its Sink and runs until the
	// fleet stops.
	Sidecar func(EngineConfig) Sidecar
	// Tokenizer is the model's tokenizer (nil: Words).
	Tokenizer Tokenizer
	// Host is the listen host (default 127.0.0.1).
	Host string
	// Listen, when set, opens engine i's listener in place of Host:0: a
	// fleet whose engines each have an address of their own and one port,
	// as pods do. The fleet closes what it returns.
	Listen func(i int) (net.Listener, error)
	// ZMQ, when set, gives engine i's ZeroMQ output (nil: none).
	ZMQ func(i int) *ZMQConfig
	// Family is every engine's family (zero: vLLM's).
	Family Family
	// Roles, when set, gives engine i the role Roles[i%len(Roles)]; every
	// engine transfers KV as Transfer says.
	Roles    []string
	Transfer Transfer
	// Places, when set, puts engine i at Places[i%len(Places)], and each
	// pull between engines costs the link of their distance
	// (Transfer.ByNear).
	Places []Place
	// Front, when set, may put a server in front of engine i (llm-d's P/D
	// sidecar before a decode engine): given the engine's configuration
	// and its own address, it returns the address the pool routes to,
	// which the engine then publishes as its endpoint, and what runs until
	// the fleet stops (nil with nothing in front).
	Front func(ecfg EngineConfig, engineAddr string) (addr string, run func(context.Context) error, err error)
	// DataParallel, when above 1, makes each engine a data-parallel one
	// of that many ranks behind its one API server (dp.go): each rank its
	// own block pool, scheduler and event stream, at the engine's address
	// (ZMQ, when set, is rank 0's output alone).
	DataParallel int
}

// Fleet is a running set of cores and their servers. Close stops them.
type Fleet struct {
	Servers []*Server

	engines []*Engine // with ZeroMQ outputs to close
	places  places
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	err     error
}

// EngineConfig is the configuration of the fleet's engine i, serving at
// addr: its pod name, its block pool's own seed, its event encoding.
func (cfg FleetConfig) EngineConfig(i int, addr string) EngineConfig {
	prefix := cfg.PodPrefix
	if prefix == "" {
		prefix = "vllm"
	}
	pool := cfg.Pool
	pool.Seed = pool.Seed*1000 + uint64(i) + 1
	enc := cfg.Encoding
	if cfg.MixedEncodings && i%2 == 1 {
		enc = events.EncodingMap
	}
	role := ""
	if len(cfg.Roles) > 0 {
		role = cfg.Roles[i%len(cfg.Roles)]
	}
	return EngineConfig{Pod: fmt.Sprintf("%s-%d", prefix, i), Address: addr, Model: cfg.Model, Pool: pool, Encoding: enc, Tokenizer: cfg.Tokenizer,
		Family: cfg.Family, Role: role, Transfer: cfg.Transfer, Place: cfg.placeOf(i)}
}

// placeOf is engine i's place (none without Places).
func (cfg FleetConfig) placeOf(i int) Place {
	if len(cfg.Places) == 0 {
		return Place{}
	}
	return cfg.Places[i%len(cfg.Places)]
}

// Sidecar is what runs beside one engine of a fleet.
type Sidecar interface {
	events.Sink
	// Run returns when ctx ends, or with an error if it cannot run.
	Run(ctx context.Context) error
}

// TimingOf is engine i's timing: the fleet's, as its family runs it (a
// drawn family's costs drawn from the pools' seed), scaled by its speed.
func (cfg FleetConfig) TimingOf(i int) Timing {
	t := cfg.Family.Timing(cfg.Timing, cfg.Pool.Seed, i)
	if len(cfg.Speeds) == 0 {
		return t
	}
	return t.Scaled(cfg.Speeds[i%len(cfg.Speeds)])
}

// StartFleet starts the fleet's scheduler loops and servers; they run until
// Close or until ctx is done.
func StartFleet(ctx context.Context, cfg FleetConfig) (*Fleet, error) {
	if cfg.Engines <= 0 {
		return nil, errors.New("sim: a fleet needs at least one engine")
	}
	if cfg.Host == "" {
		cfg.Host = "127.0.0.1"
	}
	if cfg.DataParallel > MaxDPRanks {
		return nil, fmt.Errorf("sim: %d data-parallel ranks, at most %d", cfg.DataParallel, MaxDPRanks)
	}
	ctx, cancel := context.WithCancel(ctx)
	f := &Fleet{cancel: cancel}
	for i := range cfg.Engines {
		ln, err := cfg.listen(i)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: listen: %w", err)
		}
		ecfg := cfg.EngineConfig(i, ln.Addr().String())
		if len(cfg.Places) > 0 {
			// Pulls name the prefill engine by its own address.
			f.places.set(ln.Addr().String(), ecfg.Place)
			ecfg.PlaceOf = f.places.of
		}
		if cfg.Front != nil {
			addr, run, err := cfg.Front(ecfg, ln.Addr().String())
			if err != nil {
				_ = ln.Close()
				f.Close()
				return nil, fmt.Errorf("sim: front of engine %d: %w", i, err)
			}
			ecfg.Address = addr
			if run != nil {
				f.wg.Add(1)
				go func() { defer f.wg.Done(); f.record(run(ctx)) }()
			}
		}
		ranks := max(cfg.DataParallel, 1)
		cores := make([]*Core, 0, ranks)
		for rank := range ranks {
			rcfg := ecfg
			if ranks > 1 {
				rcfg.Pool.DPRank = rank
				// Each rank is an engine process with its own hash seed.
				rcfg.Pool.Seed = ecfg.Pool.Seed*MaxDPRanks + uint64(rank)
			}
			var side Sidecar
			if cfg.Sidecar != nil {
				side = cfg.Sidecar(rcfg)
				rcfg.Sink = side
			}
			eng := NewEngine(rcfg, cfg.Publisher)
			if cfg.ZMQ != nil && rank == 0 {
				if z := cfg.ZMQ(i); z != nil {
					if err := eng.StartZMQ(*z); err != nil {
						_ = ln.Close()
						f.Close()
						return nil, err
					}
					f.engines = append(f.engines, eng)
				}
			}
			rep := NewCore(eng, cfg.TimingOf(i))
			cores = append(cores, rep)
			if side != nil {
				f.wg.Add(1)
				go func() { defer f.wg.Done(); f.record(side.Run(ctx)) }()
			}
			f.wg.Add(1)
			go func() { defer f.wg.Done(); f.record(rep.Run(ctx)) }()
		}
		srv := NewServer(cores[0], ln)
		if len(cores) > 1 {
			srv = NewDPServer(cores, ln)
		}
		f.Servers = append(f.Servers, srv)
		f.wg.Add(1)
		go func() { defer f.wg.Done(); f.record(srv.Run(ctx)) }()
	}
	return f, nil
}

func (cfg FleetConfig) listen(i int) (net.Listener, error) {
	if cfg.Listen != nil {
		return cfg.Listen(i)
	}
	return net.Listen("tcp", net.JoinHostPort(cfg.Host, "0"))
}

func (f *Fleet) record(err error) {
	if err == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
	}
}

// Cores are the fleet's cores, in server order.
func (f *Fleet) Cores() []*Core {
	out := make([]*Core, len(f.Servers))
	for i, s := range f.Servers {
		out[i] = s.r
	}
	return out
}

// Close stops every core and server and returns the first error any of
// them ended with.
func (f *Fleet) Close() error {
	f.cancel()
	f.wg.Wait()
	for _, e := range f.engines {
		f.record(e.Close())
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}
