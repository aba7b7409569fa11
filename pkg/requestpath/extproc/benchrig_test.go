package extproc_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// The ext_proc benchmarks' rig, small: the EPP and the floor, each in a
// process of its own, answer as an endpoint picker must (the EPP with the
// engine holding the prompt, the floor with its fixed destination, both
// with the body whole), and their turns count each process's own work.
func TestTheBenchmarkRigMeasuresEachServerInItsOwnProcess(t *testing.T) {
	t.Parallel()
	r := startSizedRig(t, 2, 256, fleet.EPPProcessOptions{})
	bodies := fleet.PrefixBodies(r.prefixes, 128)
	for _, srv := range []struct {
		server
		want func(i int) string
	}{
		{r.epp(0), func(i int) string { return r.f.Servers[i].Addr }},
		{r.floor, func(int) string { return r.f.Servers[0].Addr }},
	} {
		for i, body := range bodies {
			res, err := srv.c.Do(context.Background(), envoy.Request{Path: "/v1/completions", Body: body, Chunks: 3}, nil)
			if err != nil {
				t.Fatalf("%s: %v", srv.name, err)
			}
			if res.Destination != srv.want(i) || res.MetadataDestination != srv.want(i) {
				t.Errorf("%s sent prompt %d to %q (metadata %q), want %s", srv.name, i, res.Destination, res.MetadataDestination, srv.want(i))
			}
			if !bytes.Equal(res.Body, body) {
				t.Errorf("%s passed back %d bytes, want the %d sent unchanged", srv.name, len(res.Body), len(body))
			}
		}
	}

	const n, rounds = 20, 2
	sides := turns(t, []server{r.epp(0), r.floor}, envoy.Load{Path: "/v1/completions", Bodies: bodies, N: n, Workers: 1}, rounds)
	for i, name := range []string{"kvroute", "floor"} {
		s := sides[i]
		if s.n != n*rounds || len(s.lat) != n*rounds {
			t.Errorf("%s: %d requests, %d latencies; want %d each", name, s.n, len(s.lat), n*rounds)
		}
		if s.server.CPU <= 0 || s.server.Allocs < n*rounds || s.client.CPU <= 0 {
			t.Errorf("%s: its process counted %v of CPU and %d allocations, the client %v, for %d requests",
				name, s.server.CPU, s.server.Allocs, s.client.CPU, s.n)
		}
	}
}

// The benchmarks' EPP with a tokenizer loaded (here a tiny one, a copy of
// hftokenizer's test tokenizer, with a chat template) tokenizes a chat
// prompt in its own process as its request path does: the ids it gives
// back, once an engine holds them, route that chat prompt there.
func TestTheBenchmarkEPPTokenizesChatPromptsInItsProcess(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "tokenizer-tiny")
	f := fleet.Start(t, fleet.Options{Endpoints: 4, BlockSize: 16, NoTokenizer: true,
		EPPProcesses: []fleet.EPPProcessOptions{{Tokenizer: dir}}})
	body, err := json.Marshal(map[string]any{"model": "m", "max_tokens": 1, "messages": []map[string]string{
		{"role": "system", "content": prose(1, 200)},
		{"role": "user", "content": "Which pod?"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := f.Processes[0].EncodeChat(body)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) < 150 {
		t.Fatalf("the chat prompt of about 200 tokens came back as %d ids", len(ids))
	}
	held := ids[:len(ids)/16*16]
	s := f.Servers[2]
	if err := s.Serve(held); err != nil {
		t.Fatal(err)
	}
	f.WaitHeld(t, s.Addr, held)
	c, err := envoy.Dial(f.Processes[0].ExtProcAddr(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	res, err := c.Do(context.Background(), envoy.Request{Path: "/v1/chat/completions", Body: body, Chunks: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Destination != s.Addr {
		t.Errorf("the chat prompt went to %q, want %s, which holds its tokens", res.Destination, s.Addr)
	}
}
