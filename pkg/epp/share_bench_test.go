package epp

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/datalayer/share"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
	"github.com/kvroute/kvroute/pkg/requestpath/openai"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// BenchmarkShareDispatches measures what sharing dispatches costs a
// replica per request: two replicas that share, each handling a request
// in turn (so each publishes its own dispatches and applies the other's),
// against two that do not, in alternating turns of the same run. A request
// is BenchmarkHandleRequest's (64 endpoints, an 8k-token prompt as token
// ids, its first byte and end accounted at once). The CPU is the
// replicas' process's alone: the NATS server runs in a process of its
// own, as it does when deployed.
//
// "max" sends requests back to back, and the messages carry many steps
// each; "paced" sends one request per replica every 4ms, more than a
// flush interval apart, so that each request's steps travel in messages
// of their own: the most messages per request.
func BenchmarkShareDispatches(b *testing.B) {
	for _, pace := range []struct {
		name  string
		every time.Duration
	}{{"max", 0}, {"paced", 4 * time.Millisecond}} {
		b.Run(pace.name, func(b *testing.B) { benchShare(b, pace.every) })
	}
}

type shareBenchReplica struct {
	e      *EPP
	d      *director.Director
	bodies [][]byte
	ids    []uint32
	set    datalayer.CandidateSet
	n      int
}

func benchShare(b *testing.B, every time.Duration) {
	const endpoints, tokens, bs = 64, 8192, 16
	r := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]uint32, endpoints)
	for i := range prompts {
		prompts[i] = make([]uint32, tokens)
		for k := range prompts[i] {
			prompts[i][k] = uint32(r.IntN(150000))
		}
	}
	natsURL := testkit.StartNATSProcess(b).URL()
	replica := func(shareOff bool) *shareBenchReplica {
		o := Options{Pool: "bench", HTTPAddr: "127.0.0.1:0", NATSURL: natsURL,
			Share: share.Options{Disabled: shareOff}}
		e, err := New(o)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(e.Close)
		now := time.Now()
		rp := &shareBenchReplica{e: e, d: e.Director()}
		for i := range endpoints {
			addr := fmt.Sprintf("10.1.0.%d:8000", i+1)
			e.Datastore().Upsert(&datalayer.Endpoint{Name: fmt.Sprintf("pod-%d", i), Address: addr, Model: "m"})
			e.Datastore().SetMetrics(fmt.Sprintf("pod-%d", i), datalayer.Metrics{
				WaitingQueueSize: r.IntN(4), RunningRequests: r.IntN(16), KVCacheUsage: r.Float64() * 0.7, UpdateTime: now.Add(time.Hour),
				BlockSize: bs,
			})
			hashes := make([]uint64, tokens/bs)
			for k := range hashes {
				hashes[k] = uint64(i)<<32 | uint64(k+1)
			}
			e.Index().Apply(events.Origin{Stream: events.Stream{Endpoint: addr}, Model: "m", BlockSize: bs, Instance: "i"},
				&events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: hashes, TokenIDs: prompts[i], BlockSize: bs}}})
			body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompts[i], "max_tokens": 1})
			rp.bodies = append(rp.bodies, body)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = e.Share().Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done })
		return rp
	}
	shared := []*shareBenchReplica{replica(false), replica(false)}
	alone := []*shareBenchReplica{replica(true), replica(true)}
	testkit.WaitFor(b, "the sharing replicas to hear each other", func() error {
		for _, rp := range shared {
			if st := rp.e.Share().State(); st != share.StateSharing {
				return fmt.Errorf("state %v", st)
			}
		}
		return nil
	})
	ctx := context.Background()
	headers := map[string]string{":path": "/v1/completions", "content-type": "application/json", director.HeaderRequestID: "bench"}
	one := func(rp *shareBenchReplica) {
		in := director.Input{Path: "/v1/completions", Headers: headers, Body: rp.bodies[rp.n%endpoints], IDBuf: rp.ids[:0:cap(rp.ids)], Candidates: &rp.set}
		if in.IDBuf == nil {
			in.IDBuf = []uint32{}
		}
		rp.n++
		p, err := rp.d.HandleRequest(ctx, &in)
		if err != nil {
			b.Fatal(err)
		}
		rp.ids = in.IDBuf
		t := time.Now()
		rp.d.HandleFirstByte(p)
		rp.d.HandleResponse(p, director.Served{Endpoint: p.Targets[0], Status: 200, FirstByte: t, End: t,
			Usage: openai.Usage{PromptTokens: tokens, CompletionTokens: 1}})
	}
	// Turns of this many rounds (a request on each replica of the pair)
	// alternate between the pairs, so that the machine's load weighs on both.
	const turn = 50
	var cpu [2]time.Duration
	var reqs [2]int
	pair := 0
	var sinceTurn int
	start := testkit.CPUTime()
	for b.Loop() {
		pr := alone
		if pair == 1 {
			pr = shared
		}
		for _, rp := range pr {
			one(rp)
		}
		reqs[pair] += len(pr)
		if every > 0 {
			time.Sleep(every)
		}
		if sinceTurn++; sinceTurn == turn {
			now := testkit.CPUTime()
			cpu[pair] += now - start
			start, sinceTurn, pair = now, 0, 1-pair
		}
	}
	cpu[pair] += testkit.CPUTime() - start
	if reqs[0] == 0 || reqs[1] == 0 {
		b.ReportMetric(0, "ratio")
		return
	}
	// Let the last messages land before the counters are read.
	time.Sleep(20 * time.Millisecond)
	perReq := func(i int) float64 { return float64(cpu[i].Nanoseconds()) / float64(reqs[i]) / 1000 }
	b.ReportMetric(perReq(0), "cpu-µs/req-alone")
	b.ReportMetric(perReq(1), "cpu-µs/req-shared")
	b.ReportMetric(perReq(1)/perReq(0), "cpu-ratio")
	var msgs, bytes float64
	for _, rp := range shared {
		msgs += testkit.Value(b, rp.e.Registry(), "kvroute_dispatch_share_messages_total", "direction", "published")
		bytes += testkit.Value(b, rp.e.Registry(), "kvroute_dispatch_share_bytes_total", "direction", "published")
	}
	b.ReportMetric(msgs/float64(reqs[1]), "msgs/req")
	b.ReportMetric(bytes/float64(reqs[1]), "bytes/req")
}
