package epp

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/localtokenizer"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize/remotetokenizer"
	"github.com/kvroute/kvroute/pkg/tokenizer"
)

// RequestPathOptions configure how requests reach the EPP: Envoy's ext_proc
// (the gateway's way), the standalone proxy (no gateway), or both.
type RequestPathOptions struct {
	// ExtProcAddr serves Envoy's ext_proc; empty disables it.
	ExtProcAddr string
	// HealthAddr serves the gRPC health service in plaintext on a port of
	// its own (upstream's --grpc-health-port); empty serves it only on
	// ExtProcAddr.
	HealthAddr string
	// Plaintext serves ext_proc without TLS; otherwise CertFile/KeyFile, or
	// a self-signed certificate made at start when they are empty.
	Plaintext         bool
	CertFile, KeyFile string
	// ClientCAFile turns on mutual TLS for ext_proc: only gateways whose
	// certificate this CA signed may ask for picks. The key pair and the
	// CA are read again when their files change.
	ClientCAFile string
	// ProxyAddr serves the OpenAI-compatible standalone proxy; empty
	// disables it.
	ProxyAddr string
	// FlowControl holds requests in the EPP, by priority band and flow,
	// until an endpoint is predicted to serve them in time, with
	// upstream's default limits and no TTL; a configuration with the
	// flowControl feature gate on turns it on with its own section.
	FlowControl bool
	// FlowControlBySaturation releases waiting requests on the
	// saturation test alone, as upstream does, not by prediction.
	FlowControlBySaturation bool
	// FlowControlWhenObjectives turns flow control on for a pool with
	// InferenceObjectives: while the pool defines none, requests go
	// straight to scheduling.
	FlowControlWhenObjectives bool
	// MaxBodyBytes bounds a request body (default 16 MiB).
	MaxBodyBytes int
	// ExtProc bounds ext_proc's clients: request body bytes in flight
	// (MaxInFlightBytes), connections (MaxConns), streams open in all and
	// per connection (MaxStreams, MaxStreamsPerConn), the time from a
	// stream's start to its request body's end (BodyTimeout), what gRPC
	// holds of a stream before the server reads it (WindowBytes,
	// MaxMessageBytes), and how long a connection without streams stays
	// (IdleTimeout). Zero byte, stream and connection bounds are sized
	// from the memory the process may use (RequestPathBudgets,
	// ExtProcConns); a zero MaxMessageBytes from MaxBodyBytes and the body
	// mode; the rest of its fields are set from the above.
	ExtProc extproc.Options
	// Proxy bounds the standalone proxy's clients: read, write and idle
	// timeouts, concurrent requests, body bytes in flight (zero fields
	// mean proxy's defaults, the bytes in flight as ext_proc's). Addr,
	// MaxBodyBytes, Logger and Registerer are set from the above.
	Proxy proxy.Options
	// PassUnknownModels routes requests for models no endpoint serves or
	// reports as a loaded adapter; by default they are refused with 404.
	PassUnknownModels bool
	// NoRankPick leaves the data-parallel rank of a pod with several
	// behind one port to the model server's own balancing: no
	// x-data-parallel-rank header is set (the client's is still removed).
	NoRankPick bool
	// KeepBillingHeader: the model servers render the system block of a
	// Messages request that begins with x-anthropic-billing-header
	// (Claude Code's per-request attribution line), as vLLM did before
	// its Messages endpoint dropped that block; the request path then
	// renders it too. Off (the default), it is dropped before rendering,
	// as current vLLM drops it.
	KeepBillingHeader bool
	// Tokenize asks a model server's /tokenize for the token ids of
	// requests that carry text, so that their prefix answers are exact.
	Tokenize        bool
	TokenizeTimeout time.Duration
	// Tokenizers tokenize the requests of their models in process, with
	// the /tokenize above as the fallback and the reference of a sampled
	// drift check (one request in TokenizerDriftEvery; 0 means the
	// default, negative disables it).
	Tokenizers          map[string]*tokenizer.Tokenizer
	TokenizerDriftEvery int
	// TokenizerFiles add to Tokenizers, one for each MODEL=PATH, PATH
	// being a Hugging Face tokenizer.json or the directory holding it;
	// New loads them.
	TokenizerFiles []string
	// Tokenizer, when set, tokenizes in process before all of the above,
	// which remain its fallback for the requests it does not handle
	// (tokenize.ErrUnsupported): for models whose tokenizer is not a
	// Hugging Face one, such as the simulator's.
	Tokenizer tokenize.Tokenizer
}

// loadTokenizerFiles loads o.TokenizerFiles into o.Tokenizers, in a map
// of its own: the caller's is not written to.
func loadTokenizerFiles(o *RequestPathOptions) error {
	if len(o.TokenizerFiles) == 0 {
		return nil
	}
	loaded, err := tokenizer.LoadModels(o.TokenizerFiles, tokenizer.Options{})
	if err != nil {
		return fmt.Errorf("epp: tokenizer files: %w", err)
	}
	all := make(map[string]*tokenizer.Tokenizer, len(o.Tokenizers)+len(loaded))
	maps.Copy(all, o.Tokenizers)
	for model, t := range loaded {
		if _, dup := all[model]; dup {
			return fmt.Errorf("epp: tokenizer files: model %q has a tokenizer already", model)
		}
		all[model] = t
	}
	o.Tokenizers = all
	return nil
}

