// Package demo is what `make run` shows: a simulated vLLM fleet publishing
// real KV events over NATS into a running EPP, a shared-prefix workload
// routed by the EPP's prefix answers, and a running check that the index
// agrees with the engines' true caches.
package demo

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/blockpool"
	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/sim"
)

// Options shape the demo.
type Options struct {
	Engines int
	// Duration is how long traffic runs; 0 runs until ctx is done.
	Duration time.Duration
	// Model is the model the simulated fleet serves.
	Model string
	Out   io.Writer
}

// Run starts the fleet against e (which must be running), drives traffic,
// and prints what happens until Duration passes or ctx is done.
func Run(ctx context.Context, e *epp.EPP, o Options) error {
	if o.Engines <= 0 {
		o.Engines = 4
	}
	if o.Model == "" {
		o.Model = "demo-model"
	}
	if o.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Duration)
		defer cancel()
	}
	nc, err := nats.Connect(e.NATSURL(), nats.Name("kvroute-demo-fleet"))
	if err != nil {
		return fmt.Errorf("demo: connect fleet to NATS: %w", err)
	}
	defer nc.Close()

	ns, pool := e.Namespace(), e.Pool()
	pub := events.NewPublisher(nc, ns, pool)
	engines := make([]*sim.Engine, o.Engines)
	for i := range engines {
		cfg := sim.EngineConfig{
			Pod:     fmt.Sprintf("vllm-demo-%d", i),
			Address: fmt.Sprintf("10.0.0.%d:8000", i+1),
			Model:   o.Model,
			Pool:    blockpool.Config{BlockSize: 16, GPUBlocks: 1024, CPUBlocks: 512, Seed: uint64(i + 1)},
		}
		if i%2 == 1 {
			// Half the fleet speaks vLLM 0.26's map form, half the older
			// array form: the decoder takes both.
			cfg.Encoding = events.EncodingMap
		}
		engines[i] = sim.NewEngine(cfg, pub)
		e.Datastore().Upsert(&datalayer.Endpoint{
			Name: cfg.Pod, Address: cfg.Address, Pod: cfg.Pod, Namespace: ns, Model: o.Model,
		})
	}
	fmt.Fprintf(o.Out, "fleet: %d simulated vLLM engines (block size 16, 1024 GPU + 512 CPU blocks each) publishing on %s\n",
		len(engines), events.PoolSubject(ns, pool))
	fmt.Fprintf(o.Out, "EPP: metrics and /debug/prefix on http://%s\n\n", e.HTTPAddr())

	tail := &tailSink{}
	tailer, err := events.NewConsumer(nc, events.ConsumerOptions{Namespace: ns, Pool: pool, Workers: 1}, tail, nil)
	if err != nil {
		return fmt.Errorf("demo: tail consumer: %w", err)
	}
	var wg sync.WaitGroup
	tctx, tcancel := context.WithCancel(context.Background())
	wg.Add(1)
	go func() { defer wg.Done(); _ = tailer.Run(tctx) }()
	defer func() { tcancel(); wg.Wait() }()

	prompts := sim.SharedPrefix{Groups: 12, PromptsPerGroup: 40, SystemTokens: 768, QuestionTokens: 96, Seed: 7}.Prompts()
	var served, hitBlocks, totalBlocks atomic.Int64
	start := time.Now()
	report := time.NewTicker(3 * time.Second)
	defer report.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			fmt.Fprintf(o.Out, "\ndone: %d requests in %s, prefix cache hit rate %.1f%%\n", served.Load(),
				time.Since(start).Round(time.Second), pct(hitBlocks.Load(), totalBlocks.Load()))
			return nil
		case <-report.C:
			check := agreement(ctx, e, engines, prompts, o.Model)
			fmt.Fprintf(o.Out, "t=%-4s requests=%-5d hit-rate=%5.1f%%  events: %s\n       index vs engines' true caches: %s\n",
				time.Since(start).Round(time.Second), served.Load(), pct(hitBlocks.Load(), totalBlocks.Load()), tail.summary(), check)
		default:
		}
		p := prompts[i%len(prompts)]
		target, err := route(ctx, e, engines, p, o.Model)
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return err
		}
		hit, err := target.Serve(p)
		if err != nil {
			return err
		}
		// The engines are in-process, so their load is read directly where
		// a real deployment scrapes /metrics.
		now := time.Now()
		for _, eng := range engines {
			e.Datastore().SetMetrics(eng.Config().Pod, datalayer.Metrics{KVCacheUsage: eng.Usage(), UpdateTime: now})
		}
		served.Add(1)
		hitBlocks.Add(int64(hit))
		totalBlocks.Add(int64(len(p.Tokens) / 16))
		time.Sleep(2 * time.Millisecond)
	}
}

