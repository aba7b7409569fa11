// Package director is the request path's core, shared by the ext_proc
// server and the standalone proxy: parse the request, find its token ids,
// run PrepareData over the candidates, schedule, and report the pick; then,
// on the response path, account for what the endpoint served.
package director

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/plugin"
	"github.com/kvroute/kvroute/pkg/prepare"
	"github.com/kvroute/kvroute/pkg/request"
	"github.com/kvroute/kvroute/pkg/requestpath/flowcontrol"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/requestpath/tokenize"
	"github.com/kvroute/kvroute/pkg/scheduling"
	"github.com/kvroute/kvroute/pkg/scheduling/framework"
)

// Headers the request path reads and writes, as the Gateway API Inference
// Extension's endpoint picker protocol names them.
const (
	HeaderRequestID    = "x-request-id"
	HeaderModelRewrite = "x-gateway-model-name-rewrite"
	HeaderObjective    = "x-gateway-inference-objective"
	HeaderDestination  = "x-gateway-destination-endpoint"
	HeaderSubsetHint   = "x-gateway-destination-endpoint-subset"
	HeaderServed       = "x-gateway-destination-endpoint-served"
	// MetadataScores is the envoy.lb key of every scored endpoint's score
	// (upstream's --emit-endpoint-scores).
	MetadataScores      = "x-gateway-destination-endpoint-scores"
	HeaderSLOTTFT       = "x-slo-ttft-ms"
	HeaderSLOTPOT       = "x-slo-tpot-ms"
	MetadataDestination = "envoy.lb"
	MetadataSubsetHint  = "envoy.lb.subset_hint"
)

// Headers of disaggregated serving, as llm-d names them: set on the request
// sent to the decode pod, whose P/D sidecar sends the prefill (and encode)
// work to the pods they name before decoding.
const (
	// HeaderPrefiller is the prefill pod's ip:port.
	HeaderPrefiller = "x-prefiller-host-port"
	// HeaderEncoders are the encode pods' ip:ports, comma-separated.
	HeaderEncoders = "x-encoder-hosts-ports"
)

// Error is a request-path failure with the HTTP status the client gets.
type Error struct {
	Status int
	Err    error
	// Param names the request field at fault, as vLLM's errors do
	// ("model" for a model no endpoint serves).
	Param string
}

// ErrUnknownModel: no endpoint serves the requested model, as its base
// model or as a loaded LoRA adapter.
var ErrUnknownModel = errors.New("unknown model")

// ErrContextLength: the prompt does not fit the model's context.
var ErrContextLength = errors.New("prompt longer than the model's context")

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// StatusOf is the HTTP status for err: its Error's, else 500.
func StatusOf(err error) int {
	var e *Error
	if errors.As(err, &e) {
		return e.Status
	}
	return http.StatusInternalServerError
}

// Input is one request as the gateway or proxy received it.
type Input struct {
	// Path is the request's :path (it selects the API).
	Path string
	// Headers are the request headers, names lower-cased.
	Headers map[string]string
	Body    []byte
	// Subset, when non-empty, restricts candidates to these ip:port
	// addresses (the gateway's subset hint).
	Subset []string
	// IDBuf, when set, is memory a prompt given as token ids may be read
	// into (openai.ParseRequestInto); HandleRequest then sets it to the
	// memory the ids were read into, which is IDBuf's or, when that was
	// too small, a larger array. The caller may reuse it for another
	// request only once the pick's response is handled and the pick is
	// not HeldAfterResponse (or, with no pick, never).
	IDBuf []uint32
	// Candidates, when set, is memory the request's candidates are made
	// in (Datastore.CandidatesInto), reusable on the same terms as IDBuf.
	Candidates *datalayer.CandidateSet
}

// Pick is the director's answer: where the request goes.
type Pick struct {
	Request *request.Request
	// RequestedModel is the model the client named, before any rewrite.
	RequestedModel string
	// Body, when not nil, is the body to forward instead of the client's:
	// the same bytes with the model rewritten (x-gateway-model-name-rewrite).
	Body   []byte
	Result *framework.Result
	// Targets are the picked endpoints' ip:port addresses, primary first,
	// then fallbacks.
	Targets []string
	// Candidates are the request's candidates with what PrepareData put on them.
	Candidates []*datalayer.Candidate
	// Rank is the data-parallel rank of Targets[0] the request is pinned
	// to (datalayer.HeaderDataParallelRank), -1 when it names none: the
	// endpoint has one rank, or the model server balances its ranks.
	Rank int
	// Prefill is the ip:port of the pod that prefills the request before
	// Targets[0] decodes it (HeaderPrefiller); empty when Targets[0]
	// prefills it itself.
	Prefill string
	// Encoders are the ip:ports of the pods that encode the request's
	// multimodal parts (HeaderEncoders); empty when none do.
	Encoders []string
	Start    time.Time
	// Released is when flow control let the request go, after holding
	// it; zero when it went at once. The latency the predictor learns
	// runs from here: the wait is the queue's, not the endpoint's.
	Released time.Time
	// labels are the requested and target models as metric label values;
	// series their series.
	labels [2]string
	series *modelSeries

	// dispatch is the pick's place in its endpoint's in-flight accounting
	// (disp, when there is one); target holds Targets when there is one.
	dispatch *datalayer.Dispatch
	disp     datalayer.Dispatch
	target   [1]string
	// resp is what the plugin observers are told of the response.
	resp request.Response
	// status is the response's status once its headers came (HandleHeaders).
	status int
	// held: a PrepareData producer ran on a goroutine of its own, and may
	// still use the request after the response is handled.
	held bool
	// pd is a split pick's prefill leg (pd.go); nil when not split.
	pd *pdLegs
}