// tokenizeEndpoint chooses the model server that tokenizes for model: the
// first endpoint, by name, serving it as its base model, else one with the
// model loaded as a LoRA adapter. Every endpoint of a model tokenizes
// alike, so a stable choice keeps its connection warm.
func tokenizeEndpoint(ds *datalayer.Datastore) func(model string) (string, bool) {
	return func(model string) (string, bool) {
		var adapterHost string
		for _, ep := range ds.List() {
			if ep.Model == model {
				return "http://" + ep.Address, true
			}
			if adapterHost == "" {
				if m, ok := ds.Metrics(ep.Name); ok && (contains(m.ActiveLoRAs, model) || contains(m.WaitingLoRAs, model)) {
					adapterHost = "http://" + ep.Address
				}
			}
		}
		return adapterHost, adapterHost != ""
	}
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// newTokenizer is the request path's tokenizer, nil when disabled.
func (e *EPP) newTokenizer() tokenize.Tokenizer {
	rest := e.configuredTokenizers()
	if first := e.opts.RequestPath.Tokenizer; first != nil {
		if rest == nil {
			return first
		}
		return tokenize.Chain(first, rest)
	}
	return rest
}

// configuredTokenizers is the Hugging Face tokenizers in process, with
// the engines' /tokenize as their fallback, or either alone.
func (e *EPP) configuredTokenizers() tokenize.Tokenizer {
	var remote tokenize.Tokenizer
	if e.opts.RequestPath.Tokenize {
		remote = remotetokenizer.New(remotetokenizer.Options{
			Endpoint: tokenizeEndpoint(e.ds),
			Timeout:  e.opts.RequestPath.TokenizeTimeout,
			Logger:   e.logger,
		}, e.reg)
	}
	if len(e.opts.RequestPath.Tokenizers) == 0 {
		return remote
	}
	return localtokenizer.New(localtokenizer.Options{
		Tokenizers: e.opts.RequestPath.Tokenizers,
		Fallback:   remote,
		DriftEvery: e.opts.RequestPath.TokenizerDriftEvery,
		Logger:     e.logger,
	}, e.reg)
}

// startRequestPath binds the ext_proc and proxy listeners, so that their
// addresses are known before Run.
func (e *EPP) startRequestPath() error {
	o := e.opts.RequestPath
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = extproc.DefaultMaxBodyBytes
	}
	if (o.ExtProcAddr != "" || o.ProxyAddr != "") && (o.ExtProc.MaxInFlightBytes == 0 || o.ExtProc.MaxStreams == 0 || o.ExtProc.MaxConns == 0 || o.Proxy.MaxInFlightBytes == 0) {
		mem, source := MemoryBudget()
		bytes, streams := RequestPathBudgets(mem, o.MaxBodyBytes)
		if o.ExtProc.MaxInFlightBytes == 0 {
			o.ExtProc.MaxInFlightBytes = bytes
		}
		if o.ExtProc.MaxStreams == 0 {
			o.ExtProc.MaxStreams = streams
		}
		if o.ExtProc.MaxConns == 0 {
			o.ExtProc.MaxConns = ExtProcConns(mem)
		}
		if o.Proxy.MaxInFlightBytes == 0 {
			o.Proxy.MaxInFlightBytes = bytes
		}
		e.logger.Info("request path bounds", "memory", mem, "from", source,
			"extproc_max_inflight_bytes", o.ExtProc.MaxInFlightBytes, "extproc_max_streams", o.ExtProc.MaxStreams,
			"extproc_max_conns", o.ExtProc.MaxConns,
			"proxy_max_inflight_bytes", o.Proxy.MaxInFlightBytes)
	}
	if o.ExtProcAddr != "" {
		xo := o.ExtProc
		xo.Addr, xo.HealthAddr, xo.MaxBodyBytes = o.ExtProcAddr, o.HealthAddr, o.MaxBodyBytes
		xo.Plaintext, xo.CertFile, xo.KeyFile, xo.ClientCAFile = o.Plaintext, o.CertFile, o.KeyFile, o.ClientCAFile
		xo.Ready, xo.Logger, xo.Registerer = e.Ready, e.logger, e.reg
		s, err := extproc.New(e.director, xo)
		if err != nil {
			return fmt.Errorf("epp: ext_proc server: %w", err)
		}
		e.extproc = s
	}
	if o.ProxyAddr != "" {
		po := o.Proxy
		po.Addr, po.MaxBodyBytes, po.Logger, po.Registerer = o.ProxyAddr, int64(o.MaxBodyBytes), e.logger, e.reg
		p, err := proxy.New(e.director, po)
		if err != nil {
			return fmt.Errorf("epp: proxy: %w", err)
		}
		e.proxy = p
	}
	return nil
}

// runRequestPath runs the servers that startRequestPath bound.
func (e *EPP) runRequestPath(ctx context.Context, goRun func(func() error)) {
	if e.flow != nil {
		goRun(func() error { e.flow.Run(ctx); return nil })
	}
	if e.extproc != nil {
		goRun(func() error { return e.extproc.Run(ctx) })
	}
	if e.proxy != nil {
		goRun(func() error { return e.proxy.Run(ctx) })
	}
}

// ExtProcAddr is the ext_proc server's address, empty when disabled.
func (e *EPP) ExtProcAddr() string {
	if e.extproc == nil {
		return ""
	}
	return e.extproc.Addr()
}

// ProxyAddr is the standalone proxy's address, empty when disabled.
func (e *EPP) ProxyAddr() string {
	if e.proxy == nil {
		return ""
	}
	return e.proxy.Addr()
}
