package extproc_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvroute/kvroute/pkg/testkit/envoy"
	"github.com/kvroute/kvroute/pkg/testkit/fleet"
)

// The ext_proc benchmarks' rig, small: the EPP and the floor, each in a
// process of its own, answer as an endpoint picker must (the EPP with the
// engine holding the prompt, the floor with its fixed destination, both
// with the body whole), and their turns count each process's own work.
func TestTheBenchmarkRigMeasuresEachServerInItsOwnProcess(t *testing.T) {
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