// HeldAfterResponse reports whether something the director ran for the
// pick (a PrepareData producer on a goroutine of its own, which may outlive
// its deadline) may still use the request after HandleResponse returns.
// When it does not, the request's memory ends with its response.
func (p *Pick) HeldAfterResponse() bool { return p.held }

// DefaultPrepareDataTimeout bounds PrepareData when Options leave it zero:
// upstream's 400ms.
const DefaultPrepareDataTimeout = 400 * time.Millisecond

// Datastore is where the director finds a request's candidates and the
// models the pool serves; *datalayer.Datastore is one.
type Datastore interface {
	// CandidatesInto snapshots the endpoints filter accepts (all of them
	// when filter is nil) as a request's candidates, made in set's memory
	// (new memory when set is nil).
	CandidatesInto(set *datalayer.CandidateSet, filter func(*datalayer.Endpoint) bool) []*datalayer.Candidate
	// Endpoints are the endpoints in name order, read only: the director
	// searches them for a request's model on every request, so the slice
	// is shared, not copied.
	Endpoints() []*datalayer.Endpoint
	// Metrics are the last scraped metrics of the endpoint named name.
	Metrics(name string) (datalayer.Metrics, bool)
}

// PrepareData runs the PrepareData producers over a request's candidates,
// within a timeout; *prepare.Graph is one.
type PrepareData interface {
	Run(ctx context.Context, timeout time.Duration, req *request.Request, cands []*datalayer.Candidate) error
	// AllInline reports whether every producer runs on Run's goroutine:
	// if one does not, it may use the request after its response.
	AllInline() bool
}

// Scheduler picks a request's endpoints from its candidates;
// *scheduling.Scheduler is one. Its errors wrap scheduling.ErrNoCandidates
// (503) or scheduling.ErrShed (429) where those apply.
type Scheduler interface {
	Schedule(ctx context.Context, req *request.Request, cands []*datalayer.Candidate) (*framework.Result, error)
}

// InFlight is the in-flight accounting every pick enters on its primary
// endpoint and leaves with its response; *datalayer.Datastore keeps it.
type InFlight interface {
	// DispatchInto accounts a request in d (new, its zero value) as sent
	// at at to the endpoint named name; false, d unused, when that
	// endpoint has left.
	DispatchInto(d *datalayer.Dispatch, name string, at time.Time, prefillTokens, promptTokens, outputs int) bool
}

// FlowControl holds requests until the pool can serve them in time;
// *flowcontrol.Controller is one.
type FlowControl interface {
	// Wait returns once r may be scheduled (nil), or with why not
	// (flowcontrol.StatusOf's status).
	Wait(ctx context.Context, r *flowcontrol.Request) error
	// Kick asks for the waiting requests' release to be evaluated again.
	Kick()
	// Target is the TTFT target of priority's band (zero: none).
	Target(priority int) time.Duration
	// Protect is what a request of priority from flow leaves room for:
	// the priorities above it that had requests lately, and more when
	// flow floods (flowcontrol.Controller.Protect; the zero Protection:
	// none).
	Protect(priority int, flow string) flowcontrol.Protection
}

// Outliers is outlier detection, told each response's outcome;
// *datalayer.Datastore is one.
type Outliers interface {
	ReportOutcome(addr string, o datalayer.Outcome)
	// OutlierDetection is the configuration in force; false when off.
	OutlierDetection() (datalayer.OutlierDetection, bool)
}

var (
	_ Outliers    = (*datalayer.Datastore)(nil)
	_ Datastore   = (*datalayer.Datastore)(nil)
	_ InFlight    = (*datalayer.Datastore)(nil)
	_ RankLoads   = (*datalayer.Datastore)(nil)
	_ PrepareData = (*prepare.Graph)(nil)
	_ Scheduler   = (*scheduling.Scheduler)(nil)
	_ FlowControl = (*flowcontrol.Controller)(nil)
)

// RankLoads is the in-flight accounting per data-parallel rank that a rank
// pick weighs; *datalayer.Datastore keeps it. An InFlight without it
// counts every rank as idle.
type RankLoads interface {
	RankLoads(name string, out []datalayer.RankLoad) []datalayer.RankLoad
}

