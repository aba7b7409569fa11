// Package epp assembles kvroute's Endpoint Picker from its parts: the NATS
// connection (an embedded server by default), the KV-event consumer, the
// exact prefix index and its approximate fallback, the endpoint datastore
// with its discovery and metrics scraping, the PrepareData producers, and
// the HTTP server for metrics, health and debugging. cmd/epp parses flags
// into Options and calls Run; tests build an EPP the same way.
package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/approx"
	"github.com/kvroute/kvroute/pkg/datalayer/index"
	"github.com/kvroute/kvroute/pkg/datalayer/scrape"
	"github.com/kvroute/kvroute/pkg/datalayer/share"
	"github.com/kvroute/kvroute/pkg/discovery/static"
	"github.com/kvroute/kvroute/pkg/enginesched"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/ingest/consumer"
	"github.com/kvroute/kvroute/pkg/ingest/recovery"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/prepare/prefixmatch"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/extproc"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/requestpath/proxy"
	"github.com/kvroute/kvroute/pkg/requestpath/selfcheck"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/config"
	"github.com/kvroute/kvroute/pkg/transport/natsembed"
)

// Options configure an EPP. The zero value, with Pool set, runs on an
// embedded NATS server with no discovery source and no request path;
// DefaultOptions are a deployed EPP's.
type Options struct {
	// NATSURL is the NATS server to consume events from; empty starts an
	// embedded server listening on EmbeddedNATSAddr.
	NATSURL string
	// EmbeddedNATSAddr is the embedded server's client address (default
	// 127.0.0.1:4222; port 0 picks a free one).
	EmbeddedNATSAddr string
	// NATSOptions are extra client options (credentials, TLS; see
	// natsauth.Config.Options).
	NATSOptions []nats.Option

	// Namespace and Pool name the InferencePool whose events are consumed.
	Namespace, Pool string
	// JetStream consumes through a JetStream ordered consumer (and, on the
	// embedded server, creates the stream) instead of core NATS.
	JetStream bool
	// Consumer tunes the event consumer; Namespace, Pool and JetStream above
	// override its fields.
	Consumer consumer.Options
	// StreamReplicas is the JetStream stream's replica count when the EPP
	// creates it (default 1; 3 on a 3-node NATS cluster, so that the
	// stream outlives a member).
	StreamReplicas int
	// ReadyGrace is how long, once the consumer is connected, readiness
	// waits to hear from every known endpoint (a batch or a heartbeat)
	// before it stops waiting for the quiet ones (default 0: it does not
	// wait). Readiness also waits until no endpoint's stream is being
	// resynchronised (recovering) or awaits a first resync attempt, up to ReadyTimeout (default 30s) after
	// connecting; once ready, the EPP stays ready while it is connected,
	// whatever later resyncs do.
	ReadyGrace, ReadyTimeout time.Duration

	// EndpointsFile is a static endpoints YAML file, reloaded when it
	// changes; empty means endpoints come from elsewhere (Datastore().Upsert).
	EndpointsFile string
	// Scrape enables scraping each endpoint's /metrics with ScrapeOptions.
	Scrape        bool
	ScrapeOptions scrape.Options

	// ConfigFile or ConfigText is the scheduler's EndpointPickerConfig;
	// neither means config.DefaultConfigText. ConfigName, which excludes
	// both, names one of kvroute's own (config.NamedText:
	// predicted-latency, upstream-weights, prefill-cost, precise-prefix).
	ConfigFile, ConfigText string
	ConfigName             string
	// MetricsStaleness is how old scraped metrics may be before an
	// endpoint's load counts as unknown (default 2s).
	MetricsStaleness time.Duration
	// PrepareDataTimeout bounds the PrepareData producers per request
	// (default 400ms).
	PrepareDataTimeout time.Duration
	// Now is the request path's clock (default time.Now): a run in virtual
	// time times its requests by its own.
	Now func() time.Time
	// Seed, when non-zero, seeds the scheduler's random choices (ties
	// between equal endpoints, random pickers), so that a run in virtual
	// time repeats exactly; zero seeds them from crypto/rand.
	Seed uint64

	// Recovery tunes the resynchronisation of uncertain streams from their
	// relays' snapshots (docs/snapshot.md); Namespace, Pool and Pod are
	// filled in. NoRecovery leaves uncertain streams approximate until
	// their engines restart.
	Recovery   recovery.Options
	NoRecovery bool

	// SelfCheck tunes the comparison of every response's cached-token
	// count with the index's prediction (Distrust and Logger are filled
	// in); NoSelfCheck turns it off.
	SelfCheck   selfcheck.Options
	NoSelfCheck bool

	// OutlierDetection ejects from picking the endpoints whose responses
	// keep failing (5xx, refused or reset connections, answers too fast
	// for their prompt) or whose usage cannot be (the self-check's liars),
	// as Envoy's outlier detection does (docs/reliability.md). It is on
	// with its defaults; Disabled turns it off. Now and Logger default to
	// the EPP's.
	OutlierDetection datalayer.OutlierDetection

	// Index tunes the exact index. MaxHoldings zero sizes it from the
	// memory the process may use (see MemoryBudget, DefaultMaxHoldings);
	// negative means no bound.
	Index index.Options
	// ApproxCapacity is blocks remembered per endpoint by the fallback.
	ApproxCapacity int
	// Predict adjusts the latency predictors the scheduling configuration
	// makes (predicted-latency-producer).
	Predict PredictOptions
	// Engine are the engines' scheduler limits (vLLM's max_num_seqs and
	// max_num_batched_tokens), with which each endpoint's scheduler is
	// replayed for the latency predictor; zero fields are learned
	// (seats) or vLLM's default (the step budget).
	Engine enginesched.Limits

	// ObjectivesFile is a static InferenceObjectives file (standalone
	// mode), reloaded when it changes; Kubernetes discovery writes the
	// pool's InferenceObjective objects instead.
	ObjectivesFile string

	// Prefix are the defaults of the prefix producer the scheduling
	// configuration runs (precise-prefix-cache-producer, or upstream's
	// approx-prefix-cache-producer mapped onto it): the parameters the
	// configuration gives override them field by field. Zero fields keep
	// prefixmatch.DefaultParams.
	Prefix prefixmatch.Params

	// RequestPath says how requests reach the EPP.
	RequestPath RequestPathOptions

	// Share tunes the sharing of dispatches with the pool's other EPP
	// replicas over NATS (events.DispatchSubject), so that each replica's
	// in-flight accounting counts every replica's (docs/architecture.md);
	// Namespace, Pool and Now are filled in. It is on unless Disabled.
	Share share.Options

	// Discovery, when set, makes an endpoint discovery source that writes
	// to the EPP's datastore (Kubernetes discovery: see cmd/epp); it runs
	// with the EPP, and readiness waits for its first sync. A factory keeps
	// this package, and every binary built on it, free of client-go.
	Discovery func(ds *datalayer.Datastore, objectives *datalayer.Objectives, reg prometheus.Registerer, logger *slog.Logger) (Discovery, error)

	// DebugAddr serves /debug/prefix (and, with EnablePprof,
	// /debug/pprof) on a listener of its own; empty, the default, serves
	// neither. /debug/prefix tells whoever reaches it which prompts the
	// engines hold, that is what other users sent: keep the address off
	// any network clients reach (docs/security.md).
	DebugAddr string
	// EnablePprof adds /debug/pprof to DebugAddr's listener.
	EnablePprof bool

	// HTTPAddr serves /metrics, /healthz and /readyz (default
	// 127.0.0.1:9090; port 0 picks a free one).
	HTTPAddr string

	Logger *slog.Logger
}

