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

// Three members routed to one another carry a message from a client of one
// to a client of another, and a client that was given one member's URL
// learns the others' (so it can reconnect to them).
func TestClusterMembersRouteMessagesAndTellClientsOfEachOther(t *testing.T) {
	t.Parallel()
	first, err := Start(Options{Name: "n0", Cluster: &Cluster{Name: "kv"}})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown()
	route := "nats-route://" + first.ClusterAddr().String()
	members := []*Server{first}
	for _, name := range []string{"n1", "n2"} {
		s, err := Start(Options{Name: name, Cluster: &Cluster{Name: "kv", Routes: []string{route}}})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Shutdown()
		members = append(members, s)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, s := range members {
		for s.NumRemotes() < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("%s is routed to %d members, want 2", s.Name(), s.NumRemotes())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	sub, err := nats.Connect(members[2].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	s, err := sub.SubscribeSync("greet")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	pub, err := nats.Connect(members[0].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	// The subscription's interest reaches n0 over the route asynchronously;
	// publish until it arrives.
	var got *nats.Msg
	for got == nil {
		if time.Now().After(deadline) {
			t.Fatal("a message published on n0 never reached n2's subscriber")
		}
		if err := pub.Publish("greet", []byte("hello")); err != nil {
			t.Fatal(err)
		}
		got, _ = s.NextMsg(50 * time.Millisecond)
	}
	for len(pub.DiscoveredServers()) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the client of n0 learned %v, want the other two members", pub.DiscoveredServers())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAClusterRouteThatIsNoURLIsRefused(t *testing.T) {
	t.Parallel()
	if _, err := Start(Options{Cluster: &Cluster{Name: "kv", Routes: []string{"::not a url"}}}); err == nil {
		t.Fatal("a route that is no URL was accepted")
	}
}