// RankSpeculator records that a rank of an endpoint will soon hold keys.
type RankSpeculator interface {
	SpeculateRank(addr string, rank int, keys []uint64)
}

// Options wire a Director. Datastore, Scheduler and InFlight are required.
type Options struct {
	Datastore Datastore
	// PrepareData runs the PrepareData producers; nil runs none.
	PrepareData PrepareData
	Scheduler   Scheduler
	// InFlight accounts each pick until its response ends, for the
	// scorers and the latency predictor, which read it back through the
	// candidates.
	InFlight InFlight
	// Parse says how the model servers read what requests leave to them
	// (whether they drop Claude Code's billing header block).
	Parse openai.ParseOptions
	// Tokenizer finds token ids for requests that carry none; nil means
	// such requests are matched approximately.
	Tokenizer tokenize.Tokenizer
	// PrepareDataTimeout bounds PrepareData (default 400ms, as upstream).
	PrepareDataTimeout time.Duration
	// TokenizeTimeout bounds tokenization (default 200ms).
	TokenizeTimeout time.Duration
	// Objectives are the pool's InferenceObjectives: the objective a
	// request names (x-gateway-inference-objective) gives its priority and
	// default SLOs. An unknown objective, or none, means priority 0.
	Objectives *datalayer.Objectives
	// PassUnknownModels routes requests for a model that no endpoint
	// serves as its base model or reports as a loaded adapter; by default
	// they are refused with 404, as vLLM refuses them.
	PassUnknownModels bool
	// Observers hear every finished response after the director has
	// accounted for it (the index's self-check compares the engine's
	// cached tokens with the pick's prediction).
	Observers []ResponseObserver
	// PluginObservers are the scheduling plugins that learn from every
	// routed request's response once it ended (the latency predictor).
	PluginObservers []plugin.ResponseObserver
	// Outliers hears each response's outcome and ejects the endpoints
	// that keep failing; nil tells no one.
	Outliers Outliers
	// FlowControl, when set, holds each request between PrepareData and
	// scheduling until FlowGate releases it; nil: off.
	FlowControl FlowControl
	// FlowGate decides a waiting request's release from its candidates.
	FlowGate flowcontrol.Gate
	// FlowControlWhenObjectives sends requests past FlowControl while
	// Objectives holds none: a pool without priorities has no band to
	// favour, and its requests are better scheduled at once.
	FlowControlWhenObjectives bool
	// Ranks, when set, records a rank pick's blocks as soon to be held by
	// that rank (the index's SpeculateRank), so that the next request
	// with the prefix follows it before its events come; nil: none.
	Ranks RankSpeculator
	// NoRankPick leaves the data-parallel rank of an endpoint with several
	// to the model server's own balancing: no rank header is set.
	NoRankPick bool
	// Now is the clock requests are timed by; nil means time.Now.
	Now     func() time.Time
	Metrics *Metrics
	Logger  *slog.Logger
}

// ResponseObserver hears a finished response with the pick it answered.
// It runs on the response path, so it must be quick and must not block.
type ResponseObserver interface {
	ObserveResponse(p *Pick, s Served)
}

// Handler is the request path as its front ends drive it: the ext_proc
// server and the standalone proxy with a request's body (HandleRequest,
// PickAny), the load generator's virtual time with a request already parsed
// (Route); then each through the response's first byte, its progress and
// its end. *Director is one; a front end depends on this, not on it.
type Handler interface {
	// HandleRequest decides where a request goes; its errors are *Error.
	HandleRequest(ctx context.Context, in *Input) (*Pick, error)
	// Route schedules a request that is already parsed.
	Route(ctx context.Context, req *request.Request, subset []string) (*Pick, error)
	// PickAny routes a request without a body.
	PickAny(ctx context.Context, in *Input) (*Pick, error)
	// HandleHeaders notes the response's status.
	HandleHeaders(p *Pick, status int)
	// HandleUnreachable notes that a picked endpoint refused the
	// connection, and the next target was tried.
	HandleUnreachable(p *Pick, addr string)
	// HandleFirstByte notes the response's first body bytes.
	HandleFirstByte(p *Pick)
	// HandleProgress notes how many output tokens a streamed response has
	// carried so far.
	HandleProgress(p *Pick, tokens int)
	// HandleResponse accounts for the response's end, once per pick.
	HandleResponse(p *Pick, s Served)
}

var _ Handler = (*Director)(nil)

// Director runs the request path. It is safe for concurrent use.
type Director struct {
	o Options
}