// EPP is an assembled endpoint picker.
type EPP struct {
	opts   Options
	logger *slog.Logger
	reg    *prometheus.Registry

	nats *natsembed.Server
	nc   *nats.Conn
	// shareNC carries the dispatches shared with the other replicas (nil
	// when sharing is off).
	shareNC    *nats.Conn
	ds         *datalayer.Datastore
	objectives *datalayer.Objectives
	latency    *latencySetup
	index      *index.Index
	approx     *approx.Index
	consumer   *consumer.Consumer
	recovery   *recovery.Recovery
	selfcheck  *selfcheck.Checker
	scraper    *scrape.Scraper
	graph      *prepare.Graph
	sched      *scheduling.Scheduler
	director   *director.Director
	flow       *flowcontrol.Controller
	tokenizer  tokenize.Tokenizer
	extproc    *extproc.Server
	proxy      *proxy.Server
	discovery  Discovery
	share      *share.Sharer
	static     *static.File
	staticObj  *static.Objectives

	// connectedAt is when Ready first found the consumer connected (unix
	// nanoseconds, 0 before); caughtUp latches once the first sync and
	// recovery are done.
	connectedAt atomic.Int64
	caughtUp    atomic.Bool

	httpLn  net.Listener
	httpSrv *http.Server
	// debugLn and debugSrv serve /debug/*; nil without DebugAddr.
	debugLn  net.Listener
	debugSrv *http.Server
}

