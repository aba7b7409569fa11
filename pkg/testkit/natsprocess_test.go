package testkit

import (
	"os"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestMain lets a NATS server run in a process of its own
// (StartNATSProcess): this binary, started again, is that process.
func TestMain(m *testing.M) {
	MainNATS()
	os.Exit(m.Run())
}

// A NATS server in a process of its own carries a message between two
// clients, in another process than the test's, and reports the CPU it
// spent doing so.
func TestANATSProcessCarriesMessagesInAProcessOfItsOwn(t *testing.T) {
	t.Parallel()
	p := StartNATSProcess(t)
	if p.Pid() == os.Getpid() {
		t.Fatalf("the server runs in the test's process %d", p.Pid())
	}
	sub, err := nats.Connect(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	s, err := sub.SubscribeSync("t")
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	pub, err := nats.Connect(p.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.Publish("t", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	msg, err := s.NextMsg(WaitLimit)
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "hello" {
		t.Fatalf("got %q, want hello", msg.Data)
	}
	st, err := p.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.CPU <= 0 {
		t.Fatalf("the server process reports %v of CPU", st.CPU)
	}
}