// New returns a director.
func New(o Options) (*Director, error) {
	if o.Datastore == nil || o.Scheduler == nil || o.InFlight == nil {
		return nil, errors.New("director needs a datastore, a scheduler and in-flight accounting")
	}
	if o.PrepareDataTimeout <= 0 {
		o.PrepareDataTimeout = DefaultPrepareDataTimeout
	}
	if o.TokenizeTimeout <= 0 {
		o.TokenizeTimeout = 200 * time.Millisecond
	}
	if o.Metrics == nil {
		o.Metrics = NewMetrics(nil)
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Director{o: o}, nil
}

// HandleRequest decides where a request goes. Its errors are *Error with
// the status to answer: 400 for a malformed request, 503 when no endpoint
// can serve it, 429 when it is shed, 500 otherwise.
func (d *Director) HandleRequest(ctx context.Context, in *Input) (*Pick, error) {
	start := d.o.Now()
	req, err := openai.ParseRequestWith(in.Path, in.Body, in.IDBuf, d.o.Parse)
	if err != nil {
		d.o.Metrics.errors.WithLabelValues("", "", "400").Inc()
		return nil, &Error{Status: http.StatusBadRequest, Err: err}
	}
	if in.IDBuf != nil && cap(req.TokenIDs) > cap(in.IDBuf) {
		in.IDBuf = req.TokenIDs[:0]
	}
	req.Headers = in.Headers
	req.ID = in.Headers[HeaderRequestID]
	requested := req.Model
	if m := in.Headers[HeaderModelRewrite]; m != "" {
		req.Model = m
	}
	if req.Model == "" && req.API != request.APIOther {
		// An API that lets the model server pick its model (generate,
		// embeddings, Responses): the pool's one model, when it has one.
		// A request on a path kvroute does not parse keeps no model, as
		// upstream's passthrough parser counts it.
		req.Model = d.soleModel()
	}
	known := d.known(req.Model)
	// A request kvroute does not parse and that names no model is routed
	// as upstream's passthrough parser routes it: on load alone.
	if req.Model != "" && !known.base && !known.adapter && !d.o.PassUnknownModels {
		d.o.Metrics.errors.WithLabelValues(labelOther, labelOther, "404").Inc()
		return nil, &Error{Status: http.StatusNotFound, Param: "model",
			Err: fmt.Errorf("%w: the model `%s` does not exist", ErrUnknownModel, Echo(req.Model))}
	}
	if req.LoRA == "" && !known.base {
		// A model name no endpoint serves as its base model names a LoRA
		// adapter: vLLM keys the adapter's blocks by its name.
		req.LoRA = req.Model
	}
	var body []byte
	if requested != "" && req.Model != requested {
		// The model server is asked for the model the request is routed
		// for, not the one the client named. A body that names none (an
		// API whose model server picks its one model) is passed on as it
		// is.
		if body, err = openai.ReplaceModel(in.Body, req.Model); err != nil {
			d.o.Metrics.errors.WithLabelValues("", "", "400").Inc()
			return nil, &Error{Status: http.StatusBadRequest, Param: "model", Err: err}
		}
	}
	p, err := d.route(ctx, req, in.Subset, requested, in.Candidates, int64(len(in.Body)), start, d.o.Now())
	if p != nil {
		p.Body = body
	}
	return p, err
}

// Route schedules an already parsed request: it reads the objective and
// SLOs its headers name, finds the prompt's token ids if the request lacks
// them, runs PrepareData over the candidates (the endpoints in subset, or
// all when subset is empty), and schedules. Its errors are as
// HandleRequest's.
func (d *Director) Route(ctx context.Context, req *request.Request, subset []string) (*Pick, error) {
	now := d.o.Now()
	return d.route(ctx, req, subset, req.Model, nil, 0, now, now)
}

// route is Route for a request whose handling began at start (its Pick's
// Start) and that is scheduled as arriving at arrival; bodyBytes is what
// its body holds while it waits in flow control.
func (d *Director) route(ctx context.Context, req *request.Request, subset []string, requested string, set *datalayer.CandidateSet, bodyBytes int64, start, arrival time.Time) (*Pick, error) {
	req.Arrival = arrival
	if req.ID == "" {
		req.ID = uuid.NewString()
	}
	labels := [2]string{d.modelLabel(requested), d.modelLabel(req.Model)}
	if err := d.objective(req, req.Headers); err != nil {
		d.o.Metrics.errors.WithLabelValues(labels[0], labels[1], "400").Inc()
		return nil, &Error{Status: http.StatusBadRequest, Err: err}
	}
	d.tokenize(ctx, req)
	if err := d.checkContext(req); err != nil {
		d.o.Metrics.errors.WithLabelValues(labels[0], labels[1], "400").Inc()
		return nil, err
	}

	cands := d.o.Datastore.CandidatesInto(set, subsetFilter(subset))
	if len(cands) == 0 {
		d.o.Metrics.errors.WithLabelValues(labels[0], labels[1], "503").Inc()
		return nil, &Error{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("no ready endpoint%s", subsetNote(subset))}
	}
	if d.o.PrepareData != nil {
		if err := d.o.PrepareData.Run(ctx, d.o.PrepareDataTimeout, req, cands); err != nil {
			// Producers' failures are logged by the graph; the request is
			// still scheduled on whatever data did arrive.
			d.o.Metrics.prepareFailures.Inc()
		}
	}
	var released time.Time
	if d.o.FlowControl != nil && (!d.o.FlowControlWhenObjectives || d.o.Objectives.Len() > 0) {
		var err error
		if cands, err = d.waitForRelease(ctx, req, subset, set, cands, bodyBytes); err != nil {
			status := flowcontrol.StatusOf(err)
			if e := (*Error)(nil); errors.As(err, &e) {
				status = e.Status
			}
			d.o.Metrics.errors.WithLabelValues(labels[0], labels[1], fmt.Sprint(status)).Inc()
			return nil, &Error{Status: status, Err: fmt.Errorf("flow control: %w", err)}
		}
		if !req.Arrival.Equal(arrival) {
			released = req.Arrival
		}
		// The controller checks the next waiting request once this one's
		// dispatch is accounted, or it has failed: after it, either way.
		defer d.o.FlowControl.Kick()
	}
	res, err := d.o.Scheduler.Schedule(ctx, req, cands)
	if err != nil {
		status := http.StatusInternalServerError
		switch {
		case errors.Is(err, scheduling.ErrNoCandidates):
			status = http.StatusServiceUnavailable
		case errors.Is(err, scheduling.ErrShed):
			status = http.StatusTooManyRequests
		}
		d.o.Metrics.errors.WithLabelValues(labels[0], labels[1], fmt.Sprint(status)).Inc()
		return nil, &Error{Status: status, Err: fmt.Errorf("schedule: %w", err)}
	}
	p := &Pick{Request: req, RequestedModel: requested, Result: res, Candidates: cands, Start: start, Released: released, labels: labels, Rank: -1,
		held: d.o.PrepareData != nil && !d.o.PrepareData.AllInline()}
	if t := res.Targets(); len(t) == 1 {
		p.target[0] = t[0].Address
		p.Targets = p.target[:]
	} else {
		for _, c := range t {
			p.Targets = append(p.Targets, c.Address)
		}
	}
	if len(p.Targets) == 0 {
		d.o.Metrics.errors.WithLabelValues(labels[0], labels[1], "503").Inc()
		return nil, &Error{Status: http.StatusServiceUnavailable, Err: errors.New("scheduler picked no endpoint")}
	}
	if c := res.Prefill(); c != nil {
		p.Prefill = c.Address
	}
	for _, c := range res.Encoders() {
		p.Encoders = append(p.Encoders, c.Address)
	}
	d.o.Metrics.observePick(p)
	if pc := res.Prefill(); pc != nil {
		d.dispatchSplit(p, req, res.Targets()[0], pc)
	} else {
		d.pickRank(p, req, res.Targets()[0])
		if d.dispatch(&p.disp, req, res.Targets()[0]) {
			p.dispatch = &p.disp
			if p.Rank >= 0 {
				p.disp.OnRank(p.Rank)
			}
		}
	}
	return p, nil
}

// waitForRelease holds req in flow control until the gate releases it,
// and returns the candidates it was released on: those of its last
// check, with PrepareData's answers as of then.
func (d *Director) waitForRelease(ctx context.Context, req *request.Request, subset []string, set *datalayer.CandidateSet, cands []*datalayer.Candidate, bodyBytes int64) ([]*datalayer.Candidate, error) {
	fr := &flowcontrol.Request{FlowID: req.Headers[flowcontrol.HeaderFairnessID], Priority: req.Priority, Bytes: bodyBytes, SLO: req.SLO.TTFT,
		Cost: float64(max(len(req.TokenIDs), 1))}
	if len(fr.FlowID) > MaxEcho {
		// A flow id is the client's text: kept short in memory and logs,
		// cut at a character's start.
		cut := MaxEcho
		for cut > 0 && !utf8.RuneStart(fr.FlowID[cut]) {
			cut--
		}
		fr.FlowID = fr.FlowID[:cut]
	}
	target := d.o.FlowControl.Target(req.Priority)
	if _, alone, ok := flowcontrol.Predicted(cands); ok && req.SLO.TTFT > 0 && d.o.FlowGate.ByPrediction {
		// Past this the SLO is out of reach even on an idle endpoint.
		fr.GiveUp = max(req.SLO.TTFT-alone, time.Nanosecond)
	}
	fresh := d.o.PrepareData == nil || d.o.PrepareData.AllInline()
	checked := false
	fr.Check = func(waited time.Duration) flowcontrol.Verdict {
		if checked || waited > 0 {
			// The request is scheduled as arriving now: the predictor
			// reads the endpoints' in-flight work against it, and its
			// dispatch enters the in-flight accounting at it.
			req.Arrival = d.o.Now()
			// The load has moved since: candidates and predictions anew.
			// A producer that may outlive its deadline could still write
			// to the old ones, so they get new memory then.
			if !fresh {
				set = nil
			}
			cands = d.o.Datastore.CandidatesInto(set, subsetFilter(subset))
			if d.o.PrepareData != nil && len(cands) > 0 {
				if err := d.o.PrepareData.Run(ctx, d.o.PrepareDataTimeout, req, cands); err != nil {
					d.o.Metrics.prepareFailures.Inc()
				}
			}
		}
		checked = true
		protect := d.o.FlowControl.Protect(req.Priority, fr.FlowID)
		return d.o.FlowGate.Decide(cands, req.SLO.TTFT, target, protect, waited, d.o.Now())
	}
	if err := d.o.FlowControl.Wait(ctx, fr); err != nil {
		return nil, err
	}
	if len(cands) == 0 {
		return nil, &Error{Status: http.StatusServiceUnavailable, Err: fmt.Errorf("no ready endpoint%s", subsetNote(subset))}
	}
	return cands, nil
}

// checkContext refuses a prompt that cannot fit the model's context, when
// the tokenizer has learned that context from the model server: the
// client gets a message that says so instead of the model server's
// arithmetic on a negative remainder.
func (d *Director) checkContext(req *request.Request) error {
	cl, ok := d.o.Tokenizer.(tokenize.ContextLengths)
	if !ok || !req.TokensKnown() {
		return nil
	}
	limit, ok := cl.MaxModelLen(req.Model)
	if !ok || len(req.TokenIDs) < limit {
		return nil
	}
	return &Error{Status: http.StatusBadRequest, Param: "prompt", Err: fmt.Errorf(
		"%w: this model's maximum context length is %d tokens, and the prompt alone is %d tokens; shorten the prompt",
		ErrContextLength, limit, len(req.TokenIDs))}
}

// pickRank names, for an endpoint with several data-parallel ranks behind
// its address, the rank the request goes to (datalayer.PickRank: the
// rank's trusted cached prefix against its load), and tells the index that
// rank will hold the request's blocks.
func (d *Director) pickRank(p *Pick, req *request.Request, c *datalayer.Candidate) {
	if d.o.NoRankPick {
		return
	}
	info, ok := datalayer.PrefixCacheInfoOf(c)
	if !ok || (info.Ranks == nil && c.Metrics.DataParallelRanks < 2) {
		return
	}
	var loads []datalayer.RankLoad
	if rl, ok := d.o.InFlight.(RankLoads); ok {
		var buf [8]datalayer.RankLoad
		loads = rl.RankLoads(c.Name, buf[:0])
	}
	prompt := len(req.TokenIDs)
	if prompt == 0 {
		prompt = info.TotalBlocks * info.BlockSizeTokens
	}
	rank, ok := datalayer.PickRank(&info, loads, prompt, c.Metrics.DataParallelRanks)
	if !ok {
		return
	}
	p.Rank = rank
	if d.o.Ranks == nil {
		return
	}
	if v, ok := c.Get(framework.RequestBlockKeysKey); ok {
		if keys, ok := v.([]uint64); ok && len(keys) > 0 {
			d.o.Ranks.SpeculateRank(c.Address, rank, keys)
		}
	}
}

// dispatch accounts the pick as in flight on its primary endpoint, in dp,
// with the prompt tokens PrepareData says are not cached there; false
// when the endpoint has left.
func (d *Director) dispatch(dp *datalayer.Dispatch, req *request.Request, c *datalayer.Candidate) bool {
	prompt := len(req.TokenIDs)
	info, _ := datalayer.PrefixCacheInfoOf(c)
	if prompt == 0 {
		prompt = info.TotalBlocks * info.BlockSizeTokens
	}
	if !d.o.InFlight.DispatchInto(dp, c.Name, req.Arrival, prompt-info.MatchTokens, prompt, req.MaxTokens) {
		return false
	}
	if v, ok := c.Get(framework.RequestBlockKeysKey); ok {
		// Its prefix family is the endpoint's most recently used now.
		if keys, ok := v.([]uint64); ok && len(keys) > 0 {
			c.Residency.Touch(keys[0], len(keys), req.Arrival.UnixNano())
		}
	}
	if lat, ok := datalayer.LatencyPredictionOf(c); ok {
		if lat.TTFTValid {
			// Its own prefill, which requests sent after it wait behind.
			dp.ExpectPrefill(time.Duration(lat.TTFTAlone * float64(time.Millisecond)))
		}
		if lat.TPOTValid {
			// Its output at its predicted pace, until the pace its tokens
			// come at says otherwise (HandleProgress).
			dp.ExpectDecode(time.Duration(min(lat.TPOTMean, 6e4) * float64(time.Millisecond)))
		}
	}
	// Peer replicas, if the datastore shares dispatches, count it too.
	dp.Announce()
	return true
}

// maxSLOHeader bounds an SLO header's length: 1e9 ms with any sensible
// fraction fits in far less.
const maxSLOHeader = 32

// objective fills in the request's objective, priority and SLOs: headers
// first, then the objective's defaults.
func (d *Director) objective(req *request.Request, h map[string]string) error {
	if name := h[HeaderObjective]; name != "" {
		req.Objective = name
		if obj, ok := d.o.Objectives.Get(name); ok {
			req.Priority = obj.Priority
			req.SLO = request.SLO{TTFT: obj.TTFT, TPOT: obj.TPOT}
		}
	}
	for _, s := range []struct {
		header string
		into   *time.Duration
	}{{HeaderSLOTTFT, &req.SLO.TTFT}, {HeaderSLOTPOT, &req.SLO.TPOT}} {
		v, ok := h[s.header]
		if !ok {
			continue
		}
		ms, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		// NaN fails every comparison; below 1 ms (1e-300 among them) an
		// SLO is a typo or a probe, not a target.
		if len(v) > maxSLOHeader || err != nil || !(ms >= 1) || ms > 1e9 {
			return fmt.Errorf("header %s: %q is not a number of milliseconds from 1 to 1e9", s.header, Echo(v))
		}
		*s.into = time.Duration(ms * float64(time.Millisecond))
	}
	return nil
}

// tokenize fills in req's token ids when the request did not carry them
// and a tokenizer is configured. A failure leaves them unknown: the request
// is still routed, with approximate prefix answers.
func (d *Director) tokenize(ctx context.Context, req *request.Request) {
	if req.InexactPrefix != "" {
		// The prompt's head is what the model server stored, unseen here:
		// tokens of the rest alone would match nothing that is cached.
		d.o.Metrics.inexact.WithLabelValues(req.API.String(), req.InexactPrefix).Inc()
		d.o.Logger.LogAttrs(ctx, slog.LevelDebug, "prompt not known in full; routing approximately",
			slog.String("request", req.ID), slog.String("reason", req.InexactPrefix))
		return
	}
	if req.TokensKnown() || req.NoReproduciblePrefix || d.o.Tokenizer == nil || req.API == request.APIOther {
		return
	}
	tctx, cancel := context.WithTimeout(ctx, d.o.TokenizeTimeout)
	defer cancel()
	ids, err := d.o.Tokenizer.Tokenize(tctx, req)
	if err != nil {
		d.o.Metrics.tokenizeFailures.Inc()
		d.o.Logger.LogAttrs(ctx, slog.LevelDebug, "tokenization failed; routing approximately",
			slog.String("request", req.ID), slog.Any("error", err))
		return
	}
	req.TokenIDs = ids
}

// Served is what the response path learned about a request.
type Served struct {
	// Endpoint is the ip:port that served it (x-gateway-destination-endpoint-served),
	// or the primary target when the gateway did not say.
	Endpoint string
	Status   int
	Usage    openai.Usage
	// Streamed is true for an event-stream response, whose first body
	// bytes are its first token.
	Streamed bool
	// FirstByte is when the response's first body bytes arrived (zero if never).
	FirstByte time.Time
	End       time.Time
	// ConnFailed: no whole answer came from the endpoint: the connection
	// was refused, or reset or broken before the response ended (Status
	// is then what the client was answered, if anything).
	ConnFailed bool
}

// HandleHeaders notes the response's status, once its headers came: the
// body of an error answer says nothing of the endpoint's pace, so its
// bytes are not taken as tokens (HandleFirstByte, HandleProgress).
func (d *Director) HandleHeaders(p *Pick, status int) {
	p.status = status
}

// HandleUnreachable notes that addr, one of the pick's targets, refused
// the connection before the request could reach it, and the next target
// was tried: a failure of addr's, as outlier detection counts them.
func (d *Director) HandleUnreachable(p *Pick, addr string) {
	if d.o.Outliers != nil {
		d.o.Outliers.ReportOutcome(addr, datalayer.OutcomeConnect)
	}
}

// HandleFirstByte notes that the pick's response has begun: its endpoint
// has finished the request's prefill.
func (d *Director) HandleFirstByte(p *Pick) {
	if p.status >= 400 {
		return
	}
	p.dispatch.FirstToken(d.o.Now())
	if d.o.FlowControl != nil {
		// Its prefill is done: whoever waits behind it on the endpoint
		// is predicted sooner now.
		d.o.FlowControl.Kick()
	}
}

// HandleProgress notes that tokens of the pick's output tokens (its first
// included) have come back: how fast they come says when the request will
// end, and free its seat. Call it from the goroutine that calls
// HandleFirstByte and HandleResponse.
func (d *Director) HandleProgress(p *Pick, tokens int) {
	if p.status >= 400 {
		return
	}
	p.dispatch.Progress(d.o.Now(), tokens)
}

// HandleResponse accounts for a finished response, reports its outcome to
// outlier detection, and tells the observers; a failed response teaches
// the plugin observers (the latency predictor) nothing. It is called once
// per pick, however the response ended.
func (d *Director) HandleResponse(p *Pick, s Served) {
	outcome := d.Outcome(p, s)
	if outcome.Failure() {
		p.dispatch.Fail()
	} else {
		p.dispatch.DoneAt(s.End)
	}
	d.endSplit(p, s)
	if d.o.FlowControl != nil {
		// An endpoint has one request less ahead of a waiting one.
		d.o.FlowControl.Kick()
	}
	d.o.Metrics.observeResponse(p, s)
	if outcome != datalayer.OutcomeNone && d.o.Outliers != nil {
		d.o.Outliers.ReportOutcome(servedBy(p, s), outcome)
	}
	for _, o := range d.o.Observers {
		o.ObserveResponse(p, s)
	}
	if p.Result == nil || len(d.o.PluginObservers) == 0 || outcome.Failure() {
		return
	}
	resp := &p.resp
	*resp = request.Response{
		Endpoint: s.Endpoint, Status: s.Status, Streamed: s.Streamed,
		Start: p.dispatchStart(), FirstByte: s.FirstByte, End: s.End,
		PromptTokens: s.Usage.PromptTokens, CompletionTokens: s.Usage.CompletionTokens, CachedTokens: s.Usage.CachedTokens,
		RequestedModel: p.RequestedModel,
	}
	if p.Prefill != "" {
		resp.PrefilledBy = p.Prefill
	}
	if t := p.Result.Targets(); len(t) > 0 && t[0].Address == s.Endpoint {
		// What was predicted of the primary pick says nothing of a
		// fallback that served instead.
		resp.Picked = t[0]
	}
	if resp.End.IsZero() {
		resp.End = d.o.Now()
	}
	for _, o := range d.o.PluginObservers {
		o.ObserveResponse(context.Background(), p.Request, resp)
	}
}

// knownModel says how the pool knows a model name.
type knownModel struct {
	// base: some endpoint serves it as its base model (or some endpoint
	// does not say what it serves, or there are none to ask).
	base bool
	// adapter: some endpoint reports it as a LoRA adapter, running or
	// waiting.
	adapter bool
}

// known looks model up among the endpoints and their scraped metrics.
func (d *Director) known(model string) knownModel {
	eps := d.o.Datastore.Endpoints()
	if len(eps) == 0 {
		return knownModel{base: true}
	}
	for _, ep := range eps {
		if ep.Model == model || ep.Model == "" {
			return knownModel{base: true}
		}
	}
	for _, ep := range eps {
		if m, ok := d.o.Datastore.Metrics(ep.Name); ok && (slices.Contains(m.ActiveLoRAs, model) || slices.Contains(m.WaitingLoRAs, model)) {
			return knownModel{adapter: true}
		}
	}
	return knownModel{}
}

// soleModel is the base model every endpoint that says serves, "" when
// they name none or several.
func (d *Director) soleModel() string {
	model := ""
	for _, ep := range d.o.Datastore.Endpoints() {
		switch {
		case ep.Model == "" || ep.Model == model:
		case model == "":
			model = ep.Model
		default:
			return ""
		}
	}
	return model
}

// labelOther is the label value every model name the pool does not know
// folds into.
const labelOther = "other"

// modelLabel is model as a metric label value: the name when an endpoint
// serves it or reports it as an adapter, or an objective is named so,
// else labelOther. A label value
// is a series for good, and a model name is the client's text.
func (d *Director) modelLabel(model string) string {
	for _, ep := range d.o.Datastore.Endpoints() {
		if ep.Model == model {
			return model
		}
	}
	if model != "" {
		if k := d.known(model); k.adapter {
			return model
		}
		// An objective's name is the operator's, so as bounded a label as
		// the pool's models: upstream's dashboards break requests down by it.
		if _, ok := d.o.Objectives.Get(model); ok {
			return model
		}
	}
	if model == "" {
		return ""
	}
	return labelOther
}

// MaxEcho is the most of a client's value an error message quotes.
const MaxEcho = 64

// Echo is a client's value (a model name, a header, a path) as an error
// body or a log line may quote it: whole when it is short, else its first
// MaxEcho bytes, cut at a character's start, and its length. A refusal
// then never carries back, or into logs, what a client chose to make big.
func Echo(s string) string {
	if len(s) <= MaxEcho {
		return s
	}
	cut := MaxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

func subsetFilter(subset []string) func(*datalayer.Endpoint) bool {
	if len(subset) == 0 {
		return nil
	}
	allowed := make(map[string]bool, len(subset))
	for _, a := range subset {
		allowed[a] = true
	}
	return func(ep *datalayer.Endpoint) bool { return allowed[ep.Address] }
}

func subsetNote(subset []string) string {
	if len(subset) == 0 {
		return ""
	}
	return fmt.Sprintf(" among the %d endpoints of the subset hint", len(subset))
}

// dispatchStart is when the request left for its endpoint, as far as the
// EPP knows: its release from flow control, else its arrival.
func (p *Pick) dispatchStart() time.Time {
	if !p.Released.IsZero() {
		return p.Released
	}
	return p.Start
}
