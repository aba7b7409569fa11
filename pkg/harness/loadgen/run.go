package loadgen

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvroute/kvroute/pkg/harness/gateway"
	"github.com/kvroute/kvroute/pkg/predict"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/sim"
)

// RunOptions shape one open-loop run.
type RunOptions struct {
	Model string
	// Rate is requests per second; multi-turn conversations start at
	// Rate/Turns so that requests arrive at about Rate.
	Rate float64
	// Duration is how long arrivals continue; Drain how long requests
	// still in flight may take after that before they are cut.
	Duration, Drain time.Duration
	// MaxTokens is the output length asked of each request.
	MaxTokens int
	// ThinkTime separates a conversation's turns.
	ThinkTime time.Duration
	Seed      uint64
	Client    *http.Client
	// Record, in virtual time, is given every response the EPP's latency
	// predictor learned (a trace); policies without one give none.
	Record func(predict.Sample)
	// during, when set, runs beside the run from its start, which it is
	// given (an EPP restart).
	during func(start time.Time)
}

// Result is a run's samples and the time its traffic took.
type Result struct {
	Samples  []Sample
	Makespan time.Duration
	// Predictor is the EPP's latency predictor's TTFT accuracy over the
	// run, from its own metrics; nil for a policy without one.
	Predictor *PredictorAccuracy
	// Evicted counts, in virtual time, the GPU blocks each engine evicted
	// (its BlockRemoved events), by engine; nil in real time.
	Evicted []int
	// Restart is what an EPP restart during the run did (Shape.RestartAt).
	Restart *Restart
	// PD is what a run on a fleet with roles did: splits, the prefill
	// pool's busy share, TPOT.
	PD *PDResult
	// Flow is, for a workload with tenants, the EPP's flow controller's
	// counts by flow (nil where none reported).
	Flow map[string]flowCount
}

// run drives w through r with Poisson arrivals until o.Duration, then waits
// for the requests in flight, cutting them at o.Duration+o.Drain.
func run(ctx context.Context, w Workload, r router, o RunOptions) Result {
	if o.Client == nil {
		o.Client = http.DefaultClient
	}
	turns := w.meanTurns()
	gen := newGenerator(w, o.Seed)
	arrivals := rand.New(rand.NewPCG(o.Seed, 0xa771))
	start := time.Now()
	cutCtx, cancel := context.WithDeadline(ctx, start.Add(o.Duration+o.Drain))
	defer cancel()

	var mu sync.Mutex
	var samples []Sample
	var wg sync.WaitGroup
	record := func(s Sample) {
		mu.Lock()
		samples = append(samples, s)
		mu.Unlock()
	}
	if o.during != nil {
		wg.Add(1)
		go func() { defer wg.Done(); o.during(start) }()
	}
	convRate := o.Rate / turns
	next := time.Duration(0)
	for {
		next += time.Duration(arrivals.ExpFloat64() / convRate * float64(time.Second))
		if next >= o.Duration {
			break
		}
		if d := time.Until(start.Add(next)); d > 0 {
			select {
			case <-ctx.Done():
				break
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		conv := gen.next()
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies := make([]string, 0, len(conv.Users))
			for i := range conv.Users {
				if i > 0 {
					select {
					case <-cutCtx.Done():
						return
					case <-time.After(o.ThinkTime):
					}
					if time.Since(start) >= o.Duration {
						return // the run's arrivals are over
					}
				}
				s, reply := send(cutCtx, r, conv, i, replies, o, start)
				record(s)
				if s.Err != nil || s.Cut || s.Shed {
					return
				}
				replies = append(replies, reply)
			}
		}()
	}
	wg.Wait()
	return Result{Samples: samples, Makespan: time.Since(start)}
}

// send runs one request as a streaming client and times it.
func send(ctx context.Context, r router, conv Conversation, turn int, replies []string, o RunOptions, start time.Time) (Sample, string) {
	t0 := time.Now()
	s := Sample{Start: t0.Sub(start), Engine: -1}
	path, body, err := conv.body(o.Model, turn, replies, o.MaxTokens)
	if err != nil {
		s.Err = err
		return s, ""
	}
	parsed, err := openai.ParseRequest(path, body)
	if err != nil {
		s.Err = fmt.Errorf("loadgen: own request refused: %w", err)
		return s, ""
	}
	tokens, err := engineTokens(ctx, parsed)
	if err != nil {
		s.Err = fmt.Errorf("loadgen: own request: %w", err)
		return s, ""
	}
	base, endpoint := r.route(parsed.Prompt, tokens)
	s.Bypass = isBypass(r, base)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
	if err != nil {
		s.Err = err
		return s, ""
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range conv.headers() {
		req.Header.Set(k, v)
	}
	if endpoint != "" {
		// The client chose: the EPP forwards to its choice and sheds
		// nothing of it (a request with no objective is not sheddable).
		req.Header.Set(director.HeaderSubsetHint, endpoint)
		req.Header.Del(director.HeaderObjective)
	}
	s.SLO, s.Tenant, s.Objective = conv.SLO, conv.Tenant, conv.Objective
	resp, err := o.Client.Do(req)
	if err != nil {
		return cut(s, t0, ctx, err), ""
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	s.Replica = resp.Header.Get(gateway.HeaderExtProcHost)
	if resp.StatusCode == http.StatusTooManyRequests {
		s.Shed = true
		return s, ""
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		s.Err = fmt.Errorf("loadgen: status %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		return s, ""
	}
	reply, err := readStream(resp.Body, &s, t0)
	// What follows the stream's last event (the chunked body's end) is
	// read, so that the connection is kept and the gateway sees the
	// answer taken whole.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		if errors.Is(err, sim.ErrStreamRead) {
			return cut(s, t0, ctx, err), ""
		}
		s.Err = err
		return s, ""
	}
	return s, reply
}

// readStream reads a completion stream into s: TTFT at the first token,
// E2E at the end, usage from the final chunk. It returns the reply's text.
func readStream(body io.Reader, s *Sample, t0 time.Time) (string, error) {
	res, err := sim.ReadStream(body, func() { s.TTFT = time.Since(t0) })
	if err != nil {
		return "", fmt.Errorf("loadgen: %w", err)
	}
	s.E2E = time.Since(t0)
	s.PromptTokens, s.CachedTokens, s.OutputTokens = res.PromptTokens, res.CachedTokens, res.CompletionTokens
	return res.Text, nil
}

// cut marks a request the deadline stopped; other failures are errors.
func cut(s Sample, t0 time.Time, ctx context.Context, err error) Sample {
	if ctx.Err() == nil {
		s.Err = err
		return s
	}
	s.Cut = true
	if s.TTFT == 0 {
		s.TTFT = time.Since(t0)
	}
	s.E2E = time.Since(t0)
	return s
}
