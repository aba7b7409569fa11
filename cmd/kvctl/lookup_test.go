package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/pkg/datalayer"
	"github.com/kvroute/kvroute/pkg/epp"
	"github.com/kvroute/kvroute/pkg/events"
)

func TestLookupShowsWhoHoldsAPrompt(t *testing.T) {
	e, err := epp.New(epp.Options{Pool: "p", EmbeddedNATSAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DebugAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()

	e.Datastore().Upsert(&datalayer.Endpoint{Name: "holder", Address: "10.0.0.1:8000", Model: "m"})
	e.Datastore().Upsert(&datalayer.Endpoint{Name: "other", Address: "10.0.0.2:8000", Model: "m"})
	// The holder stores the prompt's two blocks on GPU (applied to the
	// index directly: the event path has tests of its own).
	e.Index().Apply(events.Origin{Stream: events.Stream{Endpoint: "10.0.0.1:8000"}, Model: "m", BlockSize: 2, Instance: "a"},
		&events.Batch{Events: []events.Event{{Kind: events.KindBlockStored, BlockHashes: []uint64{11, 12}, TokenIDs: []uint32{5, 6, 7, 8}, BlockSize: 2}}})

	addr := "http://" + e.DebugAddr()
	var out, errOut bytes.Buffer
	if err := lookupCmd([]string{"--addr", addr, "--model", "m", "--tokens", "5,6,7,8,9"}, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("lookup: %v (%s)", err, errOut.String())
	}
	text := out.String()
	if !strings.Contains(text, "holder") || !strings.Contains(text, "2/2") {
		t.Fatalf("the holder's 2 of 2 blocks are not shown:\n%s", text)
	}
	lines := strings.Split(text, "\n")
	for _, l := range lines {
		if strings.HasPrefix(l, "other ") && !strings.Contains(l, "0/") {
			t.Errorf("the endpoint that holds nothing shows a match: %q", l)
		}
	}

	// A late join reads partial, its match marked a lower bound.
	e.Index().Uncertain(events.Stream{Endpoint: "10.0.0.1:8000"}, events.ReasonLateJoin)
	out.Reset()
	if err := lookupCmd([]string{"--addr", addr, "--model", "m", "--tokens", "5,6,7,8,9"}, strings.NewReader(""), &out, &errOut); err != nil {
		t.Fatalf("lookup: %v (%s)", err, errOut.String())
	}
	if !strings.Contains(out.String(), "partial") || !strings.Contains(out.String(), "2/2") || !strings.Contains(out.String(), " >=") {
		t.Fatalf("the partial stream is not shown as such:\n%s", out.String())
	}

	// JSON from stdin, and the EPP's JSON back.
	out.Reset()
	stdinTokens := strings.NewReader("[5, 6, 7, 8]")
	if err := lookupCmd([]string{"--addr", addr, "--tokens", "-", "--json"}, stdinTokens, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), `"matchBlocks": 2`) || !strings.Contains(out.String(), `"state": "partial"`) {
		t.Fatalf("JSON answer lacks the holder's match:\n%s", out.String())
	}

	// Bad input is refused with a reason, before anything is sent.
	for _, args := range [][]string{
		{"--addr", addr},
		{"--addr", addr, "--tokens", "1,x"},
	} {
		err := lookupCmd(args, strings.NewReader(""), &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), "tokens") {
			t.Errorf("lookup %v: err = %v, want one about --tokens", args, err)
		}
	}
}
