package epp_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/epp/prefixquery"
	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/sim"
	"github.com/kvroute/kvroute/pkg/sim/blockpool"
	"github.com/kvroute/kvroute/pkg/testkit"
	"github.com/kvroute/kvroute/pkg/testkit/envoy"
)

// TestTheEPPRoutesByCacheOverExtProcAndTheProxy runs the assembled EPP with
// both request paths on loopback, engines publishing real events, and
// checks that Envoy's ext_proc stream and the proxy both send a prompt to
// the engine holding its prefix.
func TestTheEPPRoutesByCacheOverExtProcAndTheProxy(t *testing.T) {
	// Model servers: each answers completions with its own name, so the
	// proxy's choice is visible.
	servers := make([]string, 3)
	for i := range servers {
		name := fmt.Sprintf("pod-%d", i)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"x","served_by":%q,"usage":{"prompt_tokens":64,"completion_tokens":1}}`, name)
		})}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
		t.Cleanup(func() { _ = srv.Close() })
		servers[i] = ln.Addr().String()
	}

	e, err := epp.New(epp.Options{
		Pool: "pool-a", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0",
		RequestPath: epp.RequestPathOptions{ExtProcAddr: "127.0.0.1:0", Plaintext: true, ProxyAddr: "127.0.0.1:0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("EPP run: %v", err)
		}
	}()

	nc, err := nats.Connect(e.NATSURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	pub := events.NewPublisher(nc, e.Namespace(), e.Pool())
	engines := make([]*sim.Engine, len(servers))
	for i, addr := range servers {
		cfg := sim.EngineConfig{Pod: fmt.Sprintf("pod-%d", i), Address: addr, Model: "m",
			Pool: blockpool.Config{BlockSize: 16, GPUBlocks: 256, Seed: uint64(i + 1)}}
		engines[i] = sim.NewEngine(cfg, pub)
		e.Datastore().Upsert(&datalayer.Endpoint{Name: cfg.Pod, Address: addr, Pod: cfg.Pod, Model: "m"})
	}
	// Core NATS keeps nothing for a subscriber that is not there yet.
	testkit.WaitFor(t, "the EPP to consume", func() error {
		if !e.Ready() {
			return errors.New("e.Ready() is false")
		}
		return nil
	})

	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	if _, err := engines[2].Serve(blockpool.Request{Tokens: prompt}); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, "the index to learn pod-2's blocks", func() error {
		ans, err := e.Lookup(context.Background(), prefixquery.Query{Model: "m", TokenIDs: prompt})
		if err != nil {
			return err
		}
		if seen := ans.Endpoints[2].Prefix.MatchBlocks; seen != 4 {
			return fmt.Errorf("ans.Endpoints[2].Prefix.MatchBlocks is %v, want %v", seen, 4)
		}
		return nil
	})
	body, _ := json.Marshal(map[string]any{"model": "m", "prompt": prompt, "max_tokens": 1})

	client, err := envoy.Dial(e.ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	res, err := client.Do(ctx, envoy.Request{Path: "/v1/completions", Body: body, Chunks: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate != nil {
		t.Fatalf("ext_proc refused the request: %v", res.Immediate)
	}
	primary := strings.Split(res.Destination, ",")[0]
	if primary != servers[2] || res.MetadataDestination != res.Destination {
		t.Fatalf("ext_proc picked %q (metadata %q), want pod-2 at %s", res.Destination, res.MetadataDestination, servers[2])
	}

	resp, err := http.Post("http://"+e.ProxyAddr()+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(out), `"served_by":"pod-2"`) {
		t.Fatalf("proxy answered %d %s, want pod-2's answer", resp.StatusCode, out)
	}

	// A malformed body is refused with a reason, over both paths.
	res, err = client.Do(ctx, envoy.Request{Path: "/v1/completions", Body: []byte(`{"model": 7}`)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate == nil || res.Immediate.GetStatus().GetCode() != 400 {
		t.Fatalf("malformed body over ext_proc: got %+v, want an immediate 400", res.Immediate)
	}
	resp, err = http.Post("http://"+e.ProxyAddr()+"/v1/completions", "application/json", strings.NewReader(`{"model": 7}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(out), "model") {
		t.Fatalf("malformed body over the proxy: %d %s, want 400 naming the model field", resp.StatusCode, out)
	}
}
