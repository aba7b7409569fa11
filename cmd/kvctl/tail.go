package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
)

func init() {
	commands["tail"] = command{
		summary: "print a pool's KV events from NATS as they arrive, with gaps and restarts",
		run: func(args []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return tailCmd(ctx, args, os.Stdout, os.Stderr)
		},
	}
}

// tailCmd subscribes to a pool's events through the real consumer, so what
// it prints (including gaps, duplicates dropped and restarts) is exactly
// what the EPP's index would see. It runs until ctx is done.
func tailCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tail", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("nats", nats.DefaultURL, "NATS server `URL`")
	namespace := fs.String("namespace", "", "the pool's Kubernetes `namespace` (required)")
	pool := fs.String("pool", "", "the InferencePool's `name` (required)")
	useJS := fs.Bool("jetstream", false, "consume from the pool's JetStream stream instead of core NATS")
	stream := fs.String("stream", "", "JetStream stream `name` (default KV_EVENTS_<namespace>_<pool>)")
	replay := fs.Bool("replay", false, "with --jetstream, print what the stream holds before new events")
	asJSON := fs.Bool("json", false, "print JSON lines instead of text")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: kvctl tail --namespace NS --pool POOL [--nats URL] [--jetstream] [--json]\n\n"+
			"Prints every KV event a pool's engines publish, one line per event, until\n"+
			"interrupted. Gaps, reconnects and engine restarts are printed as they are found.\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if *namespace == "" || *pool == "" {
		fmt.Fprintln(stderr, "kvctl tail: --namespace and --pool are required")
		fs.Usage()
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}

	nc, err := nats.Connect(*url,
		nats.Name("kvctl tail"),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				fmt.Fprintf(stderr, "kvctl tail: disconnected: %v\n", err)
			}
		}))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", *url, err)
	}
	defer nc.Close()

	p := &printer{w: stdout, json: *asJSON}
	c, err := consumer.New(nc, consumer.Options{
		Namespace:  *namespace,
		Pool:       *pool,
		Workers:    1, // one worker prints in arrival order across streams
		JetStream:  *useJS,
		Stream:     *stream,
		DeliverNew: !*replay,
		Logger:     slog.New(slog.NewTextHandler(stderr, nil)),
	}, p, nil)
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	// Say when listening starts, so a user (or a script) knows that
	// silence means no events rather than no subscription.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !c.Connected() {
		select {
		case err := <-done:
			return err
		case <-tick.C:
		}
	}
	fmt.Fprintf(stderr, "kvctl tail: listening on %s at %s\n", events.PoolSubject(*namespace, *pool), nc.ConnectedUrlRedacted())
	err = <-done
	if err == nil {
		err = p.err()
	}
	return err
}

// printer is a Sink that writes what it receives. The consumer runs one
// worker for it, but the lock keeps lines whole whatever the options.
type printer struct {
	mu       sync.Mutex
	w        io.Writer
	json     bool
	firstErr error
}

var _ events.Sink = (*printer)(nil)

// jsonLine is one line of --json output: an event with its batch's origin,
// or a stream notice (uncertain, restart) with the stream alone.
type jsonLine struct {
	Type     string `json:"type"` // "event", "empty_batch", "uncertain", "restart"
	Endpoint string `json:"endpoint"`
	Rank     int    `json:"rank"`
	Pod      string `json:"pod,omitempty"`
	Model    string `json:"model,omitempty"`
	Instance string `json:"instance,omitempty"`
	// BlockSize is the Kv-Block-Size header, the engine's block size.
	BlockSize int           `json:"block_size,omitempty"`
	Seq       *uint64       `json:"seq,omitempty"`
	TS        float64       `json:"ts,omitempty"`
	Reason    string        `json:"reason,omitempty"`
	Event     *events.Event `json:"event,omitempty"`
}