// New builds an EPP: it starts the embedded NATS server when no URL is
// given, connects, and binds the HTTP listener, so that addresses are known
// before Run. Close releases what New acquired if Run is never called.
func New(opts Options) (*EPP, error) {
	if opts.Pool == "" {
		return nil, errors.New("epp: a pool name is required")
	}
	if opts.Namespace == "" {
		opts.Namespace = "default"
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = "127.0.0.1:9090"
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.ConfigName != "" {
		if opts.ConfigFile != "" || opts.ConfigText != "" {
			return nil, errors.New("epp: ConfigName excludes ConfigFile and ConfigText")
		}
		text, err := config.NamedText(opts.ConfigName)
		if err != nil {
			return nil, fmt.Errorf("epp: %w", err)
		}
		opts.ConfigText = text
	}
	if err := loadTokenizerFiles(&opts.RequestPath); err != nil {
		return nil, err
	}
	e := &EPP{opts: opts, logger: opts.Logger, reg: prometheus.NewRegistry()}
	e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	if err := e.connect(); err != nil {
		e.Close()
		return nil, err
	}

	e.ds = datalayer.NewDatastore(e.reg)
	e.ds.SetEngineLimits(opts.Engine)
	// Upstream's name and label, which its dashboards and tests read.
	e.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "inference_pool_ready_pods",
		Help:        "The number of ready pods in the inference server pool.",
		ConstLabels: prometheus.Labels{"name": opts.Pool},
	}, func() float64 { return float64(e.ds.ReadyPods()) }))
	od := opts.OutlierDetection
	if od.Now == nil {
		od.Now = opts.Now
	}
	if od.Logger == nil {
		od.Logger = e.logger
	}
	e.ds.SetOutlierDetection(od)
	sho := opts.Share
	sho.Namespace, sho.Pool = opts.Namespace, opts.Pool
	if sho.Now == nil {
		sho.Now = opts.Now
	}
	if sho.Logger == nil {
		sho.Logger = e.logger
	}
	var err error
	if e.share, err = share.New(e.shareNC, e.ds, sho, e.reg); err != nil {
		e.Close()
		return nil, fmt.Errorf("epp: %w", err)
	}
	e.objectives = datalayer.NewObjectives(e.reg)
	idxOpts := opts.Index
	if idxOpts.MaxHoldings == 0 || opts.Consumer.MaxQueuedBytes == 0 {
		mem, source := MemoryBudget()
		if idxOpts.MaxHoldings == 0 {
			idxOpts.MaxHoldings = DefaultMaxHoldings(mem)
		}
		if opts.Consumer.MaxQueuedBytes == 0 {
			opts.Consumer.MaxQueuedBytes = min(consumer.DefaultMaxQueuedBytes, mem/maxQueuedShare)
		}
		e.logger.Info("memory bounds", "memory", mem, "from", source,
			"index_max_holdings", idxOpts.MaxHoldings, "consumer_max_queued_bytes", opts.Consumer.MaxQueuedBytes)
	}
	if idxOpts.MaxHoldings < 0 {
		idxOpts.MaxHoldings = 0 // no bound, asked for
	}
	if !opts.NoRecovery {
		// The index reports parents it never saw; recovery resyncs those
		// streams. e.recovery is set before any event can arrive (Run).
		next := idxOpts.OnUncertain
		idxOpts.OnUncertain = func(s events.Stream, r events.Reason) {
			if next != nil {
				next(s, r)
			}
			e.recovery.OnUncertain(s, r)
		}
	}
	e.index = index.New(idxOpts, e.reg)
	e.approx = approx.New(opts.ApproxCapacity, e.reg)
	e.ds.SetStreamStates(e.index)
	var sink events.Sink = e.index
	if !opts.NoRecovery {
		ro := opts.Recovery
		ro.Namespace, ro.Pool, ro.Pod = opts.Namespace, opts.Pool, e.podOf
		if ro.Logger == nil {
			ro.Logger = e.logger
		}
		var err error
		if e.recovery, err = recovery.New(ro, e.index, e.nc, e.reg); err != nil {
			e.Close()
			return nil, fmt.Errorf("epp: %w", err)
		}
		sink = e.recovery
	}
	if !opts.NoSelfCheck {
		so := opts.SelfCheck
		so.Distrust = e.distrust
		so.Eject = func(addr string) { e.ds.ReportOutcome(addr, datalayer.OutcomeLiar) }
		if so.InPool == nil {
			so.InPool = func(addr string) bool { _, ok := e.ds.ByAddress(addr); return ok }
		}
		if so.Logger == nil {
			so.Logger = e.logger
		}
		var err error
		if e.selfcheck, err = selfcheck.New(so, e.reg); err != nil {
			e.Close()
			return nil, fmt.Errorf("epp: %w", err)
		}
	}
	e.ds.OnChange(func(added, removed []*datalayer.Endpoint) {
		for _, ep := range removed {
			if e.recovery != nil {
				e.recovery.RemoveEndpoint(ep.Address)
			}
			if e.selfcheck != nil {
				e.selfcheck.Forget(ep.Address)
			}
			e.index.RemoveEndpoint(ep.Address)
			e.approx.RemoveEndpoint(ep.Address)
		}
		for _, ep := range added {
			e.index.AddEndpoint(ep.Address)
			if e.recovery != nil {
				e.recovery.AddEndpoint(ep.Address)
			}
		}
	})
	if opts.EndpointsFile != "" {
		// Loaded now, so that a bad file stops start-up and the endpoints
		// are members before the first event arrives.
		var err error
		if e.static, err = static.Load(opts.EndpointsFile, e.ds, e.reg, e.logger); err != nil {
			e.Close()
			return nil, fmt.Errorf("epp: %w", err)
		}
	}
	if opts.ObjectivesFile != "" {
		var err error
		if e.staticObj, err = static.LoadObjectives(opts.ObjectivesFile, e.objectives, e.reg, e.logger); err != nil {
			e.Close()
			return nil, fmt.Errorf("epp: %w", err)
		}
	}
	if err := e.setupDiscovery(); err != nil {
		e.Close()
		return nil, err
	}
	if err := e.buildScheduling(); err != nil {
		e.Close()
		return nil, err
	}

	co := opts.Consumer
	co.Namespace, co.Pool, co.JetStream = opts.Namespace, opts.Pool, opts.JetStream
	// Each batch's endpoint must be one discovery gives the pod whose
	// subject it came on: nobody but a pod's own relay can speak for it.
	co.Membership = consumer.MembershipFunc(e.podOf)
	if co.Logger == nil {
		co.Logger = e.logger
	}
	if opts.JetStream {
		if err := e.ensureStream(co); err != nil {
			e.Close()
			return nil, err
		}
	}
	e.consumer, err = consumer.New(e.nc, co, sink, e.reg)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("epp: %w", err)
	}
	e.httpLn, err = net.Listen("tcp", opts.HTTPAddr)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("epp: listen for HTTP on %s: %w", opts.HTTPAddr, err)
	}
	if err := e.startRequestPath(); err != nil {
		e.Close()
		return nil, err
	}
	if opts.Scrape {
		so := opts.ScrapeOptions
		if so.Logger == nil {
			so.Logger = e.logger
		}
		if e.flow != nil && so.Landed == nil {
			// A scrape that shows a queue drained may release a waiting
			// request before the next response ends or recheck fires.
			so.Landed = e.flow
		}
		e.scraper = scrape.New(e.ds, so, e.reg)
	}
	e.httpSrv = &http.Server{Handler: e.routes(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	if opts.DebugAddr != "" {
		if e.debugLn, err = net.Listen("tcp", opts.DebugAddr); err != nil {
			e.Close()
			return nil, fmt.Errorf("epp: listen for /debug on %s: %w", opts.DebugAddr, err)
		}
		e.debugSrv = &http.Server{Handler: e.debugRoutes(), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute}
	}
	return e, nil
}

func (e *EPP) connect() error {
	url := e.opts.NATSURL
	if url == "" {
		host, port := "127.0.0.1", 4222
		if e.opts.EmbeddedNATSAddr != "" {
			h, p, err := net.SplitHostPort(e.opts.EmbeddedNATSAddr)
			if err != nil {
				return fmt.Errorf("epp: embedded NATS address %q: %w", e.opts.EmbeddedNATSAddr, err)
			}
			host = h
			if _, err := fmt.Sscanf(p, "%d", &port); err != nil {
				return fmt.Errorf("epp: embedded NATS port %q: %w", p, err)
			}
		}
		s, err := natsembed.Start(natsembed.Options{Host: host, Port: port, JetStream: e.opts.JetStream})
		if err != nil {
			return fmt.Errorf("epp: %w", err)
		}
		e.nats = s
		url = s.ClientURL()
		e.logger.Info("embedded NATS server started", "url", url)
	}
	opts := append([]nats.Option{
		nats.Name("kvroute-epp"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.RetryOnFailedConnect(true),
	}, e.opts.NATSOptions...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("epp: connect to NATS at %s: %w", url, err)
	}
	e.nc = nc
	if e.opts.Share.Disabled {
		return nil
	}
	// Dispatch sharing on a connection of its own: with NoEcho the server
	// does not send a replica its own messages back, and the event
	// stream's flow control is not the sharing's.
	shareOpts := append(opts[:len(opts):len(opts)], nats.Name("kvroute-epp-share"), nats.NoEcho())
	if e.shareNC, err = nats.Connect(url, shareOpts...); err != nil {
		return fmt.Errorf("epp: connect to NATS at %s for dispatch sharing: %w", url, err)
	}
	return nil
}

func (e *EPP) ensureStream(co consumer.Options) error {
	js, err := jetStream(e.nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := co.Stream
	if name == "" {
		name = events.StreamName(co.Namespace, co.Pool)
	}
	_, err = events.EnsureStream(ctx, js, events.StreamConfig{
		Name: name, Namespace: co.Namespace, Pool: co.Pool,
		MaxAge: 10 * time.Minute, MaxBytes: 1 << 30, Replicas: e.opts.StreamReplicas,
	})
	if err != nil {
		return fmt.Errorf("epp: JetStream stream %s: %w", name, err)
	}
	return nil
}

// buildScheduling loads the scheduler configuration, checks the data
// dependencies of its plugins, and makes the director that runs them.
func (e *EPP) buildScheduling() error {
	prefix := prefixParams(e.opts.Prefix)
	e.latency = &latencySetup{opts: e.opts.Predict, reg: e.reg, logger: e.logger}
	reg, err := newRegistry(prefix, e.index, e.approx, e.latency)
	if err != nil {
		return fmt.Errorf("epp: plugin registry: %w", err)
	}
	spec := &speculator{index: e.index, approx: e.approx, maxApprox: prefix.ApproxMaxBlocks}
	h := &config.Handle{Staleness: e.opts.MetricsStaleness, Spec: spec, Reg: e.reg}
	var loaded *config.Loaded
	switch {
	case e.opts.ConfigFile != "":
		loaded, err = reg.LoadFile(e.opts.ConfigFile, h)
	case e.opts.ConfigText != "":
		loaded, err = reg.Load([]byte(e.opts.ConfigText), h)
	default:
		loaded, err = reg.Load([]byte(config.DefaultConfigText), h)
	}
	if err != nil {
		return fmt.Errorf("epp: scheduler configuration: %w", err)
	}
	// What of an upstream configuration kvroute does its own way, one line
	// each.
	for _, note := range loaded.Notes {
		e.logger.Info("scheduler configuration: " + note)
	}
	for _, p := range loaded.Plugins {
		// The routing history learns picks as far as the configured
		// producer asks it about them.
		if pp, ok := p.(*prefixmatch.Producer); ok {
			spec.maxApprox = pp.Params().ApproxMaxBlocks
		}
	}
	e.graph, err = prepare.BuildGraph(loaded.Plugins, prepare.WithRegisterer(e.reg), prepare.WithLogger(e.logger))
	if err != nil {
		return fmt.Errorf("epp: scheduler configuration: %w", err)
	}
	so := loaded.SchedulerOptions()
	so.Registerer = e.reg
	so.KeepScores = e.opts.RequestPath.ExtProc.EmitEndpointScores
	if e.opts.Seed != 0 {
		so.Rand = rand.New(rand.NewPCG(e.opts.Seed, e.opts.Seed^0x9e3779b97f4a7c15))
	}
	if e.sched, err = scheduling.New(so); err != nil {
		return fmt.Errorf("epp: scheduler: %w", err)
	}
	e.latency.follow(e.ds)
	var learners []plugin.ResponseObserver
	for _, p := range loaded.Plugins {
		if o, ok := p.(plugin.ResponseObserver); ok {
			learners = append(learners, o)
		}
	}
	e.tokenizer = e.newTokenizer()
	var observers []director.ResponseObserver
	if e.selfcheck != nil {
		observers = append(observers, e.selfcheck)
	}
	if loaded.FlowControl != nil || e.opts.RequestPath.FlowControl || e.opts.RequestPath.FlowControlWhenObjectives {
		if e.flow, err = flowcontrol.New(flowConfig(loaded.FlowControl), e.opts.Now, flowcontrol.NewMetrics(e.reg, 0)); err != nil {
			return fmt.Errorf("epp: flow control: %w", err)
		}
	}
	var flow director.FlowControl
	if e.flow != nil {
		flow = e.flow
	}
	e.director, err = director.New(director.Options{
		FlowControl: flow,
		// A configuration's gate, or --flow-control, holds every pool's
		// requests; --flow-control-when-objectives only those of a pool
		// with objectives.
		FlowControlWhenObjectives: e.opts.RequestPath.FlowControlWhenObjectives && loaded.FlowControl == nil && !e.opts.RequestPath.FlowControl,
		FlowGate:                  flowcontrol.Gate{Saturation: loaded.Detector, ByPrediction: !e.opts.RequestPath.FlowControlBySaturation},
		Outliers:                  e.ds,
		Objectives:                e.objectives,
		Observers:                 observers,
		PluginObservers:           learners,
		Now:                       e.opts.Now,
		Datastore:                 e.ds,
		PrepareData:               e.graph,
		Scheduler:                 e.sched,
		InFlight:                  e.ds,
		PrepareDataTimeout:        e.prepareDataTimeout(),
		Tokenizer:                 e.tokenizer,
		Parse:                     openai.ParseOptions{KeepBillingHeader: e.opts.RequestPath.KeepBillingHeader},
		TokenizeTimeout:           e.opts.RequestPath.TokenizeTimeout,
		PassUnknownModels:         e.opts.RequestPath.PassUnknownModels,
		Ranks:                     e.index,
		NoRankPick:                e.opts.RequestPath.NoRankPick,
		Metrics:                   director.NewMetrics(e.reg),
		Logger:                    e.logger,
	})
	return err
}

// flowConfig is the controller's configuration from a loaded flowControl
// section, which means what it means upstream; nil gives upstream's
// defaults for the bands and kvroute's fair share across them.
func flowConfig(fc *config.FlowControl) flowcontrol.Config {
	if fc == nil {
		return flowcontrol.Config{FairShare: true}
	}
	band := func(b config.FlowBand) flowcontrol.Band {
		// The loader admits only the names these parse.
		o, _ := flowcontrol.ParseOrdering(b.Ordering)
		f, _ := flowcontrol.ParseFairness(b.Fairness)
		return flowcontrol.Band{Priority: b.Priority, MaxBytes: b.MaxBytes, MaxRequests: int(min(b.MaxRequests, 1<<31-1)), Ordering: o, Fairness: f, TTFTTarget: b.TTFTTarget}
	}
	c := flowcontrol.Config{MaxBytes: fc.MaxBytes, MaxRequests: int(min(fc.MaxRequests, 1<<31-1)), DefaultTTL: fc.DefaultRequestTTL, DefaultBand: band(fc.DefaultBand)}
	for _, b := range fc.Bands {
		c.Bands = append(c.Bands, band(b))
	}
	return c
}

// podOf is the pod discovery names for the endpoint at addr: the subject
// its relay publishes on and answers snapshot requests on.
func (e *EPP) podOf(addr string) (string, bool) {
	ep, ok := e.ds.ByAddress(addr)
	if !ok {
		return "", false
	}
	if ep.Pod != "" {
		return ep.Pod, true
	}
	return ep.Name, true
}

// Recovery resynchronises uncertain streams; nil with NoRecovery.
func (e *EPP) Recovery() *recovery.Recovery { return e.recovery }

// SelfCheck compares the engines' cached-token reports with the index;
// nil with NoSelfCheck.
func (e *EPP) SelfCheck() *selfcheck.Checker { return e.selfcheck }

// distrust is the self-check's verdict on an endpoint whose engine
// disagrees with the index: its streams are marked uncertain and, with
// recovery, resynchronised.
func (e *EPP) distrust(addr string) {
	if e.recovery != nil {
		e.recovery.Distrust(addr)
		return
	}
	streams := e.index.Streams(addr)
	if len(streams) == 0 {
		streams = []events.Stream{{Endpoint: addr}}
	}
	for _, s := range streams {
		e.index.Uncertain(s, events.ReasonDisagreement)
	}
}

// Director runs the request path: parse, tokenize, PrepareData, schedule.
func (e *EPP) Director() *director.Director { return e.director }

// FlowControl is the flow controller requests wait in; nil when off.
func (e *EPP) FlowControl() *flowcontrol.Controller { return e.flow }

// NATSURL is the URL of the NATS server the EPP consumes from.
func (e *EPP) NATSURL() string { return e.nc.ConnectedUrl() }

// HTTPAddr is the address the HTTP server listens on.
func (e *EPP) HTTPAddr() string { return e.httpLn.Addr().String() }

// DebugAddr is the address /debug/* is served on, empty when it is not.
func (e *EPP) DebugAddr() string {
	if e.debugLn == nil {
		return ""
	}
	return e.debugLn.Addr().String()
}

// Discovery is an endpoint discovery source that runs with the EPP.
type Discovery interface {
	Run(ctx context.Context) error
	// Synced reports whether the source has read its first full state.
	Synced() bool
}

func (e *EPP) setupDiscovery() error {
	if e.opts.Discovery == nil {
		return nil
	}
	d, err := e.opts.Discovery(e.ds, e.objectives, e.reg, e.logger)
	if err != nil {
		return fmt.Errorf("epp: discovery: %w", err)
	}
	e.discovery = d
	return nil
}

// Namespace and Pool name the pool whose events the EPP consumes.
func (e *EPP) Namespace() string { return e.opts.Namespace }

// Pool is the InferencePool's name.
func (e *EPP) Pool() string { return e.opts.Pool }

// Datastore is where endpoints are registered and read from.
func (e *EPP) Datastore() *datalayer.Datastore { return e.ds }

// Objectives are the pool's InferenceObjectives, as the request path reads
// them.
func (e *EPP) Objectives() *datalayer.Objectives { return e.objectives }

// Index is the exact prefix index.
func (e *EPP) Index() *index.Index { return e.index }

// Share is the sharing of dispatches with the pool's other replicas.
func (e *EPP) Share() *share.Sharer { return e.share }

// Registry holds every metric the EPP exports.
func (e *EPP) Registry() *prometheus.Registry { return e.reg }

// Ready reports whether the EPP can answer picks: it knows endpoints, its
// event consumer is connected, and it has caught up once: every endpoint
// has been heard from (or ReadyGrace has passed), and none is being
// resynchronised or awaits its first resync attempt (or ReadyTimeout has
// passed). A replica that restarts beside
// others so takes traffic only once it answers as they do.
func (e *EPP) Ready() bool {
	if e.ds.Len() == 0 || !e.consumer.Connected() || (e.discovery != nil && !e.discovery.Synced()) {
		return false
	}
	return e.caughtUp.Load() || e.catchUp(time.Now())
}

// catchUp reports, and latches, whether the first catch-up is done.
func (e *EPP) catchUp(now time.Time) bool {
	e.connectedAt.CompareAndSwap(0, now.UnixNano())
	since := now.Sub(time.Unix(0, e.connectedAt.Load()))
	timeout := e.opts.ReadyTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	unheard, recovering := e.catchingUp()
	switch {
	case since >= timeout:
		e.logger.Warn("ready without having caught up", "waited", since, "unheard", unheard, "recovering", recovering)
	case since < e.opts.ReadyGrace && unheard > 0, recovering > 0:
		return false
	case e.recovery != nil && e.recovery.Settling() > 0:
		return false
	case !e.share.CaughtUp():
		// Its peers' dispatches in flight, or it would pile onto the
		// endpoints they keep busy.
		return false
	}
	e.caughtUp.Store(true)
	return true
}

// catchingUp counts the endpoints no event or heartbeat has come from, and
// those whose stream is being resynchronised.
func (e *EPP) catchingUp() (unheard, recovering int) {
	for ep := range e.ds.All() {
		switch st, _ := e.index.State(ep.Address); st {
		case datalayer.StreamNone:
			unheard++
		case datalayer.StreamRecovering:
			recovering++
		}
	}
	return unheard, recovering
}

// Run runs every component until ctx is done, then shuts them down and
// releases what New acquired. It returns the first component error, if any.
func (e *EPP) Run(ctx context.Context) error {
	defer e.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		runErr  error
	)
	fail := func(err error) {
		if err != nil && !errors.Is(err, context.Canceled) {
			errOnce.Do(func() { runErr = err })
			cancel()
		}
	}
	goRun := func(f func() error) {
		wg.Add(1)
		go func() { defer wg.Done(); fail(f()) }()
	}

	if e.discovery != nil {
		goRun(func() error { return e.discovery.Run(ctx) })
	}
	goRun(func() error {
		// Events of an endpoint that is not yet a member are dropped, and a
		// JetStream stream replays at once: consuming starts once the
		// first endpoint set is known, so a restarted EPP keeps every
		// replayed batch of the pool's endpoints.
		if !e.awaitDiscovery(ctx) {
			return nil
		}
		return e.consumer.Run(ctx)
	})
	if e.recovery != nil {
		goRun(func() error { return e.recovery.Run(ctx) })
	}
	goRun(func() error { e.index.Run(ctx, time.Second); return nil })
	goRun(func() error {
		// Peers' dispatches to endpoints not yet known are dropped: the
		// catch-up starts once discovery knows the pool.
		if !e.awaitDiscovery(ctx) {
			return nil
		}
		return e.share.Run(ctx)
	})
	e.latency.run(ctx, goRun)
	if e.scraper != nil {
		goRun(func() error { e.scraper.Run(ctx); return nil })
	}
	if e.static != nil {
		goRun(func() error { e.static.Run(ctx); return nil })
	}
	if e.staticObj != nil {
		goRun(func() error { e.staticObj.Run(ctx); return nil })
	}
	e.runRequestPath(ctx, goRun)
	goRun(func() error {
		if err := e.httpSrv.Serve(e.httpLn); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("epp: HTTP server: %w", err)
		}
		return nil
	})
	goRun(func() error {
		<-ctx.Done()
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		return e.httpSrv.Shutdown(sctx)
	})
	if e.debugSrv != nil {
		goRun(func() error {
			if err := e.debugSrv.Serve(e.debugLn); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("epp: debug HTTP server: %w", err)
			}
			return nil
		})
		goRun(func() error {
			<-ctx.Done()
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			return e.debugSrv.Shutdown(sctx)
		})
	}
	wg.Wait()
	return runErr
}

