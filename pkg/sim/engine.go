// Package sim is a simulated vLLM fleet: engines whose KV caches are real
// vLLM block pools (pkg/blockpool) and that publish real vLLM-format event
// batches, over NATS with the kvroute headers or over ZeroMQ as vLLM itself
// does (or both), and workloads to drive them.
// It is a model server and knows nothing of the EPP: it imports only the
// events contract it publishes, and pkg/harness puts it beside the EPP.
package sim

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
)

// EngineConfig describes one simulated engine.
type EngineConfig struct {
	// Pod is the pod name; Address the ip:port the gateway routes to.
	Pod, Address string
	// Model is the served base model.
	Model string
	Pool  blockpool.Config
	// Encoding is how event batches are written: vLLM's array form (up to
	// about 0.23) or its map form (0.26 and later).
	Encoding events.Encoding
	// Sink, when set, is handed each step's batch once it is published
	// (made, when the engine publishes nothing), as an event consumer
	// would hand it on: a run in virtual time feeds an index this way,
	// with no transport between, and a relay's mirror beside an engine
	// publishing over NATS follows what it published.
	Sink events.Sink
	// Tokenizer is the model's tokenizer (nil: Words).
	Tokenizer Tokenizer
	// Family gives the engine's metric and event traits (its scheduling
	// is the core's Timing).
	Family Family
	// Role is the engine's llm-d.ai/role label value (RolePrefill,
	// RoleDecode, RoleBoth; "" for none); Transfer its KV transfer (pd.go).
	Role     string
	Transfer Transfer
	// Place is where the engine runs; PlaceOf finds another engine's by
	// its address (nil: places unknown), so that a pull costs the link of
	// their distance (Transfer.ByNear).
	Place   Place
	PlaceOf func(addr string) (Place, bool)
}

// Engine is one simulated vLLM engine. Its methods are safe for concurrent
// use; like a real engine it runs one step at a time.
type Engine struct {
	cfg      EngineConfig
	pub      *events.Publisher
	instance string
	// start is when the engine started, by its pool's clock, from which
	// its family's silence is counted.
	start time.Time

	mu   sync.Mutex
	pool *blockpool.Pool
	buf  []byte
	n    uint64
	zmq  *zmqOut
	// last is the seq of the last batch emitted, valid once emitted.
	last    uint64
	emitted bool
}

// NewEngine returns an engine publishing through pub (nil: not over NATS;
// StartZMQ adds vLLM's own ZeroMQ output).
func NewEngine(cfg EngineConfig, pub *events.Publisher) *Engine {
	return &Engine{
		cfg:      cfg,
		pub:      pub,
		pool:     blockpool.New(cfg.Pool),
		instance: fmt.Sprintf("%s-%d", cfg.Pod, time.Now().UnixNano()),
		start:    cfg.now(),
	}
}

func (cfg EngineConfig) now() time.Time {
	if cfg.Pool.Now != nil {
		return cfg.Pool.Now()
	}
	return time.Now()
}

// silent says whether the engine is still in its family's silence.
func (e *Engine) silent() bool {
	return e.cfg.Family.Silence > 0 && e.cfg.now().Sub(e.start) < e.cfg.Family.Silence
}

// MetricsSilent says whether the engine serves no metrics yet (its
// family's silence, with SilentMetrics).
func (e *Engine) MetricsSilent() bool { return e.cfg.Family.SilentMetrics && e.silent() }

func (e *Engine) tokenizer() Tokenizer {
	if e.cfg.Tokenizer == nil {
		return Words{}
	}
	return e.cfg.Tokenizer
}

// Config returns the engine's configuration.
func (e *Engine) Config() EngineConfig { return e.cfg }

// LastSeq is the sequence number of the last event batch the engine
// emitted; ok is false before the first.
func (e *Engine) LastSeq() (seq uint64, ok bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last, e.emitted
}

// Serve runs one request through the engine: it admits the prompt (hitting
// whatever leading blocks are cached), publishes that step's events, then
// finishes the request, whose blocks stay cached until their slots are
// reused, and publishes again. It returns the number of prompt blocks that
// were cache hits.
func (e *Engine) Serve(req blockpool.Request) (hit int, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if req.ID == "" {
		req.ID = fmt.Sprintf("req-%d", e.n)
	}
	hit, err = e.pool.Allocate(req)
	if err != nil {
		return 0, fmt.Errorf("engine %s: %w", e.cfg.Pod, err)
	}
	if err := e.step(); err != nil {
		return hit, err
	}
	if err := e.pool.Free(req.ID); err != nil {
		return hit, fmt.Errorf("engine %s: %w", e.cfg.Pod, err)
	}
	return hit, e.step()
}

// Held is the engine's ground truth for a prompt: the leading blocks it
// holds and their tiers.
func (e *Engine) Held(req blockpool.Request) blockpool.Held {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.pool.Held(req)
}

// blocks is req's full blocks as the engine hashes them, and the tier
// holding each (blockpool.NotHeld for none).
func (e *Engine) blocks(req blockpool.Request) ([]uint64, []events.Tier) {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.pool.BlockHashes(req)
	return h, e.pool.TiersOf(h)
}

// Usage is the KV usage the engine reports: the share of GPU blocks in
// use by running requests, or (UsageResident) holding any KV.
func (e *Engine) Usage() float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.cfg.Family.Usage == UsageResident {
		return e.pool.ResidentUsage()
	}
	return e.pool.Usage()
}

// step ends an engine step and publishes its batch, if it has one.
func (e *Engine) step() error {
	b, seq, ok := e.pool.Step()
	if !ok || (e.pub == nil && e.zmq == nil && e.cfg.Sink == nil) {
		return nil
	}
	if e.silent() {
		// Lost, as events sent before anyone listens are; the sequence
		// numbers go on, so the first batch heard shows the gap.
		return nil
	}
	e.last, e.emitted = seq, true
	o := e.origin(seq)
	if e.pub != nil || e.zmq != nil {
		var err error
		e.buf, err = events.AppendBatch(e.buf[:0], b, e.cfg.Encoding)
		if err != nil {
			return fmt.Errorf("engine %s: encode batch %d: %w", e.cfg.Pod, seq, err)
		}
	}
	if e.zmq != nil {
		if err := e.zmq.send(seq, e.buf); err != nil {
			return fmt.Errorf("engine %s: %w", e.cfg.Pod, err)
		}
	}
	if e.pub != nil {
		if err := e.pub.Publish(o, e.buf); err != nil {
			return fmt.Errorf("engine %s: publish batch %d: %w", e.cfg.Pod, seq, err)
		}
	}
	// After publishing, so that whatever the sink says of the batch (a
	// heartbeat naming it) follows it on the wire.
	if e.cfg.Sink != nil {
		e.cfg.Sink.Apply(o, b)
	}
	return nil
}

// origin is the contract's description of the engine's batch seq.
func (e *Engine) origin(seq uint64) events.Origin {
	return events.Origin{
		Stream:    events.Stream{Endpoint: e.cfg.Address, DPRank: e.cfg.Pool.DPRank},
		Pod:       e.cfg.Pod,
		Model:     e.cfg.Model,
		Instance:  e.instance,
		BlockSize: e.cfg.Pool.BlockSize,
		Seq:       seq,
	}
}