func (p *printer) Apply(o events.Origin, b *events.Batch) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b.Events) == 0 {
		p.line(jsonLine{Type: "empty_batch", Seq: &o.Seq, TS: b.TS}, o, func(sb *strings.Builder) {
			sb.WriteString("(no events)")
		})
		return
	}
	for i := range b.Events {
		e := &b.Events[i]
		p.line(jsonLine{Type: "event", Seq: &o.Seq, TS: b.TS, Event: e}, o, func(sb *strings.Builder) {
			describe(sb, e)
		})
	}
}

func (p *printer) Uncertain(s events.Stream, r events.Reason) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line(jsonLine{Type: "uncertain", Reason: r.String()}, events.Origin{Stream: s}, func(sb *strings.Builder) {
		fmt.Fprintf(sb, "UNCERTAIN reason=%s", r)
	})
}

func (p *printer) Restart(s events.Stream) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.line(jsonLine{Type: "restart"}, events.Origin{Stream: s}, func(sb *strings.Builder) {
		sb.WriteString("RESTART (engine restarted; its cache is gone)")
	})
}

// line writes one line, as JSON or as text; the caller holds p.mu. A
// write error (a closed pipe) is kept and returned when tail ends.
func (p *printer) line(j jsonLine, o events.Origin, text func(*strings.Builder)) {
	if p.firstErr != nil {
		return
	}
	var out []byte
	if p.json {
		j.Endpoint, j.Rank, j.Pod, j.Model, j.Instance, j.BlockSize = o.Endpoint, o.DPRank, o.Pod, o.Model, o.Instance, o.BlockSize
		b, err := json.Marshal(j)
		if err != nil {
			p.firstErr = fmt.Errorf("write JSON: %w", err)
			return
		}
		out = append(b, '\n')
	} else {
		var sb strings.Builder
		fmt.Fprintf(&sb, "%s %s", time.Now().Format("15:04:05.000000"), o.Stream)
		if j.Seq != nil {
			fmt.Fprintf(&sb, " seq=%d", o.Seq)
			if o.Pod != "" {
				fmt.Fprintf(&sb, " pod=%s", o.Pod)
			}
			if o.Model != "" {
				fmt.Fprintf(&sb, " model=%s", o.Model)
			}
			if o.Instance != "" {
				fmt.Fprintf(&sb, " inst=%s", o.Instance)
			}
		}
		sb.WriteByte(' ')
		text(&sb)
		sb.WriteByte('\n')
		out = []byte(sb.String())
	}
	if _, err := p.w.Write(out); err != nil {
		p.firstErr = fmt.Errorf("write output: %w", err)
	}
}

func (p *printer) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firstErr
}

// describe writes one event's text form: its kind, then what matters for it.
func describe(sb *strings.Builder, e *events.Event) {
	sb.WriteString(e.Kind.String())
	if e.Kind == events.KindAllBlocksCleared {
		return
	}
	fmt.Fprintf(sb, " tier=%s blocks=%d", e.Medium, len(e.BlockHashes))
	if n := len(e.BlockHashes); n > 0 {
		fmt.Fprintf(sb, " hashes=%#x", e.BlockHashes[0])
		if n > 1 {
			fmt.Fprintf(sb, "..%#x", e.BlockHashes[n-1])
		}
	}
	if e.Kind != events.KindBlockStored {
		return
	}
	if e.HasParent {
		fmt.Fprintf(sb, " parent=%#x", e.ParentHash)
	} else {
		sb.WriteString(" parent=none")
	}
	fmt.Fprintf(sb, " tokens=%d block_size=%d", len(e.TokenIDs), e.BlockSize)
	if e.LoRAName != "" {
		fmt.Fprintf(sb, " lora=%s", e.LoRAName)
	}
	if e.GroupIdx != 0 || e.KVCacheSpecKind != "" {
		fmt.Fprintf(sb, " group=%d", e.GroupIdx)
		if e.KVCacheSpecKind != "" {
			fmt.Fprintf(sb, " spec=%s", e.KVCacheSpecKind)
		}
	}
}