// route asks the EPP's director, which runs PrepareData and the configured
// scheduler, where the prompt should go.
func route(ctx context.Context, e *epp.EPP, engines []*sim.Engine, p blockpool.Request, model string) (*sim.Engine, error) {
	pick, err := e.Director().Route(ctx, &request.Request{Model: model, TokenIDs: p.Tokens}, nil)
	if err != nil {
		return nil, fmt.Errorf("demo: route: %w", err)
	}
	eng := byAddress(engines, pick.Targets[0])
	if eng == nil {
		return nil, fmt.Errorf("demo: the EPP picked %s, which is not in the fleet", pick.Targets[0])
	}
	return eng, nil
}

func byAddress(engines []*sim.Engine, addr string) *sim.Engine {
	for _, e := range engines {
		if e.Config().Address == addr {
			return e
		}
	}
	return nil
}

// agreement compares the index's answer for a sample of prompts with every
// engine's ground truth, after giving in-flight events a moment to land.
func agreement(ctx context.Context, e *epp.EPP, engines []*sim.Engine, prompts []blockpool.Request, model string) string {
	time.Sleep(100 * time.Millisecond)
	agree, total := 0, 0
	var firstMiss string
	for i := 0; i < len(prompts); i += max(1, len(prompts)/48) {
		p := prompts[i]
		ans, err := e.Lookup(ctx, epp.PrefixQuery{Model: model, TokenIDs: p.Tokens})
		if err != nil {
			return "lookup failed: " + err.Error()
		}
		for _, a := range ans.Endpoints {
			eng := byAddress(engines, a.Address)
			if eng == nil {
				continue
			}
			truth := eng.Held(p)
			total++
			if truth.Blocks == a.Prefix.MatchBlocks && truth.ByTier == a.Prefix.BlocksByTier {
				agree++
			} else if firstMiss == "" {
				firstMiss = fmt.Sprintf(" (first difference: %s holds %d blocks %v, index says %d %v)",
					a.Address, truth.Blocks, truth.ByTier, a.Prefix.MatchBlocks, a.Prefix.BlocksByTier)
			}
		}
	}
	return fmt.Sprintf("%d/%d (prompt, endpoint) answers exact%s", agree, total, firstMiss)
}

func pct(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

// tailSink counts what the fleet publishes, as decoded by a second consumer,
// so the demo shows the event stream itself and not only its effect.
type tailSink struct {
	batches, stored, removed, cleared, blocks, gaps, restarts atomic.Int64
	mu                                                        sync.Mutex
	last                                                      string
}

func (t *tailSink) Apply(o events.Origin, b *events.Batch) {
	t.batches.Add(1)
	for i := range b.Events {
		ev := &b.Events[i]
		t.blocks.Add(int64(len(ev.BlockHashes)))
		switch ev.Kind {
		case events.KindBlockStored:
			t.stored.Add(1)
		case events.KindBlockRemoved:
			t.removed.Add(1)
		case events.KindAllBlocksCleared:
			t.cleared.Add(1)
		}
	}
	if len(b.Events) > 0 {
		ev := &b.Events[0]
		t.mu.Lock()
		t.last = fmt.Sprintf("%s seq=%d %s %d blocks on %s", o.Pod, o.Seq, ev.Kind, len(ev.BlockHashes), ev.Medium)
		t.mu.Unlock()
	}
}

func (t *tailSink) Uncertain(events.Stream, events.Reason) { t.gaps.Add(1) }
func (t *tailSink) Restart(events.Stream)                  { t.restarts.Add(1) }

func (t *tailSink) summary() string {
	t.mu.Lock()
	last := t.last
	t.mu.Unlock()
	return fmt.Sprintf("%d batches, %d stored / %d removed events, %d blocks; latest: %s",
		t.batches.Load(), t.stored.Load(), t.removed.Load(), t.blocks.Load(), last)
}
