package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/experimental"

	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/hftokenizer"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// eppEnv carries an eppSpec to the test binary run again as one of a
// fleet's EPPs (Options.EPPProcesses).
const eppEnv = "KVROUTE_EPP_PROCESS"

// EPPProcessOptions shape one EPP in a process of its own.
type EPPProcessOptions struct {
	// Tokenizer is a tokenizer's directory or tokenizer.json, which the
	// EPP loads (hftokenizer.Load) for the fleet's model and tokenizes
	// chat prompts with in process; empty, it has none.
	Tokenizer string
}

// eppSpec is what an EPP's process needs to build it.
type eppSpec struct {
	Model          string
	BlockSize      int
	Config         string
	NoTokenizer    bool
	ScrapeInterval time.Duration
	// NATSURL is the NATS server to consume from; empty, the EPP starts
	// its embedded one.
	NATSURL   string
	Tokenizer string
}

// eppHello is what an EPP's process tells its parent once it is built.
type eppHello struct {
	ExtProcAddr, NATSURL, Namespace, Pool string
}

// The requests an EPP's process answers besides testkit's "stats".
const (
	opUpsert     = "upsert"      // []string: the stand-ins' addresses, as endpoint i each
	opHeld       = "held"        // heldArg: whether the index shows it (bool)
	opEncodeChat = "encode-chat" // a chat completions body: its token ids
)

type heldArg struct {
	Addr   string
	Tokens []uint32
}

// EPPProcess is a fleet's EPP in a process of its own: the test binary run
// again, holding the EPP and nothing else, so that a benchmark can measure
// its CPU and its collector's work on its heap alone.
type EPPProcess struct {
	child *testkit.Child
	hello eppHello
}

// ExtProcAddr is the EPP's ext_proc address (plaintext).
func (p *EPPProcess) ExtProcAddr() string { return p.hello.ExtProcAddr }

// Pid is the EPP's process id.
func (p *EPPProcess) Pid() int { return p.child.Pid() }

// Stats are the EPP process's CPU, collector and allocation totals now.
func (p *EPPProcess) Stats() (testkit.ProcessStats, error) { return p.child.Stats() }

// EncodeChat tokenizes a chat completions body with the EPP's tokenizer,
// as its request path does; it fails when the EPP has none.
func (p *EPPProcess) EncodeChat(body []byte) ([]uint32, error) {
	var ids []uint32
	err := p.child.Call(opEncodeChat, body, &ids)
	return ids, err
}

// startEPPProcesses starts o's EPPs in processes of their own and their
// stand-ins in another.
func startEPPProcesses(t testing.TB, o Options) *Fleet {
	t.Helper()
	if o.EPP != nil {
		t.Fatal("fleet: Options.EPP cannot cross to an EPP in a process of its own")
	}
	o.Process = true
	f := &Fleet{model: o.Model}
	var first eppHello
	for i, po := range o.EPPProcesses {
		spec, err := json.Marshal(eppSpec{
			Model: o.Model, BlockSize: o.BlockSize, Config: o.Config, NoTokenizer: o.NoTokenizer,
			ScrapeInterval: o.ScrapeInterval, NATSURL: first.NATSURL, Tokenizer: po.Tokenizer,
		})
		if err != nil {
			t.Fatal(err)
		}
		p := &EPPProcess{}
		p.child = testkit.StartChild(t, eppEnv, string(spec), &p.hello)
		if i == 0 {
			first = p.hello
		}
		f.Processes = append(f.Processes, p)
	}
	addrs := startProcess(t, o, first.NATSURL, first.Namespace, first.Pool)
	for _, addr := range addrs {
		f.Servers = append(f.Servers, &ModelServer{Addr: addr, model: o.Model})
	}
	for _, p := range f.Processes {
		if err := p.child.Call(opUpsert, addrs, nil); err != nil {
			t.Fatal(err)
		}
	}
	// The EPPs stop before the stand-ins, so that they do not scrape them
	// gone, and the first, whose NATS server the others use, last. Each
	// child's own clean-up reports how it ended.
	t.Cleanup(func() {
		for i := len(f.Processes) - 1; i >= 0; i-- {
			_ = f.Processes[i].child.Stop()
		}
	})
	return f
}

// mainEPP runs this process as one of a fleet's EPPs, and exits, when it
// was started as one.
func mainEPP() {
	spec := os.Getenv(eppEnv)
	if spec == "" {
		return
	}
	if err := runEPP(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "EPP process:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runEPP builds and runs the EPP spec asks for, as cmd/epp would, and
// answers its parent's requests until in ends.
func runEPP(spec string, in io.Reader, out io.Writer) error {
	var es eppSpec
	if err := json.Unmarshal([]byte(spec), &es); err != nil {
		return fmt.Errorf("%s: %w", eppEnv, err)
	}
	experimental.SetDefaultBufferPool(extproc.BufferPool())
	eo := eppOptions(Options{
		Model: es.Model, BlockSize: es.BlockSize, Config: es.Config,
		NoTokenizer: es.NoTokenizer, ScrapeInterval: es.ScrapeInterval,
	})
	eo.Logger = slog.New(slog.DiscardHandler)
	eo.RequestPath.ExtProcAddr, eo.RequestPath.Plaintext = "127.0.0.1:0", true
	if es.NATSURL != "" {
		eo.NATSURL, eo.EmbeddedNATSAddr = es.NATSURL, ""
	}
	var tok *hftokenizer.Tokenizer
	if es.Tokenizer != "" {
		var err error
		if tok, err = hftokenizer.Load(es.Tokenizer, hftokenizer.Options{Name: es.Model}); err != nil {
			return err
		}
		eo.RequestPath.Tokenizers = map[string]*hftokenizer.Tokenizer{es.Model: tok}
	}
	e, err := epp.New(eo)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	hello := eppHello{ExtProcAddr: e.ExtProcAddr(), NATSURL: e.NATSURL(), Namespace: e.Namespace(), Pool: e.Pool()}
	err = testkit.ServeChild(in, out, hello, func(op string, arg json.RawMessage) (any, error) {
		switch op {
		case opUpsert:
			var addrs []string
			if err := json.Unmarshal(arg, &addrs); err != nil {
				return nil, err
			}
			for i, addr := range addrs {
				e.Datastore().Upsert(endpoint(i, addr, es.Model))
			}
			return nil, nil
		case opHeld:
			var h heldArg
			if err := json.Unmarshal(arg, &h); err != nil {
				return nil, err
			}
			return holds(e, es.Model, h.Addr, h.Tokens) == nil, nil
		case opEncodeChat:
			if tok == nil {
				return nil, errors.New("this EPP has no tokenizer in process")
			}
			var body []byte
			if err := json.Unmarshal(arg, &body); err != nil {
				return nil, err
			}
			req, err := openai.ParseRequest("/v1/chat/completions", body)
			if err != nil {
				return nil, err
			}
			return tok.EncodeChat(req.Chat)
		}
		return nil, fmt.Errorf("no op %q", op)
	})
	cancel()
	if rerr := <-done; rerr != nil && err == nil {
		err = rerr
	}
	return err
}
