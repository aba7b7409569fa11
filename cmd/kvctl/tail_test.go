package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvroute/kvroute/pkg/events"
	"github.com/kvroute/kvroute/pkg/testkit"
)

// lockedBuffer is a bytes.Buffer written by tail's goroutines and read by
// the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startTailServer(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		JetStream: true, StoreDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

func batch(t *testing.T, seq uint64) []byte {
	t.Helper()
	b := &events.Batch{TS: 1.5, Events: []events.Event{
		{Kind: events.KindBlockStored, BlockHashes: []uint64{seq<<8 | 1, seq<<8 | 2}, TokenIDs: make([]uint32, 8), BlockSize: 4},
		{Kind: events.KindBlockRemoved, BlockHashes: []uint64{7}, Medium: events.TierCPU},
	}}
	data, err := events.AppendBatch(nil, b, events.EncodingMap)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestTailPrintsEventsGapsAndRestarts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		jetStream bool
		json      bool
	}{
		{"text over core NATS", false, false},
		{"JSON lines over core NATS", false, true},
		{"text over JetStream", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := startTailServer(t)
			nc, err := nats.Connect(srv.ClientURL())
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			args := []string{"--nats", srv.ClientURL(), "--namespace", "prod", "--pool", "llama"}
			if tc.jetStream {
				js, err := jetstream.New(nc)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := events.EnsureStream(context.Background(), js, events.StreamConfig{Namespace: "prod", Pool: "llama"}); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--jetstream")
			}
			if tc.json {
				args = append(args, "--json")
			}

			var stdout, stderr lockedBuffer
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tailCmd(ctx, args, &stdout, &stderr) }()
			testkit.WaitFor(t, "tail to listen", func() error {
				if !(strings.Contains(stderr.String(), "listening on kv.events.prod.llama.>")) {
					return errors.New("strings.Contains(stderr.String(), \"listening on kv.events.prod.llama.>\") is false")
				}
				return nil
			})

			pub := events.NewPublisher(nc, "prod", "llama")
			o := events.Origin{Stream: events.Stream{Endpoint: "10.0.0.1:8000"}, Pod: "vllm-0", Model: "llama", Instance: "a", BlockSize: 4}
			for _, step := range []struct {
				inst string
				seq  uint64
			}{{"a", 0}, {"a", 1}, {"a", 3}, {"b", 0}} {
				o.Instance, o.Seq = step.inst, step.seq
				if err := pub.Publish(o, batch(t, step.seq)); err != nil {
					t.Fatal(err)
				}
			}
			// 4 batches of 2 events, one gap, one restart.
			testkit.WaitFor(t, "every line", func() error {
				if seen := strings.Count(stdout.String(), "\n"); seen < 10 {
					return fmt.Errorf("strings.Count(stdout.String(), \"\\n\") is %v, want >= %v", seen, 10)
				}
				return nil
			})
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("tail returned %v after cancel", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatal("tail did not return after cancel")
			}

			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			if len(lines) != 10 {
				t.Fatalf("got %d lines, want 10:\n%s", len(lines), stdout.String())
			}
			var kinds []string
			for _, l := range lines {
				if tc.json {
					var j struct {
						Type     string
						Endpoint string
						Seq      *uint64
						Reason   string
						Event    *struct{ Kind string }
					}
					if err := json.Unmarshal([]byte(l), &j); err != nil {
						t.Fatalf("line %q is not JSON: %v", l, err)
					}
					if j.Endpoint != "10.0.0.1:8000" {
						t.Errorf("line %q names endpoint %q", l, j.Endpoint)
					}
					k := j.Type
					switch {
					case j.Event != nil:
						k = fmt.Sprintf("%d:%s", *j.Seq, j.Event.Kind)
					case j.Reason != "":
						k += ":" + j.Reason
					}
					kinds = append(kinds, k)
					continue
				}
				f := strings.Fields(l)
				switch {
				case strings.Contains(l, "UNCERTAIN"):
					kinds = append(kinds, "uncertain:"+strings.TrimPrefix(f[len(f)-1], "reason="))
				case strings.Contains(l, "RESTART"):
					kinds = append(kinds, "restart")
				default:
					kinds = append(kinds, strings.TrimPrefix(f[2], "seq=")+":"+f[6])
				}
			}
			want := []string{
				"0:BlockStored", "0:BlockRemoved", "1:BlockStored", "1:BlockRemoved",
				"uncertain:gap", "3:BlockStored", "3:BlockRemoved",
				"restart", "0:BlockStored", "0:BlockRemoved",
			}
			if strings.Join(kinds, " ") != strings.Join(want, " ") {
				t.Errorf("tail printed %q, want %q\n%s", kinds, want, stdout.String())
			}
		})
	}
}

func TestTailRefusesMissingFlags(t *testing.T) {
	t.Parallel()
	var stdout, stderr lockedBuffer
	err := tailCmd(context.Background(), []string{"--pool", "p"}, &stdout, &stderr)
	if !errors.Is(err, errUsage) {
		t.Errorf("tail without --namespace = %v, want a usage error", err)
	}
}

func TestTailReportsAnUnreachableServer(t *testing.T) {
	t.Parallel()
	var stdout, stderr lockedBuffer
	err := tailCmd(context.Background(), []string{"--nats", "nats://127.0.0.1:1", "--namespace", "n", "--pool", "p"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "connect to") {
		t.Errorf("tail against a closed port = %v, want a connect error", err)
	}
}