// awaitDiscovery waits for the discovery source's first full state, if
// there is one; false means ctx ended first.
func (e *EPP) awaitDiscovery(ctx context.Context) bool {
	if e.discovery == nil {
		return true
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for waited := 0; !e.discovery.Synced(); waited++ {
		if waited > 0 && waited%500 == 0 {
			e.logger.Info("waiting for endpoint discovery's first sync before consuming KV events",
				"waited", time.Duration(waited)*20*time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// Close releases the NATS connection, the embedded server, the listeners
// and the tokenizers' round trips in flight. Run calls it once every
// component has stopped; call it only for an EPP that is never run.
func (e *EPP) Close() {
	if c, ok := e.tokenizer.(interface{ Close() }); ok {
		c.Close()
	}
	if e.httpLn != nil {
		_ = e.httpLn.Close()
	}
	if e.debugLn != nil {
		_ = e.debugLn.Close()
	}
	if e.extproc != nil {
		e.extproc.Close()
	}
	if e.proxy != nil {
		e.proxy.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	if e.shareNC != nil {
		e.shareNC.Close()
	}
	if e.nats != nil {
		e.nats.Shutdown()
		e.nats = nil
	}
}

// prepareDataTimeout bounds the PrepareData producers of one request.
func (e *EPP) prepareDataTimeout() time.Duration {
	if e.opts.PrepareDataTimeout > 0 {
		return e.opts.PrepareDataTimeout
	}
	return director.DefaultPrepareDataTimeout
}

// The flow controller hears each scrape land.
var _ scrape.Waker = (*flowcontrol.Controller)(nil)
