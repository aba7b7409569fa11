package events

import (
	"bytes"
	"errors"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/kvroute/kvroute/pkg/testkit"
)

func TestPublisherSendsThePayloadUnchangedWithHeaders(t *testing.T) {
	t.Parallel()
	env := testkit.StartNATS(t, testkit.NATSOptions{InProcess: true})
	subConn := env.Connect(t, "sub")
	sub, err := subConn.SubscribeSync(PoolSubject("prod", "pool"))
	if err != nil {
		t.Fatal(err)
	}
	if err := subConn.Flush(); err != nil {
		t.Fatal(err)
	}
	pub := NewPublisher(env.Connect(t, "pub"), "prod", "pool")
	tests := []struct {
		name        string
		o           Origin
		wantSubject string
	}{
		{"the pod names the subject", Origin{Stream: Stream{Endpoint: "10.0.0.1:8000", DPRank: 1}, Pod: "vllm.0", Instance: "x", Seq: 9, BlockSize: 16}, "kv.events.prod.pool.vllm_0"},
		{"without a pod the endpoint names it", Origin{Stream: Stream{Endpoint: "10.0.0.2:8000"}, Seq: 1}, "kv.events.prod.pool.10_0_0_2_8000"},
	}
	for _, tt := range tests {
		// Sequential: the subtests share one subscription.
		t.Run(tt.name, func(t *testing.T) {
			payload := []byte{0x93, 0xcb, 1, 2, 3, 0xff, 0}
			if err := pub.Publish(tt.o, payload); err != nil {
				t.Fatal(err)
			}
			m, err := sub.NextMsg(testkit.WaitLimit)
			if err != nil {
				t.Fatal(err)
			}
			if m.Subject != tt.wantSubject {
				t.Errorf("subject %q, want %q", m.Subject, tt.wantSubject)
			}
			if !bytes.Equal(m.Data, payload) {
				t.Errorf("payload % x, want % x", m.Data, payload)
			}
			got, err := ParseOrigin(m.Header)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.o {
				t.Errorf("origin %+v, want %+v", got, tt.o)
			}
		})
	}
}

func TestPublisherRefusesWhatConsumersWouldReject(t *testing.T) {
	t.Parallel()
	env := testkit.StartNATS(t, testkit.NATSOptions{InProcess: true})
	nc := env.Connect(t, "pub")
	tests := []struct {
		name string
		pub  *Publisher
		o    Origin
		want error
	}{
		{"an endpoint without a port", NewPublisher(nc, "n", "p"), Origin{Stream: Stream{Endpoint: "10.0.0.1"}}, ErrBadHeader},
		{"a negative rank", NewPublisher(nc, "n", "p"), Origin{Stream: Stream{Endpoint: "10.0.0.1:1", DPRank: -1}}, ErrBadHeader},
		{"a negative block size", NewPublisher(nc, "n", "p"), Origin{Stream: Stream{Endpoint: "10.0.0.1:1"}, BlockSize: -1}, ErrBadHeader},
		{"no connection", NewPublisher(nil, "n", "p"), Origin{Stream: Stream{Endpoint: "10.0.0.1:1"}}, ErrNoConn},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.pub.Publish(tt.o, []byte{0x90}); !errors.Is(err, tt.want) {
				t.Errorf("Publish = %v, want %v", err, tt.want)
			}
		})
	}
}

func TestPublisherReportsAClosedConnection(t *testing.T) {
	t.Parallel()
	env := testkit.StartNATS(t, testkit.NATSOptions{InProcess: true})
	nc := env.Connect(t, "pub")
	nc.Close()
	err := NewPublisher(nc, "n", "p").Publish(Origin{Stream: Stream{Endpoint: "10.0.0.1:1"}}, nil)
	if !errors.Is(err, nats.ErrConnectionClosed) {
		t.Errorf("Publish on a closed connection = %v, want ErrConnectionClosed", err)
	}
}
