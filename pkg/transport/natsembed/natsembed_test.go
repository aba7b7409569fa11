package natsembed

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestEmbeddedServerServesTCPAndInProcessClients(t *testing.T) {
	t.Parallel()
	s, err := Start(Options{JetStream: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()

	tcp, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatalf("connect over TCP: %v", err)
	}
	defer tcp.Close()
	inproc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		t.Fatalf("connect in-process: %v", err)
	}
	defer inproc.Close()

	sub, err := inproc.SubscribeSync("greet")
	if err != nil {
		t.Fatal(err)
	}
	if err := inproc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := tcp.Publish("greet", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		t.Fatalf("message from the TCP client never reached the in-process one: %v", err)
	}
	if string(msg.Data) != "hello" {
		t.Fatalf("got %q, want hello", msg.Data)
	}
	if !s.JetStreamEnabled() {
		t.Fatal("JetStream was asked for but is not enabled")
	}
}

func TestInProcessOnlyServerHasNoListener(t *testing.T) {
	t.Parallel()
	s, err := Start(Options{Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown()
	if _, err := nats.Connect(s.ClientURL(), nats.Timeout(500*time.Millisecond)); err == nil {
		t.Fatal("TCP connect succeeded on a server started without a listener")
	}
	nc, err := nats.Connect("", nats.InProcessServer(s))
	if err != nil {
		t.Fatalf("in-process connect: %v", err)
	}
	nc.Close()
}
