package epp_test

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/requestpath/director"
)

// An EPP built from its default options, on loopback with its embedded
// NATS server: one engine's KV events reach its index over NATS, and a
// request whose prompt that engine holds goes to it.
func Example() {
	o := epp.DefaultOptions()
	o.EmbeddedNATSAddr, o.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	// The request is handed to the director here, not through Envoy.
	o.RequestPath.ExtProcAddr, o.RequestPath.HealthAddr = "", ""
	// The pods below are addresses with no server behind them: nothing to
	// scrape, no /tokenize to ask, no relay to resynchronise from.
	o.Scrape, o.RequestPath.Tokenize, o.NoRecovery = false, false, true
	o.Logger = slog.New(slog.DiscardHandler)
	e, err := epp.New(o)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e.Datastore().Upsert(&datalayer.Endpoint{Name: "pod-a", Pod: "pod-a", Address: "10.0.0.1:8000", Model: "m"})
	e.Datastore().Upsert(&datalayer.Endpoint{Name: "pod-b", Pod: "pod-b", Address: "10.0.0.2:8000", Model: "m"})
	if !waitFor(e.Ready) {
		fmt.Println("the EPP is not ready")
		return
	}

	// pod-b's engine stores a 64-token prompt as four 16-token blocks and
	// publishes the batch as vLLM writes it, as its relay would.
	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	batch, err := events.AppendBatch(nil, &events.Batch{Events: []events.Event{{
		Kind: events.KindBlockStored, BlockHashes: []uint64{11, 12, 13, 14}, TokenIDs: prompt, BlockSize: 16,
	}}}, events.EncodingMap)
	if err != nil {
		fmt.Println(err)
		return
	}
	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	origin := events.Origin{Stream: events.Stream{Endpoint: "10.0.0.2:8000"}, Pod: "pod-b", Model: "m", Instance: "run-1", BlockSize: 16}
	if err := events.NewPublisher(nc, e.Namespace(), e.Pool()).Publish(origin, batch); err != nil {
		fmt.Println(err)
		return
	}
	if !waitFor(func() bool { st, _ := e.Index().State("10.0.0.2:8000"); return st == datalayer.StreamExact }) {
		fmt.Println("the batch did not reach the index")
		return
	}

	body := fmt.Sprintf(`{"model":"m","prompt":%s,"max_tokens":8}`, jsonArray(prompt))
	pick, err := e.Director().HandleRequest(ctx, &director.Input{Path: "/v1/completions", Body: []byte(body)})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer e.Director().HandleResponse(pick, director.Served{Endpoint: pick.Targets[0], Status: 200})
	info, _ := datalayer.PrefixCacheInfoOf(pick.Result.Targets()[0])
	fmt.Printf("%s holds %d of the prompt's %d blocks\n", pick.Targets[0], info.MatchBlocks, info.TotalBlocks)
	// Output: 10.0.0.2:8000 holds 4 of the prompt's 4 blocks
}

// waitFor polls cond for up to ten seconds.
func waitFor(cond func() bool) bool {
	for range 1000 {
		if cond() {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

func jsonArray(ids []uint32) string {
	b := []byte{'['}
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%d", id)
	}
	return string(append(b, ']'))
}
